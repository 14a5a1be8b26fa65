#!/usr/bin/env bash
# Trivial-task throughput, HyperQueue and TACC side by side in one run, for each N.
#
#   bench/throughput.sh                 # N = 1000 10000 100000
#   TASK_COUNTS="1000 10000" bench/throughput.sh
#
# HyperQueue (../shared/anchors/hyperqueue/hq, a benchmark anchor only — never shipped,
# never used by tests): one server, one worker with every core, `hq submit --array 1-N
# --wait -- true` (per-task stdout/stderr files kept). TACC, twice: through the command a
# user types (`tcloud up` with release binaries, then `tcloud submit DIR --array 1-N -f`,
# `run: "true"`, timed from start to exit; CPU = the server's and its children's, the
# embedded agent included, from /proc) and through the bench harness (a release `taccd
# dev`, the N tasks as one array over HTTP, crates/taccd/benches/throughput.rs). Prints
# tasks/s of each, the ratios to HyperQueue, TACC's CPU per task and the bare-spawn
# floor. Figures belong in docs/BENCHMARKS.md with the machine they ran on.
set -Eeuo pipefail
# Every step's own output goes to /dev/null: a failing one says at least which it was.
trap 'echo "bench/throughput.sh: stopped at line $LINENO: $BASH_COMMAND (exit $?)" >&2' ERR
cd "$(dirname "$0")/.."
HQ=${HQ:-$(realpath ../shared/anchors/hyperqueue/hq)}
COUNTS=${TASK_COUNTS:-"1000 10000 100000"}
CORES=$(nproc)
[[ -x $HQ ]] || { echo "HyperQueue not found at $HQ (set HQ=…)" >&2; exit 1; }

cargo bench -p taccd --bench throughput --no-run >/dev/null 2>&1 ||
  cargo bench -p taccd --bench throughput --no-run
cargo build --release -q -p taccd -p tcloud -p tacc-launch --bins
# Executions start as the static launcher, as an installation has them (OPERATIONS.md).
scripts/static-launcher.sh target/release
BIN=$PWD/target/release

source bench/lib.sh

# TACC through the command a user types: `tcloud up`, then `tcloud submit DIR --array 1-N
# -f` (`run: "true"`) timed from the command's start to its exit; prints "tasks/s cpu_ms".
tacc_cli_run() {
  local n=$1 home task pid c0 c1 start end
  home=$(mktemp -d)
  task=$(mktemp -d)
  printf 'name: t\nrun: "true"\n' >"$task/task.yaml"
  # HyperQueue caps no queue: lift the cluster's per-user limits past N (an operator's
  # taccd flags, which `tcloud up` starts taccd through this wrapper with).
  taccd_lifted "$BIN" "$home" "$n"
  TACC_TACCD=$home/taccd TACC_HOME=$home "$BIN/tcloud" up --port "${TACC_BENCH_PORT:-18383}" >/dev/null 2>&1 ||
    { echo "tcloud up failed (see $home/local/taccd.log)" >&2; exit 1; }
  wait_for_node "$BIN" "$home"
  pid=$(cat "$home/local/taccd.pid")
  c0=$(cpu_of_tree "$pid")
  start=$(date +%s.%N)
  TACC_HOME=$home "$BIN/tcloud" submit "$task" --array "1-$n" -f >/dev/null 2>"$home/submit.err" ||
    { echo "tcloud submit failed: $(tail -3 "$home/submit.err")" >&2; TACC_HOME=$home "$BIN/tcloud" down >/dev/null 2>&1; exit 1; }
  end=$(date +%s.%N)
  c1=$(cpu_of_tree "$pid")
  TACC_HOME=$home "$BIN/tcloud" down >/dev/null 2>&1 || true
  rm -rf "$home" "$task"
  echo "$(echo "$n / ($end - $start)" | bc -l) $(echo "($c1 - $c0) * 1000 / $n" | bc -l)"
}

hq_run() {
  local n=$1 dir
  dir=$(mktemp -d)
  export HQ_SERVER_DIR=$dir/server
  # `exec`: no shell is left to run the ERR trap (inherited, `set -E`) when these exit
  # non-zero at the server's stop, which would print a failure that is none.
  (cd "$dir" && exec "$HQ" server start >/dev/null 2>&1 &)
  "$HQ" server wait >/dev/null 2>&1 || sleep 1
  (cd "$dir" && exec "$HQ" worker start --cpus "$CORES" >/dev/null 2>&1 &)
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

printf '%-8s %10s %10s %8s %12s %10s %8s %12s %12s\n' N "HQ /s" "CLI /s" "CLI x" "CLI CPU ms" "bench /s" "bench x" "bench CPU ms" "bare spawn/s"
for n in $COUNTS; do
  hq=$(hq_run "$n")
  read -r cli cli_cpu < <(tacc_cli_run "$n")
  tacc_json=$(TACC_BENCH_TASKS=$n cargo bench -q -p taccd --bench throughput 2>/dev/null | tail -1)
  tacc=$(jq -r .tasks_per_s <<<"$tacc_json")
  cpu=$(jq -r .cpu_ms_per_task <<<"$tacc_json")
  bare=$(jq -r .bare_spawn_per_s <<<"$tacc_json")
  printf '%-8s %10.0f %10.0f %7.2fx %12.2f %10.0f %7.2fx %12.2f %12.0f\n' "$n" "$hq" "$cli" \
    "$(echo "$cli / $hq" | bc -l)" "$cli_cpu" "$tacc" "$(echo "$tacc / $hq" | bc -l)" "$cpu" "$bare"
done
