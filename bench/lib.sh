# Helpers shared by the benchmark scripts (sourced, not run).

# CPU seconds (user + system) of a process and its live children, from /proc.
cpu_of_tree() {
  local total=0 pid ticks
  for pid in "$1" $(pgrep -P "$1" || true); do
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    total=$((total + ticks))
  done
  echo "$total / $(getconf CLK_TCK)" | bc -l
}

# Write $2/taccd: BIN_DIR $1's taccd with the per-user queue and submit limits lifted past
# N ($3) — HyperQueue caps no queue; `tcloud up` starts taccd through it (TACC_TACCD).
taccd_lifted() {
  printf '#!/bin/sh\nexec "%s" "$@" --max-queued %d --submit-burst %d\n' "$1/taccd" $(($3 * 2)) $(($3 * 2)) >"$2/taccd"
  chmod +x "$2/taccd"
}

# Wait until the cluster of TACC_HOME $2 (BIN_DIR $1) lists its node.
wait_for_node() {
  until TACC_HOME=$2 "$1/tcloud" nodes --json 2>/dev/null | grep -q '"name"'; do sleep 0.2; done
}
