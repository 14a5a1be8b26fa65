#!/usr/bin/env bash
# Install Prometheus (Debian's `prometheus` package) for TACC's metrics test
# (crates/taccd/tests/prometheus.rs). Idempotent: a `prometheus` binary already on PATH is
# left as it is.
#
# The package's own service is not used (and is stopped when the package starts it on
# installation): the test runs its own `prometheus` process with its own configuration,
# data directory and free port, so nothing here depends on systemd.
#
# Usage (as root): scripts/ci/setup-prometheus.sh
set -euo pipefail

log() { echo "setup-prometheus: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1; }

if need prometheus; then
  log "prometheus is installed: $(prometheus --version 2>&1 | head -n1)"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it installs a package)"
  exit 1
fi

log "installing prometheus from the distribution"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: the exporters and the web console libraries are not needed.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# Where the package's maintainer script started its service, stop it: the test needs no
# system-wide instance holding port 9090 and a data directory.
if need systemctl && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
fi

if ! need prometheus; then
  log "the prometheus package was installed but no \`prometheus\` binary is on PATH"
  exit 1
fi
log "installed: $(prometheus --version 2>&1 | head -n1)"
