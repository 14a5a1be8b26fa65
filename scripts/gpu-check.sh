#!/usr/bin/env bash
# The GPU path on a real NVIDIA GPU: NVML discovery, GPU sampling while a task computes,
# the idle-GPU policy acting on a task that holds a GPU and leaves it idle, and
# `gpu_release` leaving no process on the GPU after each task ends.
#
#   scripts/gpu-check.sh            # on a machine with an NVIDIA GPU and its driver
#   scripts/gpu-check.sh --dry-run  # anywhere: checks the script and says what it would do
#
# It builds taccd and tcloud (release) unless TACC_BIN_DIR names a folder holding both
# (a GPU machine without a Rust toolchain gets them carried there), starts the embedded
# cluster with real GPU discovery (no --gpus: NVML says what there is) and an idle-GPU
# policy of 20 s idle + 10 s grace → cancel, in a temporary TACC_HOME, and prints:
#   1. the GPUs the node registered (tcloud nodes --json);
#   2. a task on one GPU that computes (a CUDA matrix multiply through PyTorch or CuPy when
#      one is installed, else `nvidia-smi` in a loop) and the utilisation `tcloud top`
#      sampled while it ran (> 0 expected with PyTorch or CuPy); it must not be touched by
#      the idle policy;
#   3. whether any process still holds the GPU once that task was cancelled;
#   4. a task that allocates GPU memory and then sleeps: the idle policy warns it and then
#      cancels it, and no process is left on the GPU;
#   5. two tasks of one user asking `gpus: 0.5` run on the one GPU at the same time, see
#      the same CUDA_VISIBLE_DEVICES, and leave nothing on it.
# JSON is read with python3 (jq is not on every GPU image).
# Exit status: 0 when every check held, 1 when one failed, 2 when no GPU is here.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
[[ ${1:-} == --dry-run ]] && DRY_RUN=1

say() { printf '\n== %s\n' "$*"; }

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# `json EXPR`: evaluates the Python expression EXPR over the JSON document on stdin (`d`).
json() {
  python3 -c 'import json, sys
d = json.load(sys.stdin)
print(eval(sys.argv[1]))' "$1"
}

# The python3 that has PyTorch or CuPy, by absolute path: a task's PATH is not ours.
PY=$(command -v python3 || true)

compute_line() {
  if [[ -n $PY ]] && "$PY" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "$PY -c \"import torch,time; a=torch.randn(8192,8192,device='cuda'); t=time.time()
while time.time()-t<90: (a@a).sum().item()
print('torch matmul done')\""
  elif [[ -n $PY ]] && "$PY" -c 'import cupy' >/dev/null 2>&1; then
    echo "$PY -c \"import cupy,time; a=cupy.random.rand(8192,8192,dtype=cupy.float32); t=time.time()
while time.time()-t<90: float((a@a).sum())
print('cupy matmul done')\""
  else
    echo 'for i in $(seq 1 90); do nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader; sleep 1; done'
  fi
}

# A task that takes GPU memory and then does nothing: what the idle policy is for.
idle_line() {
  if [[ -n $PY ]] && "$PY" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "$PY -c \"import torch,time; a=torch.zeros(4096,4096,device='cuda'); torch.cuda.synchronize(); print('holding a GPU, idle', flush=True); time.sleep(600)\""
  elif [[ -n $PY ]] && "$PY" -c 'import cupy' >/dev/null 2>&1; then
    echo "$PY -c \"import cupy,time; a=cupy.zeros((4096,4096)); print('holding a GPU, idle', flush=True); time.sleep(600)\""
  else
    echo 'echo "holding a GPU, idle"; sleep 600'
  fi
}

if [[ $DRY_RUN == 1 ]]; then
  say "dry run: checking the script's own steps"
  bash -n "$0"
  for tool in python3 nvidia-smi; do
    command -v "$tool" >/dev/null 2>&1 && echo "found $tool" || echo "missing $tool (needed for a real run)"
  done
  if [[ -n ${TACC_BIN_DIR:-} ]]; then
    echo "binaries from TACC_BIN_DIR=$TACC_BIN_DIR"
  else
    command -v cargo >/dev/null 2>&1 && echo "found cargo (builds taccd and tcloud)" || echo "missing cargo and no TACC_BIN_DIR"
  fi
  echo '{"a": [1, 2]}' | json 'sum(d["a"])' | grep -qx 3 && echo "the JSON reader works"
  if have_gpu; then echo "an NVIDIA GPU is here: run without --dry-run"; else echo "no NVIDIA GPU here"; fi
  echo "the computing task would run: $(compute_line | head -1) …"
  echo "the idle task would run: $(idle_line | head -1)"
  echo "steps: binaries → tcloud up (real NVML discovery, idle policy 20s+10s→cancel) → nodes → GPU task → top samples → cancel → holders → idle task → warned → cancelled → holders → two shares together → holders"
  exit 0
fi

if ! have_gpu; then
  echo "no NVIDIA GPU here (nvidia-smi finds none): nothing to check; see --dry-run" >&2
  exit 2
fi

if [[ -n ${TACC_BIN_DIR:-} ]]; then
  BIN=$(cd "$TACC_BIN_DIR" && pwd)
  say "binaries from $BIN"
else
  say "building taccd and tcloud (release)"
  cargo build --release -p taccd -p tcloud --bins
  BIN=$PWD/target/release
fi
for b in taccd tcloud; do [[ -x $BIN/$b ]] || { echo "no $BIN/$b" >&2; exit 1; }; done
export PATH="$BIN:$PATH"
export TACC_HOME
TACC_HOME=$(mktemp -d)
chmod 755 "$TACC_HOME"
# The idle-GPU policy is an operator's taccd flag; `tcloud up` starts taccd through this.
cat >"$TACC_HOME/taccd-with-idle-policy" <<EOF
#!/bin/sh
exec "$BIN/taccd" "\$@" --idle-gpu-for 20s --idle-gpu-below 5 --idle-gpu-grace 10s --idle-gpu-then cancel
EOF
chmod +x "$TACC_HOME/taccd-with-idle-policy"
export TACC_TACCD=$TACC_HOME/taccd-with-idle-policy
failed=0
fail() { echo "FAIL: $*"; failed=1; }
cleanup() {
  if [[ $failed != 0 ]]; then
    for log in taccd.log agent.log; do
      echo "--- end of $log"
      find "$TACC_HOME" -name "$log" -exec tail -40 {} \; 2>/dev/null || true
    done
  fi
  tcloud down --force >/dev/null 2>&1 || tcloud down >/dev/null 2>&1 || true
  rm -rf "$TACC_HOME"
}
trap cleanup EXIT

holders() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . || true; }
# The node gives a GPU back once its agent has confirmed the attempt on it ended (and
# `gpu_release` found its processes gone): wait for that, then look for holders.
wait_released() {
  for _ in $(seq 1 30); do
    [[ $(tcloud nodes --json | json 'sum(n["allocated"]["gpus"] for n in d)') == 0 ]] && { echo "the node gave its GPUs back"; return; }
    sleep 1
  done
  fail "the node still holds GPUs 30s after the task ended"
}
wait_ended() {
  local id=$1 state=
  for _ in $(seq 1 60); do
    state=$(tcloud show "$id" --json | json 'd["state"]')
    case $state in cancelled | succeeded | failed | lost) break ;; esac
    sleep 1
  done
  echo "$state"
}
task_dir() {
  local dir name=$1 line=$2
  dir=$(mktemp -d -p "$TACC_HOME")
  chmod 755 "$dir"
  {
    echo "name: $name"
    echo "resources: {gpus: 1, cpus: 1, memory: 8GiB}"
    echo "run: |"
    printf '%s\n' "$line" | sed 's/^/  /'
  } >"$dir/task.yaml"
  echo "$dir"
}

say "nvidia-smi"
nvidia-smi -L
nvidia-smi --query-gpu=index,name,driver_version,memory.total,utilization.gpu --format=csv
say "starting the embedded cluster with real discovery and the idle-GPU policy"
tcloud up
say "1. GPUs the node registered"
for _ in $(seq 1 30); do
  nodes=$(tcloud nodes --json)
  [[ $(json 'len(d)' <<<"$nodes") -gt 0 ]] && break
  sleep 1
done
json '"\n".join("%s: %s GPU(s), type %s, devices %s" % (n["name"], n["capacity"]["gpus"], n.get("gpu_type"), [(g["index"], g["model"], g["uuid"], g["memory_total_bytes"] >> 20, g["health"]) for g in n.get("gpus", [])]) for n in d)' <<<"$nodes"
gpus=$(json 'sum(n["capacity"]["gpus"] for n in d)' <<<"$nodes")
smi_gpus=$(nvidia-smi -L | grep -c '^GPU')
echo "discovered: $gpus; nvidia-smi lists: $smi_gpus"
[[ ${gpus%.*} -ge 1 ]] || fail "no GPU discovered"
[[ ${gpus%.*} -eq $smi_gpus ]] || fail "discovery found $gpus GPUs, nvidia-smi $smi_gpus"

say "2. a task that computes on one GPU"
id=$(tcloud submit "$(task_dir gpu-check "$(compute_line)")" --json | json 'd["task_id"]')
echo "task $id: $(compute_line | head -1) …"
max_util=0
for _ in $(seq 1 30); do
  sleep 1
  sample=$(tcloud top "$id" --once --json 2>/dev/null || echo '[]')
  util=$(json 'max([g["utilization_percent"] for t in d for r in t["ranks"] for g in r["gpus"]], default=0)' <<<"$sample")
  state=$(tcloud show "$id" --json | json 'd["state"]')
  [[ $util -gt $max_util ]] && max_util=$util
  echo "state $state, sampled GPU utilisation: ${util}%"
  case $state in cancelled | succeeded | failed | lost) break ;; esac
done
echo "highest sampled utilisation: ${max_util}%"
if [[ $max_util -le 0 ]]; then
  if compute_line | grep -q -e torch -e cupy; then
    fail "a GPU computation sampled as idle"
  else
    echo "NOTE: 0% sampled (no PyTorch or CuPy here: the task ran nvidia-smi only)"
  fi
fi
state=$(tcloud show "$id" --json | json 'd["state"]')
[[ $state == running ]] || fail "the computing task is $state, not running (the idle policy must leave it alone)"

say "3. cancel, then look for any process left on the GPU"
tcloud cancel "$id" >/dev/null
echo "task state: $(wait_ended "$id")"
tcloud logs "$id" | tail -5 || true
wait_released
n=$(holders)
echo "processes on the GPUs now: $n"
if [[ $n -gt 0 ]]; then
  nvidia-smi --query-compute-apps=pid,process_name --format=csv
  fail "a process still holds a GPU after the cancel"
fi

say "4. the idle-GPU policy: a task that holds a GPU and computes nothing"
idle=$(tcloud submit "$(task_dir gpu-idle "$(idle_line)")" --json | json 'd["task_id"]')
echo "task $idle: $(idle_line)"
warned=0
state=
for _ in $(seq 1 90); do
  sleep 1
  state=$(tcloud show "$idle" --json | json 'd["state"]')
  if [[ $warned == 0 ]] && tcloud logs "$idle" 2>/dev/null | grep -q '^tacc: '; then
    warned=1
    echo "warned: $(tcloud logs "$idle" | grep '^tacc: ' | head -1)"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/holding the GPU: /'
  fi
  case $state in cancelled | succeeded | failed | lost) break ;; esac
done
echo "task state: $state"
tcloud logs "$idle" | tail -4 || true
tcloud show "$idle" | tail -6 || true
[[ $warned == 1 ]] || fail "the idle task was never warned in its log"
if [[ $state != cancelled ]]; then
  fail "the idle task is $state, not cancelled by the idle policy"
  tcloud cancel "$idle" >/dev/null
  wait_ended "$idle" >/dev/null
fi
wait_released
n=$(holders)
echo "processes on the GPUs now: $n"
[[ $n -eq 0 ]] || fail "a process still holds a GPU after the idle policy's cancel"

say "5. two shares of one GPU (gpus: 0.5) of one user run together on it"
share_line() {
  if [[ -n $PY ]] && "$PY" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "echo \"gpus=\$CUDA_VISIBLE_DEVICES\"; $PY -c \"import torch,time; a=torch.randn(4096,4096,device='cuda'); t=time.time()
while time.time()-t<25: (a@a).sum().item()
print('share done')\""
  else
    echo 'echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 25; echo "share done"'
  fi
}
share_dir() {
  local dir
  dir=$(mktemp -d -p "$TACC_HOME")
  chmod 755 "$dir"
  {
    echo "name: $1"
    echo "resources: {gpus: 0.5, cpus: 1, memory: 8GiB}"
    echo "run: |"
    share_line | sed 's/^/  /'
  } >"$dir/task.yaml"
  echo "$dir"
}
a=$(tcloud submit "$(share_dir share-a)" --json | json 'd["task_id"]')
b=$(tcloud submit "$(share_dir share-b)" --json | json 'd["task_id"]')
together=0
for _ in $(seq 1 30); do
  sa=$(tcloud show "$a" --json | json 'd["state"]')
  sb=$(tcloud show "$b" --json | json 'd["state"]')
  if [[ $sa == running && $sb == running ]]; then together=1; break; fi
  sleep 1
done
echo "tasks $a and $b running together: $together"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/on the GPU: /'
[[ $together == 1 ]] || fail "two shares of one user did not run together"
for t in "$a" "$b"; do
  echo "task $t: $(wait_ended "$t"), $(tcloud logs "$t" | grep -m1 '^gpus=')"
  [[ $(tcloud show "$t" --json | json 'd["state"]') == succeeded ]] || fail "share task $t did not succeed"
done
[[ $(tcloud logs "$a" | grep -m1 '^gpus=') == "$(tcloud logs "$b" | grep -m1 '^gpus=')" ]] ||
  fail "the two shares saw different GPUs"
wait_released
n=$(holders)
echo "processes on the GPUs now: $n"
[[ $n -eq 0 ]] || fail "a process still holds a GPU after the shares ended"

[[ $failed == 0 ]] && say "every check held" || say "a check failed"
exit "$failed"
