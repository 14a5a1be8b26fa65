#!/usr/bin/env bash
# Build the launcher (crate `tacc-launch`) static, for musl, and put it beside `taccd`:
#
#   scripts/static-launcher.sh [BIN_DIR]      # BIN_DIR: where taccd is (target/release)
#   scripts/static-launcher.sh --if-possible [BIN_DIR]   # a note, not a failure, where
#                                             # the target cannot be had (no rustup, offline)
#
# A root agent starts every execution as `tacc-launch` (found beside `taccd`). Built
# for the default target it is a dynamically linked glibc program, whose start — the
# dynamic loader, glibc's CPU and cache probes (`cpuid`, which traps on a virtual
# machine) — costs about 0.6 ms of CPU; the static musl build starts in about 0.15 ms
# (docs/BENCHMARKS.md). Nothing else changes: the same code, the same steps. Needs the
# target: `rustup target add x86_64-unknown-linux-musl` (this script adds it when
# rustup is there).
set -euo pipefail
cd "$(dirname "$0")/.."
optional=false
if [[ ${1:-} == --if-possible ]]; then
  optional=true
  shift
fi
bin_dir=${1:-target/release}
target=x86_64-unknown-linux-musl
unavailable() {
  if $optional; then
    echo "static-launcher: $1; executions start through the dynamically linked launcher (about 0.5 ms more CPU each)" >&2
    exit 0
  fi
  echo "static-launcher: $1" >&2
  exit 1
}
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  command -v rustup >/dev/null || unavailable "no rustup to add the $target target with"
  rustup target add "$target" >/dev/null 2>&1 || unavailable "cannot add the $target target (offline?)"
fi
cargo build --release --quiet --locked --target "$target" -p tacc-launch ||
  unavailable "the launcher did not build for $target"
install -m 0755 "target/$target/release/tacc-launch" "$bin_dir/tacc-launch"
echo "static-launcher: $bin_dir/tacc-launch ($(file -b "$bin_dir/tacc-launch" | cut -d, -f1-2))"
