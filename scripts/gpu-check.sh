#!/usr/bin/env bash
# The GPU path on a real NVIDIA GPU: NVML discovery, GPU sampling while a task computes,
# and `gpu_release` leaving no process on the GPU after the task ends.
#
#   scripts/gpu-check.sh            # on a machine with an NVIDIA GPU and its driver
#   scripts/gpu-check.sh --dry-run  # anywhere: checks the script and says what it would do
#
# It builds taccd and tcloud (release), starts the embedded cluster with real GPU discovery
# in a temporary TACC_HOME (no --gpus: NVML says what there is), and prints:
#   1. the GPUs the node registered (tcloud nodes --json);
#   2. a task on one GPU that computes (a CUDA matrix multiply through PyTorch or CuPy when
#      one is installed, else `nvidia-smi` in a loop) and the utilisation `tcloud top`
#      sampled while it ran (> 0 expected with PyTorch or CuPy);
#   3. whether any process still holds the GPU once the task was cancelled.
# Exit status: 0 when every check held, 1 when one failed, 2 when no GPU is here.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
[[ ${1:-} == --dry-run ]] && DRY_RUN=1

say() { printf '== %s\n' "$*"; }

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

compute_line() {
  if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo 'python3 -c "import torch,time; a=torch.randn(8192,8192,device=\"cuda\"); t=time.time()
while time.time()-t<40: (a@a).sum().item()
print(\"torch matmul done\")"'
  elif python3 -c 'import cupy' >/dev/null 2>&1; then
    echo 'python3 -c "import cupy,time; a=cupy.random.rand(8192,8192,dtype=cupy.float32); t=time.time()
while time.time()-t<40: float((a@a).sum())
print(\"cupy matmul done\")"'
  else
    echo 'for i in $(seq 1 40); do nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader; sleep 1; done'
  fi
}

if [[ $DRY_RUN == 1 ]]; then
  say "dry run: checking the script's own steps"
  bash -n "$0"
  for tool in cargo jq python3; do
    command -v "$tool" >/dev/null 2>&1 && echo "found $tool" || echo "missing $tool (needed for a real run)"
  done
  if have_gpu; then echo "an NVIDIA GPU is here: run without --dry-run"; else echo "no NVIDIA GPU here"; fi
  echo "the task would run: $(compute_line | head -1) …"
  echo "steps: build (release) → tcloud up (real NVML discovery) → nodes → GPU task → top samples → cancel → holders"
  exit 0
fi

if ! have_gpu; then
  echo "no NVIDIA GPU here (nvidia-smi finds none): nothing to check; see --dry-run" >&2
  exit 2
fi

say "building taccd and tcloud (release)"
cargo build --release -p taccd -p tcloud --bins
export PATH="$PWD/target/release:$PATH"
export TACC_HOME
TACC_HOME=$(mktemp -d)
cleanup() { tcloud down --force >/dev/null 2>&1 || tcloud down >/dev/null 2>&1 || true; rm -rf "$TACC_HOME"; }
trap cleanup EXIT

say "nvidia-smi"
nvidia-smi -L
say "starting the embedded cluster with real discovery"
tcloud up
say "1. GPUs the node registered"
tcloud nodes --json | jq '[.[] | {name, gpu_type, gpus: .capacity.gpus, devices: .gpus}]'
gpus=$(tcloud nodes --json | jq '[.[].capacity.gpus] | add')
failed=0
if [[ ${gpus:-0} -lt 1 ]]; then echo "FAIL: no GPU discovered"; failed=1; fi

say "2. a task that uses one GPU"
task_dir=$(mktemp -d)
{
  echo "name: gpu-check"
  echo "resources: {gpus: 1, cpus: 1, memory: 4GiB}"
  echo "run: |"
  compute_line | sed 's/^/  /'
} >"$task_dir/task.yaml"
id=$(tcloud submit "$task_dir" --json | jq -r '.task_id')
echo "task $id"
max_util=0
for _ in $(seq 1 30); do
  sleep 1
  sample=$(tcloud top "$id" --once --json 2>/dev/null || echo '[]')
  util=$(jq '[.[].ranks[]?.gpus[]?.utilization_percent] | max // 0' <<<"$sample")
  [[ $util -gt $max_util ]] && max_util=$util
  echo "sampled GPU utilisation: ${util}%"
done
echo "highest sampled utilisation: ${max_util}%"
if [[ $max_util -le 0 ]]; then
  echo "NOTE: 0% sampled (no PyTorch or CuPy here: the task ran nvidia-smi only)"
  compute_line | grep -q -e torch -e cupy && { echo "FAIL: a GPU computation sampled as idle"; failed=1; }
fi

say "3. cancel, then look for any process left on the GPU"
tcloud cancel "$id" >/dev/null
for _ in $(seq 1 30); do
  state=$(tcloud show "$id" --json | jq -r .state)
  [[ $state == cancelled || $state == succeeded || $state == failed ]] && break
  sleep 1
done
echo "task state: $state"
tcloud logs "$id" | tail -5 || true
holders=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . || true)
echo "processes on the GPUs now: $holders"
if [[ $holders -gt 0 ]]; then
  nvidia-smi --query-compute-apps=pid,process_name --format=csv
  echo "FAIL: a process still holds a GPU"
  failed=1
fi

say "idle-GPU policy: not built yet (docs/GPUS.md)"
[[ $failed == 0 ]] && say "every check held" || say "a check failed"
exit "$failed"
