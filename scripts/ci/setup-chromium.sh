#!/usr/bin/env bash
# Install headless Chromium and its WebDriver (chromedriver) from Debian's packages for
# the dashboard's browser tests (crates/taccd/tests/dashboard.rs). Idempotent: when both
# are already installed and run, nothing is done.
#
# Usage (as root): scripts/ci/setup-chromium.sh
#
# The test finds the binaries on PATH (`chromium`, `chromedriver`), or where the
# TACC_CHROMIUM / TACC_CHROMEDRIVER environment variables point.
set -euo pipefail

log() { echo "setup-chromium: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1; }

works() {
  need chromium && need chromedriver \
    && chromium --headless --no-sandbox --version >/dev/null 2>&1 \
    && chromedriver --version >/dev/null 2>&1
}

if works; then
  log "already installed: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | head -1)"
  exit 0
fi

if [ "$(id -u)" != 0 ] || ! need apt-get; then
  log "error: chromium and chromedriver are missing and this is not root with apt-get;" \
      "install Debian's chromium and chromium-driver packages"
  exit 1
fi

log "installing chromium and chromium-driver from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# fonts-liberation: readable text in the screenshots the test keeps.
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation >/dev/null

if ! works; then
  log "error: chromium or chromedriver was installed but does not run"
  exit 1
fi
log "ready: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | head -1)"
