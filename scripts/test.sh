#!/usr/bin/env bash
# The whole test suite. On a machine without what the tests need (CI=true, or as root on
# a fresh machine) it installs it first; in CI a missing tool is a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
# One line per phase on stderr, so a run cut off by a time limit shows where it was.
# Each line also says how much disk is left where the build goes: a full disk is the one
# failure a compiler names badly.
phase() {
  echo "test.sh: $(date -u +%H:%M:%S) $* ($(df -h --output=avail . | tail -n 1 | tr -d ' ') free)" >&2
}

if ! need python3; then
  if [ "$(id -u)" = 0 ] && need apt-get; then
    apt-get update -qq && apt-get install -y -qq python3 >/dev/null
  fi
fi
if ! need python3; then
  echo "error: python3 is required by the end-to-end tests (examples/quickstart)" >&2
  exit 1
fi

# `man` (man-db, with groff) renders every generated tcloud man page in
# crates/tcloud/tests/shell_docs.rs; in CI a missing `man` fails that test.
if ! need man; then
  if [ "$(id -u)" = 0 ] && need apt-get; then
    apt-get update -qq && apt-get install -y -qq man-db groff-base >/dev/null
  fi
fi

# Real Docker for the container runtime's integration tests (crates/taccd/tests/docker.rs,
# crates/tacc-exec/tests/docker_contract.rs). Started BEFORE Slurm: dockerd sets the
# iptables FORWARD policy to DROP, and setup-slurm.sh then lets its bridge through. In CI
# an engine that does not come up is a failure; elsewhere the tests say SKIPPED loudly.
if [ "${CI:-}" = "true" ] || { [ "$(id -u)" = 0 ] && need apt-get; }; then
  if ! bash scripts/ci/setup-docker.sh; then
    echo "error: could not start the test Docker engine (scripts/ci/setup-docker.sh)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

# Real Slurm for the Slurm backend's integration tests (crates/taccd/tests/slurm.rs):
# in CI, or as root, install and start a throw-away two-node cluster. In CI a cluster
# that does not come up is a failure; elsewhere the tests say SKIPPED loudly.
if [ "${CI:-}" = "true" ] || { [ "$(id -u)" = 0 ] && need apt-get; }; then
  if ! bash scripts/ci/setup-slurm.sh; then
    echo "error: could not start the test Slurm cluster (scripts/ci/setup-slurm.sh)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

# A multi-host network for the multi-machine tests (crates/taccd/tests/netns.rs): agents
# in their own network namespaces, reaching the server over a bridge. In CI a network that
# does not come up is a failure; elsewhere those tests say SKIPPED loudly.
if [ "${CI:-}" = "true" ] || { [ "$(id -u)" = 0 ] && need apt-get; }; then
  if ! bash scripts/ci/setup-netns.sh; then
    echo "error: could not create the test network namespaces (scripts/ci/setup-netns.sh)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

# A real Prometheus for the metrics test (crates/taccd/tests/prometheus.rs), which starts
# its own `prometheus` process scraping a test server. In CI a missing Prometheus is a
# failure; elsewhere that test says SKIPPED loudly.
if [ "${CI:-}" = "true" ] || { [ "$(id -u)" = 0 ] && need apt-get; }; then
  if ! bash scripts/ci/setup-prometheus.sh; then
    echo "error: could not install Prometheus (scripts/ci/setup-prometheus.sh)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

# Headless Chromium and chromedriver from Debian's packages for the dashboard's browser
# tests (crates/taccd/tests/dashboard.rs), which keep their screenshots in
# target/ui-screenshots/. In CI a browser that does not install is a failure; elsewhere
# those tests say SKIPPED loudly.
if [ "${CI:-}" = "true" ] || { [ "$(id -u)" = 0 ] && need apt-get; }; then
  if ! bash scripts/ci/setup-chromium.sh; then
    echo "error: could not install Chromium for the dashboard tests (scripts/ci/setup-chromium.sh)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

# A real PostgreSQL for the PostgreSQL store's contract suite (crates/tacc-store) and
# `taccd --database postgres://…` (crates/taccd/tests/postgres.rs); each test creates and
# drops its own database. In CI a server that does not come up is a failure; elsewhere
# those tests say SKIPPED loudly.
if [ "${CI:-}" = "true" ] || { [ "$(id -u)" = 0 ] && need apt-get; }; then
  # Captured through a file, not a pipe: a reader of a pipe waits for every holder of its
  # writing end, and a daemon started on the way could hold it for good.
  postgres_url_file=$(mktemp)
  if bash scripts/ci/setup-postgres.sh >"$postgres_url_file" \
    && postgres_url=$(tail -n 1 "$postgres_url_file") \
    && [[ "$postgres_url" == postgres://* ]]; then
    export TACC_TEST_POSTGRES_URL="$postgres_url"
  else
    echo "error: could not start the test PostgreSQL server (scripts/ci/setup-postgres.sh)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
  rm -f "$postgres_url_file"
fi

if [ "${CI:-}" = "true" ]; then
  # A fresh clone builds once: incremental state would only take disk (5 GB of it).
  export CARGO_INCREMENTAL=0
  phase "cargo fmt --check"
  cargo fmt --all -- --check
  phase "cargo clippy"
  cargo clippy --workspace --all-targets --quiet -- -D warnings
fi

# The GPU check needs a real GPU; everywhere else it must still pass its own dry run.
phase "scripts/gpu-check.sh --dry-run"
bash scripts/gpu-check.sh --dry-run >/dev/null

# The CLI's end-to-end tests start the real taccd binary, so build every binary first.
phase "cargo build --bins"
cargo build --workspace --bins --quiet
phase "cargo test"
cargo test --workspace
phase "done"
