#!/usr/bin/env bash
# Compiler-layer benchmark: delta upload of a 1 GiB project and task start overhead.
#
#   cargo build --release -p taccd -p tcloud
#   bench/compiler.sh                      # BIN=target/release WORK=$(mktemp -d) by default
#
# 1. Generates a deterministic 1 GiB project (10,000 small text files + 4 large binary
#    files), submits it with `tcloud submit --json` to a fresh `taccd dev`, changes one
#    1 MiB region of one large file and adds one small file, and submits again. For the
#    same two trees it runs `rsync -a --stats --no-whole-file` (rsync's delta algorithm,
#    as over a network; a local rsync would otherwise copy whole files) into a local
#    directory and `tar c | zstd -3` (what a plain tar upload would send).
# 2. Task start overhead: the time from the task's `starting` event (it was placed) to the
#    first line its `run` prints, for a task with a managed environment (python only) on
#    a fresh node (cold: environment and snapshot not cached) and again (warm).
#
# Prints a Markdown table; needs python3, rsync, zstd, curl, jq.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
[ -x "$BIN/taccd" ] || BIN=${CARGO_TARGET_DIR:-target}/release
WORK=${WORK:-$(mktemp -d)}
export TACC_HOME="$WORK/home"
mkdir -p "$TACC_HOME"
for tool in python3 rsync zstd curl jq; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 1; }
done

now_ms() { date +%s%3N; }

start_taccd() { # DATA_DIR -> sets URL and PID
  "$BIN/taccd" dev --data-dir "$1" --listen 127.0.0.1:0 2>"$1.log" &
  PID=$!
  for _ in $(seq 1 300); do
    [ -f "$1/taccd.json" ] && break
    sleep 0.1
  done
  URL=$(jq -r .url "$1/taccd.json")
  for _ in $(seq 1 300); do
    [ -s "$1/admin.token" ] && break
    sleep 0.1
  done
  # The embedded cluster's admin token: tcloud reads TACC_TOKEN, curl gets a header.
  export TACC_TOKEN; TACC_TOKEN=$(cat "$1/admin.token")
}
# The header from a file descriptor: a token on curl's command line is readable by every
# process on the machine (`ps -eo args`).
api() { curl -s -H @<(printf 'Authorization: Bearer %s\n' "$TACC_TOKEN") "$@"; }

# ------------------------------------------------------------------ project
python3 - "$WORK/project" <<'EOF'
import os, random, sys
root = sys.argv[1]
rng = random.Random(20260101)
os.makedirs(os.path.join(root, "data"), exist_ok=True)
small_total = 0
for i in range(10_000):
    d = os.path.join(root, "src", f"pkg{i // 500:02d}")
    os.makedirs(d, exist_ok=True)
    size = rng.randint(512, 6 * 1024)           # hex text: ~2x compressible, like code
    with open(os.path.join(d, f"mod{i:05d}.py"), "w") as f:
        f.write(rng.randbytes(size).hex())
    small_total += 2 * size
large = (1 << 30) - small_total
for i in range(4):
    n = large // 4 + (large % 4 if i == 3 else 0)
    with open(os.path.join(root, "data", f"large{i}.bin"), "wb") as f:
        r = random.Random(i)
        left = n
        while left:
            step = min(left, 16 << 20)
            f.write(r.randbytes(step))
            left -= step
with open(os.path.join(root, "task.yaml"), "w") as f:
    f.write("name: bench\nresources: {cpus: 1}\nrun: echo hello\n")
EOF
TOTAL=$(du -sb --apparent-size "$WORK/project" | cut -f1)

start_taccd "$WORK/d"
trap 'kill $PID 2>/dev/null || true' EXIT

submit() { # -> "bytes_sent_uncompressed seconds"
  local t0 t1 json
  t0=$(now_ms)
  json=$("$BIN/tcloud" --server "$URL" submit "$WORK/project" --json)
  t1=$(now_ms)
  echo "$(echo "$json" | jq .uploaded_bytes) $(echo "$json" | jq .chunks_uploaded) $(echo "$json" | jq .chunks_total) $(( t1 - t0 ))"
}
rsync_run() { # -> "bytes_sent seconds"
  local t0 t1 sent
  t0=$(now_ms)
  sent=$(rsync -a --stats --no-whole-file "$WORK/project/" "$WORK/rsync-dest/" | awk -F': ' '/Total bytes sent/ {gsub(/,/,"",$2); print $2}')
  t1=$(now_ms)
  echo "$sent $(( t1 - t0 ))"
}
tar_run() {
  local t0 t1 bytes
  t0=$(now_ms)
  bytes=$(tar c -C "$WORK/project" . | zstd -3 -T0 -q -c | wc -c)
  t1=$(now_ms)
  echo "$bytes $(( t1 - t0 ))"
}

sync
read -r S1 C1 CT1 T1 <<<"$(submit)"
read -r R1 RT1 <<<"$(rsync_run)"
read -r Z1 ZT1 <<<"$(tar_run)"

# One 1 MiB region of one large file changed, one small file added.
python3 - "$WORK/project" <<'EOF'
import os, random, sys
root = sys.argv[1]
with open(os.path.join(root, "data", "large1.bin"), "r+b") as f:
    f.seek(100 << 20)
    f.write(random.Random(99).randbytes(1 << 20))
with open(os.path.join(root, "src", "pkg00", "added.py"), "w") as f:
    f.write("print('a new small file')\n")
EOF
read -r S2 C2 CT2 T2 <<<"$(submit)"
read -r R2 RT2 <<<"$(rsync_run)"
read -r Z2 ZT2 <<<"$(tar_run)"

mib() { python3 -c "print(f'{$1/1048576:.1f} MiB')"; }
pct() { python3 -c "print(f'{100*$1/$TOTAL:.2f} %')"; }
secs() { python3 -c "print(f'{$1/1000:.2f} s')"; }

echo
echo "Project: $(mib "$TOTAL") in $(find "$WORK/project" -type f | wc -l) files"
echo
echo "| run | tool | bytes sent | of project | wall time |"
echo "|---|---|---|---|---|"
echo "| first submission | tcloud submit (chunks, uncompressed; $C1/$CT1 chunks) | $(mib "$S1") | $(pct "$S1") | $(secs "$T1") |"
echo "| first submission | rsync -a --no-whole-file | $(mib "$R1") | $(pct "$R1") | $(secs "$RT1") |"
echo "| first submission | tar c \| zstd -3 | $(mib "$Z1") | $(pct "$Z1") | $(secs "$ZT1") |"
echo "| resubmission | tcloud submit ($C2/$CT2 chunks) | $(mib "$S2") | $(pct "$S2") | $(secs "$T2") |"
echo "| resubmission | rsync -a --no-whole-file | $(mib "$R2") | $(pct "$R2") | $(secs "$RT2") |"
echo "| resubmission | tar c \| zstd -3 | $(mib "$Z2") | $(pct "$Z2") | $(secs "$ZT2") |"

# ------------------------------------------------------------------ start overhead
kill "$PID"; wait "$PID" 2>/dev/null || true
mkdir -p "$WORK/small"
python3 - "$WORK/small" <<'EOF'
import os, random, sys
root = sys.argv[1]
python = "%d.%d" % sys.version_info[:2]
rng = random.Random(7)
for i in range(200):
    with open(os.path.join(root, f"m{i:03d}.py"), "w") as f:
        f.write(rng.randbytes(rng.randint(512, 16384)).hex())
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(rng.randbytes(8 << 20))
with open(os.path.join(root, "task.yaml"), "w") as f:
    f.write("name: start\nresources: {cpus: 1}\nenvironment: {python: '" + python + "'}\n"
            "run: |\n  echo \"first-line $(date +%s%3N)\"\n")
EOF
start_taccd "$WORK/d2"
overhead() { # submit the small project, print ms from `starting` to the first line
  local id
  id=$("$BIN/tcloud" --server "$URL" submit "$WORK/small" --json | jq .task_id)
  for _ in $(seq 1 600); do
    state=$(api "$URL/v1/tasks/$id" | jq -r .state)
    case $state in succeeded|failed|cancelled|lost) break;; esac
    sleep 0.1
  done
  [ "$state" = succeeded ] || { echo "task $id $state" >&2; api "$URL/v1/tasks/$id/logs" >&2; exit 1; }
  local starting first
  starting=$(api "$URL/v1/tasks/$id/events" | jq '[.[] | select(.state == "starting")][0].at')
  first=$(api "$URL/v1/tasks/$id/logs" | awk '/^first-line/ {print $2; exit}')
  echo $(( first - starting ))
}
COLD=$(overhead)
WARM=$(overhead)
WARM2=$(overhead)
echo
echo "| task start (starting → first log line) | time |"
echo "|---|---|"
echo "| cold node (env build + 8.6 MiB snapshot fetch) | $(secs "$COLD") |"
echo "| warm env + warm snapshot | $(secs "$WARM") |"
echo "| warm env + warm snapshot (again) | $(secs "$WARM2") |"
