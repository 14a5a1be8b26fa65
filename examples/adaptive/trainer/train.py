"""A CPU-bound "data loader + trainer": LOADERS processes each prepare batches (pure
CPU work), the trainer takes one batch per step. The step rate grows with the CPUs the
loaders get, up to the task's CPU quota. Prints `steps/s RATE` every 2 seconds."""
import multiprocessing as mp
import os
import time

LOADERS = int(os.environ.get("LOADERS", "4"))
WORK = int(os.environ.get("BATCH_WORK", "200000"))


def loader(queue):
    while True:
        total = 0
        for i in range(WORK):  # decode, augment, collate: CPU work per batch
            total += i * i
        queue.put(total)


def main():
    queue = mp.Queue(maxsize=64)
    for _ in range(LOADERS):
        mp.Process(target=loader, args=(queue,), daemon=True).start()
    steps, since = 0, time.time()
    while True:
        queue.get()
        steps += 1
        now = time.time()
        if now - since >= 2.0:
            print(f"steps/s {steps / (now - since):.1f} at {now:.0f}", flush=True)
            steps, since = 0, now


if __name__ == "__main__":
    main()
