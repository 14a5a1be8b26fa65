"""Logistic regression trained with mini-batch gradient descent on generated data.

Standard library only, so it runs anywhere Python 3 does. Prints the loss per epoch and
writes results/metrics.json and results/model.json.
"""

import json
import math
import os
import random

EPOCHS = int(os.environ.get("EPOCHS", "20"))
SEED = int(os.environ.get("SEED", "7"))
FEATURES = 8
SAMPLES = 4000
BATCH = 64
LEARNING_RATE = 0.5


def sigmoid(z):
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def make_data(rng):
    true_w = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    true_b = rng.uniform(-0.5, 0.5)
    data = []
    for _ in range(SAMPLES):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        p = sigmoid(sum(w * v for w, v in zip(true_w, x)) + true_b)
        data.append((x, 1.0 if rng.random() < p else 0.0))
    return data


def evaluate(w, b, data):
    loss, correct = 0.0, 0
    for x, y in data:
        p = min(max(sigmoid(sum(wi * xi for wi, xi in zip(w, x)) + b), 1e-12), 1 - 1e-12)
        loss -= y * math.log(p) + (1 - y) * math.log(1 - p)
        correct += (p >= 0.5) == (y == 1.0)
    return loss / len(data), correct / len(data)


def main():
    rng = random.Random(SEED)
    data = make_data(rng)
    split = int(0.8 * len(data))
    train, test = data[:split], data[split:]
    w, b = [0.0] * FEATURES, 0.0
    print(f"task {os.environ.get('TACC_TASK_ID', '?')} attempt {os.environ.get('TACC_ATTEMPT', '?')}: "
          f"{len(train)} training samples, {FEATURES} features, {EPOCHS} epochs")
    for epoch in range(1, EPOCHS + 1):
        rng.shuffle(train)
        for start in range(0, len(train), BATCH):
            batch = train[start:start + BATCH]
            grad_w, grad_b = [0.0] * FEATURES, 0.0
            for x, y in batch:
                err = sigmoid(sum(wi * xi for wi, xi in zip(w, x)) + b) - y
                for i in range(FEATURES):
                    grad_w[i] += err * x[i]
                grad_b += err
            w = [wi - LEARNING_RATE * g / len(batch) for wi, g in zip(w, grad_w)]
            b -= LEARNING_RATE * grad_b / len(batch)
        loss, accuracy = evaluate(w, b, train)
        print(f"epoch {epoch:3d}  loss {loss:.4f}  train accuracy {accuracy:.3f}")
    test_loss, test_accuracy = evaluate(w, b, test)
    print(f"test loss {test_loss:.4f}  test accuracy {test_accuracy:.3f}")
    os.makedirs("results", exist_ok=True)
    with open("results/metrics.json", "w") as f:
        json.dump({"epochs": EPOCHS, "test_loss": round(test_loss, 6), "test_accuracy": round(test_accuracy, 6)}, f, indent=2)
    with open("results/model.json", "w") as f:
        json.dump({"weights": w, "bias": b}, f)
    print("wrote results/metrics.json and results/model.json")


if __name__ == "__main__":
    main()
