#!/usr/bin/env bash
# Build the launcher (crate `tacc-launch`) static, for musl, and put it beside `taccd`:
#
#   scripts/static-launcher.sh [BIN_DIR]      # BIN_DIR: where taccd is (target/release)
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
bin_dir=${1:-target/release}
target=x86_64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  rustup target add "$target"
fi
cargo build --release --locked --target "$target" -p tacc-launch
install -m 0755 "target/$target/release/tacc-launch" "$bin_dir/tacc-launch"
echo "static-launcher: $bin_dir/tacc-launch ($(file -b "$bin_dir/tacc-launch" | cut -d, -f1-2))"
