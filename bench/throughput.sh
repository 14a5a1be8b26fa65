#!/usr/bin/env bash
# Trivial-task throughput, HyperQueue and TACC side by side in one run, for each N.
#
#   bench/throughput.sh                 # N = 1000 10000 100000
#   TASK_COUNTS="1000 10000" bench/throughput.sh
#
# HyperQueue (../shared/anchors/hyperqueue/hq, a benchmark anchor only — never shipped,
# never used by tests): one server, one worker with every core, `hq submit --array 1-N
# --wait -- true` (per-task stdout/stderr files kept). TACC: a release `taccd dev`
# (control plane + one agent, SQLite with synchronous commits), N tasks `true` queued over
# HTTP by 16 concurrent clients (crates/taccd/benches/throughput.rs). Prints tasks/s of
# each, the ratio, TACC's own CPU per task and the bare-spawn floor. Figures belong in
# docs/BENCHMARKS.md with the machine they ran on.
set -euo pipefail
cd "$(dirname "$0")/.."
HQ=${HQ:-$(realpath ../shared/anchors/hyperqueue/hq)}
COUNTS=${TASK_COUNTS:-"1000 10000 100000"}
CORES=$(nproc)
[[ -x $HQ ]] || { echo "HyperQueue not found at $HQ (set HQ=…)" >&2; exit 1; }

cargo bench -p taccd --bench throughput --no-run >/dev/null 2>&1 ||
  cargo bench -p taccd --bench throughput --no-run

hq_run() {
  local n=$1 dir
  dir=$(mktemp -d)
  export HQ_SERVER_DIR=$dir/server
  (cd "$dir" && "$HQ" server start >/dev/null 2>&1 &)
  "$HQ" server wait >/dev/null 2>&1 || sleep 1
  (cd "$dir" && "$HQ" worker start --cpus "$CORES" >/dev/null 2>&1 &)
  local deadline=$((SECONDS + 30))
  until "$HQ" worker list 2>/dev/null | grep -q RUNNING; do
    ((SECONDS < deadline)) || { echo "hq worker did not start" >&2; exit 1; }
    sleep 0.1
  done
  local start end
  start=$(date +%s.%N)
  (cd "$dir" && "$HQ" submit --array "1-$n" --wait -- true >/dev/null 2>&1)
  end=$(date +%s.%N)
  "$HQ" server stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  echo "$n / ($end - $start)" | bc -l
}

printf '%-8s %12s %12s %8s %18s %14s\n' N "HQ tasks/s" "TACC tasks/s" ratio "TACC CPU ms/task" "bare spawn/s"
for n in $COUNTS; do
  hq=$(hq_run "$n")
  tacc_json=$(TACC_BENCH_TASKS=$n cargo bench -q -p taccd --bench throughput 2>/dev/null | tail -1)
  tacc=$(jq -r .tasks_per_s <<<"$tacc_json")
  cpu=$(jq -r .cpu_ms_per_task <<<"$tacc_json")
  bare=$(jq -r .bare_spawn_per_s <<<"$tacc_json")
  printf '%-8s %12.0f %12.0f %7.2fx %18.2f %14.0f\n' "$n" "$hq" "$tacc" "$(echo "$tacc / $hq" | bc -l)" "$cpu" "$bare"
done
