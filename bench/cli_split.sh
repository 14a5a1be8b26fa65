#!/usr/bin/env bash
# One CLI run of `bench/throughput.sh`'s TACC part, with the server's and the embedded
# agent's CPU read apart (for side-by-side runs of two builds on one machine):
#
#   bench/cli_split.sh BIN_DIR N         # BIN_DIR holds taccd, tcloud and tacc-launch
#   PERF_OUT=agent.perf bench/cli_split.sh target/release 2000   # + the agent's profile
#   PERF_STAT_OUT=server.stat bench/cli_split.sh target/release 2000  # + the server's
#                                      # context switches and task clock during the submit
#
# `tcloud up` (queue limits lifted past N), then `tcloud submit DIR --array 1-N -f` with
# `run: "true"`, timed from start to exit. Prints tasks/s, the server's and the agent's
# own CPU (user + system, /proc/PID/stat) per task, and the load average before → after.
set -euo pipefail
BIN=$(realpath "$1")
cd "$(dirname "$0")/.."
source bench/lib.sh
n=$2
home=$(mktemp -d /var/tmp/tacc-bench-home.XXXX)
task=$(mktemp -d /var/tmp/tacc-bench-task.XXXX)
trap 'TACC_HOME=$home "$BIN/tcloud" down >/dev/null 2>&1 || true; rm -rf "$home" "$task"' EXIT
printf 'name: t\nrun: "true"\n' >"$task/task.yaml"
taccd_lifted "$BIN" "$home" "$n"
TACC_TACCD=$home/taccd TACC_HOME=$home "$BIN/tcloud" up --port "${TACC_BENCH_PORT:-18397}" >/dev/null 2>&1 ||
  { echo "tcloud up failed (see $home/local/taccd.log)" >&2; exit 1; }
wait_for_node "$BIN" "$home"
server=$(cat "$home/local/taccd.pid")
agent=$(pgrep -f -P "$server" -- "--embedded-agent" | head -1)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
s0=$(ticks "$server"); a0=$(ticks "$agent"); l0=$(cut -d' ' -f1 /proc/loadavg)
if [[ -n ${PERF_OUT:-} ]]; then
  perf record -F 499 --call-graph dwarf -o "$PERF_OUT" -p "$agent" -- sleep 8 >/dev/null 2>&1 &
fi
if [[ -n ${PERF_STAT_OUT:-} ]]; then
  perf stat -e context-switches,task-clock -p "$server" -o "$PERF_STAT_OUT" &
  stat_pid=$!
fi
start=$(date +%s.%N)
TACC_HOME=$home "$BIN/tcloud" submit "$task" --array "1-$n" -f >/dev/null 2>"$home/submit.err" ||
  { echo "tcloud submit failed: $(tail -3 "$home/submit.err")" >&2; exit 1; }
end=$(date +%s.%N)
if [[ -n ${stat_pid:-} ]]; then kill -INT "$stat_pid"; fi
s1=$(ticks "$server"); a1=$(ticks "$agent"); l1=$(cut -d' ' -f1 /proc/loadavg)
wait
hz=$(getconf CLK_TCK)
printf '%s N=%d tasks/s=%.1f server_ms=%.2f agent_ms=%.2f load=%s->%s\n' "$(date -u +%H:%M)" "$n" \
  "$(echo "$n / ($end - $start)" | bc -l)" "$(echo "($s1 - $s0) * 1000 / $hz / $n" | bc -l)" \
  "$(echo "($a1 - $a0) * 1000 / $hz / $n" | bc -l)" "$l0" "$l1"
