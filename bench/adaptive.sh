#!/usr/bin/env bash
# Adaptive allocation, live, side by side: the same three tasks on a fresh `taccd dev`,
# once with `--adaptive off` and once with `--adaptive on`, in one script run.
#
#   cargo build --release -p taccd -p tcloud
#   bench/adaptive.sh                 # BIN=target/release WORK=$(mktemp -d) RUN_SECS=60
#
# The node offers 3 CPUs. examples/adaptive/trainer is a CPU-bound "data loader +
# trainer" (4 loader processes, 0.5 CPU asked, `adaptive: {cpus: 0.5..2}`) that prints its
# step rate; examples/adaptive/idle holds 2 CPUs and sleeps for 45 s (`adaptive:
# {cpus: 0.5..2}`); examples/adaptive/queued asks for 1 CPU, which does not fit until the
# idle task gives CPUs back (or ends). Reported per mode: the trainer's step rate over
# its first 10 s and its last 10 s, its CPU allocation at the end, the idle task's CPU
# allocation, the queued task's wait (start − submission), and every change with its
# reason. Needs root (cgroups), python3 and jq.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
[ -x "$BIN/taccd" ] || BIN=${CARGO_TARGET_DIR:-target}/release
WORK=${WORK:-$(mktemp -d)}
RUN_SECS=${RUN_SECS:-60}
export TACC_HOME="$WORK/home"
mkdir -p "$TACC_HOME"
for tool in python3 jq; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 1; }
done

start_taccd() { # DATA_DIR MODE -> sets URL and PID
  "$BIN/taccd" dev --data-dir "$1" --listen 127.0.0.1:0 --cpus 3 --memory 6GiB \
    --adaptive "$2" --adaptive-window 6s --adaptive-cooldown 4s 2>"$1.log" &
  PID=$!
  for _ in $(seq 1 300); do [ -f "$1/taccd.json" ] && break; sleep 0.1; done
  URL=$(jq -r .url "$1/taccd.json")
  for _ in $(seq 1 300); do [ -s "$1/admin.token" ] && break; sleep 0.1; done
  export TACC_TOKEN; TACC_TOKEN=$(cat "$1/admin.token")
}
tc() { "$BIN/tcloud" --server "$URL" "$@"; }
submit() { tc submit "examples/adaptive/$1" --json | jq -r .task_id; }
wait_running() {
  for _ in $(seq 1 600); do
    [ "$(tc show "$1" --json | jq -r .state)" = running ] && return; sleep 0.1
  done
  echo "task $1 never ran" >&2; exit 1
}
# Mean of the `steps/s R at T` lines with T in [FROM, TO).
rate() { tc logs "$1" | awk -v from="$2" -v to="$3" \
  '$1=="steps/s" && $4>=from && $4<to {s+=$2; n++} END {if (n) printf "%.1f", s/n; else print "-"}'; }

run_mode() { # MODE
  local mode=$1 data="$WORK/$1"
  start_taccd "$data" "$mode"
  trainer=$(submit trainer); wait_running "$trainer"
  idle=$(submit idle); wait_running "$idle"
  queued=$(submit queued)
  t0=$(date +%s)
  sleep "$RUN_SECS"
  t1=$(date +%s)
  local q; q=$(tc show "$queued" --json)
  local submitted started wait
  submitted=$(jq -r .submitted_at <<<"$q"); started=$(jq -r '.started_at // empty' <<<"$q")
  if [ -n "$started" ]; then wait=$(( (started - submitted) / 1000 ))s; else wait=">${RUN_SECS}s (not started)"; fi
  local tu iu
  tu=$(tc top "$trainer" --once --json); iu=$(tc show "$idle" --json)
  printf '| %s | %s | %s | %s | %s | %s |\n' "$mode" \
    "$(rate "$trainer" "$t0" $((t0 + 10)))" "$(rate "$trainer" $((t1 - 10)) "$t1")" \
    "$(jq -r '.[0].adaptive.allocation.cpu_millis / 1000' <<<"$tu")" \
    "$(jq -r '[.events[] | select(.reason // "" | startswith("resized")) | .reason | capture("resized to (?<c>[0-9.]+) CPUs").c] | last // "2.00 (unchanged)"' <<<"$iu")" \
    "$wait" >>"$WORK/table.md"
  { echo "### $mode: changes"; for t in "$trainer" "$idle"; do
      tc show "$t" --json | jq -r --arg t "$t" '.events[] | select(.reason // "" | startswith("resized")) | "- task \($t): \(.reason)"'
    done; } >>"$WORK/changes.md"
  tc top "$trainer" --once --json >"$WORK/$mode-trainer-top.json"
  kill "$PID"; wait "$PID" 2>/dev/null || true
}

: >"$WORK/table.md"; : >"$WORK/changes.md"
run_mode off
run_mode on
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r), cgroup $( [ -f /sys/fs/cgroup/cgroup.controllers ] && echo v2 || echo v1)"
echo
echo "| adaptation | trainer steps/s, first 10 s | trainer steps/s, last 10 s | trainer CPUs at the end | idle task's CPUs | queued task's wait |"
echo "|---|---|---|---|---|---|"
cat "$WORK/table.md"
echo
cat "$WORK/changes.md"
