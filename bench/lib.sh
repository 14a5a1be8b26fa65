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
