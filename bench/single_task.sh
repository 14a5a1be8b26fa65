#!/usr/bin/env bash
# One task, submit → finished, through the command a user types: `tcloud up` (release
# binaries), then 10 × `tcloud submit DIR -f` (`run: "true"`) after one warm-up, each timed
# from the command's start to its exit. Prints each run and the median in ms (issue 24's
# single-task figure; docs/BENCHMARKS.md).
#
#   bench/single_task.sh [BIN_DIR]      # default target/release (built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${1:-} ]]; then
  cargo build --release -q -p taccd -p tcloud --bins
fi
BIN=$(realpath "${1:-target/release}")
source bench/lib.sh
home=$(mktemp -d /var/tmp/tacc-single-home.XXXX)
task=$(mktemp -d /var/tmp/tacc-single-task.XXXX)
trap 'TACC_HOME=$home "$BIN/tcloud" down >/dev/null 2>&1 || true; rm -rf "$home" "$task"' EXIT
printf 'name: t\nrun: "true"\n' >"$task/task.yaml"
TACC_HOME=$home "$BIN/tcloud" up --port "${TACC_BENCH_PORT:-18392}" >/dev/null 2>&1 ||
  { echo "tcloud up failed (see $home/local/taccd.log)" >&2; exit 1; }
wait_for_node "$BIN" "$home"
TACC_HOME=$home "$BIN/tcloud" submit "$task" -f >/dev/null 2>&1
runs=()
for _ in $(seq 10); do
  start=$(date +%s%N)
  TACC_HOME=$home "$BIN/tcloud" submit "$task" -f >/dev/null 2>&1
  end=$(date +%s%N)
  runs+=($(((end - start) / 1000000)))
done
echo "runs (ms): ${runs[*]}"
printf '%s\n' "${runs[@]}" | sort -n | awk '{a[NR] = $1} END {print "median (ms):", (a[5] + a[6]) / 2}'
