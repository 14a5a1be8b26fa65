#!/usr/bin/env bash
# The main job on a fresh machine: build TACC, start the embedded single-machine cluster,
# submit examples/quickstart (a small logistic-regression training run), stream its logs
# to the end, and show the result. Needs only cargo and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> building tcloud and taccd (release)"
cargo build --release --quiet -p tcloud -p taccd -p tacc-launch
# The launcher every execution starts as, static where the musl target can be had.
scripts/static-launcher.sh --if-possible target/release
export PATH="$PWD/target/release:$PATH"

echo "==> starting the embedded cluster"
tcloud up

echo "==> submitting examples/quickstart"
submitted=$(tcloud submit examples/quickstart --json)
task=$(printf '%s' "$submitted" | sed -n 's/.*"task_id":[[:space:]]*\([0-9][0-9]*\).*/\1/p')
echo "task $task submitted; streaming its logs"
status=0
tcloud logs --follow "$task" || status=$?

echo
tcloud show "$task"
echo
echo "What to try next (with PATH=\"$PWD/target/release:\$PATH\"):"
hint() { printf '  %-38s # %s\n' "$1" "$2"; }
hint "tcloud ps --all" "every task, with its state and reason"
hint "tcloud download $task" "fetch results/metrics.json and results/model.json"
hint "tcloud submit examples/quickstart -f" "resubmit: unchanged code uploads nothing"
hint "tcloud quickstart my-project" "start a project of your own"
hint "tcloud submit examples/tuxiv-hello -f" "a task in TACC's legacy tuxiv.conf format"
hint "tcloud down" "stop the embedded cluster"
exit "$status"
