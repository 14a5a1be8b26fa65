#!/usr/bin/env bash
# Store transactions and fsyncs per task, and the server's CPU per task, for a trivial
# array through the command a user types — the reactor issue's figures.
#
#   bench/commits.sh                  # N = 2000, binaries from target/release
#   N=300 BIN=/path/to/bins bench/commits.sh
#
# `tcloud up` runs under `strace -f -c -e trace=fsync,fdatasync` (the server, its embedded
# agent and every child: each fsync the platform makes is counted by the kernel), then
# `tcloud submit DIR --array 1-N -f` (`run: "true"`), then `tcloud down`. Transactions
# are the server's own count of commits (`tacc_store_commit_seconds_count`, every kind but
# the syncs answers wait for),
# read from /metrics before and after the array. CPU is the server's and its children's
# from /proc, as bench/throughput.sh reads it. Figures belong in docs/BENCHMARKS.md with
# the machine they ran on.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
N=${N:-2000}
BIN=${BIN:-$PWD/target/release}
PORT=${TACC_BENCH_PORT:-18384}
command -v strace >/dev/null || { echo "strace is needed (apt-get install strace)" >&2; exit 1; }

# One life of a cluster: prints "tasks/s transactions/task fsyncs/task cpu_ms/task";
# with $1 = strace the fsyncs are counted (and the other figures are strace's, slower).
run() {
  local traced=$1 home task tracer token pid t0 t1 c0 c1 start end syncs=0
  home=$(mktemp -d)
  task=$(mktemp -d)
  printf 'name: t\nrun: "true"\n' >"$task/task.yaml"
  taccd_lifted "$BIN" "$home" "$N"
  if [[ $traced == strace ]]; then
    strace -f -c -e trace=fsync,fdatasync -o "$home/strace.txt" \
      env TACC_TACCD="$home/taccd" TACC_HOME="$home" "$BIN/tcloud" up --port "$PORT" >/dev/null 2>&1 &
    tracer=$!
  else
    TACC_TACCD=$home/taccd TACC_HOME=$home "$BIN/tcloud" up --port "$PORT" >/dev/null 2>&1
  fi
  wait_for_node "$BIN" "$home"
  token=$(sed -n 's/^token = "\(.*\)"/\1/p' "$home/config.toml" | head -1)
  pid=$(cat "$home/local/taccd.pid")
  t0=$(commits "$token")
  c0=$(cpu_of_tree "$pid")
  start=$(date +%s.%N)
  TACC_HOME=$home "$BIN/tcloud" submit "$task" --array "1-$N" -f >/dev/null
  end=$(date +%s.%N)
  c1=$(cpu_of_tree "$pid")
  t1=$(commits "$token")
  TACC_HOME=$home "$BIN/tcloud" down >/dev/null 2>&1
  if [[ $traced == strace ]]; then
    wait "$tracer" || true
    syncs=$(awk '$NF == "fsync" || $NF == "fdatasync" {sum += $4} END {print sum + 0}' "$home/strace.txt")
  fi
  rm -rf "$home" "$task"
  echo "$(echo "$N / ($end - $start)" | bc -l) $(echo "($t1 - $t0) / $N" | bc -l) $(echo "$syncs / $N" | bc -l) $(echo "($c1 - $c0) * 1000 / $N" | bc -l)"
}
commits() {
  curl -fsS -H "Authorization: Bearer $1" "http://127.0.0.1:$PORT/metrics" |
    awk '/^tacc_store_commit_seconds_count/ && !/op="sync"/ {sum += $2} END {print sum + 0}'
}

read -r rate txns _ cpu < <(run plain)
read -r _ _ syncs _ < <(run strace)
printf 'N=%d  %s\n  untraced: %.0f tasks/s, %.2f transactions/task, server CPU %.2f ms/task\n  under strace: %.2f fsyncs/task (the whole life of the cluster)\n' \
  "$N" "$BIN" "$rate" "$txns" "$cpu" "$syncs"
