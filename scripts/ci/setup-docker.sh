#!/usr/bin/env bash
# Start a Docker engine on this machine for TACC's container-runtime tests and build the
# tiny test image they use. Idempotent: an engine that already answers is left as it is,
# and the image is rebuilt only when missing.
#
# There is no registry to pull from, so the test image is built locally FROM scratch: a
# static busybox (Debian's busybox-static) as /bin/sh and the usual tools.
#
# Usage (as root): scripts/ci/setup-docker.sh        # install + start + build image
#                  scripts/ci/setup-docker.sh stop   # stop the dockerd this script started
#
# Start it BEFORE scripts/ci/setup-slurm.sh: dockerd sets the iptables FORWARD policy to
# DROP, and setup-slurm.sh adds the ACCEPT rule the Slurm test bridge needs after it.
set -euo pipefail

IMAGE=tacc-test/busybox:latest
STATE=/var/lib/tacc-ci-docker
PIDFILE=/run/tacc-ci-dockerd.pid
START_DEADLINE_SECS=${DOCKER_START_DEADLINE_SECS:-60}

log() { echo "setup-docker: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1; }

if [ "${1:-}" = stop ]; then
  if [ -f "$PIDFILE" ]; then
    pid=$(cat "$PIDFILE")
    kill "$pid" 2>/dev/null || true
    # dockerd stops its containers and containerd first; wait for it, with a deadline.
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    rm -f "$PIDFILE"
  fi
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it installs packages and starts dockerd)"
  exit 1
fi

if ! need dockerd || ! need docker || [ ! -x /bin/busybox ]; then
  log "installing docker.io and busybox-static from the distribution"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io busybox-static >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  # A dockerd killed without its shutdown (the end of a session, kill -9) leaves its pid
  # file behind, and a new dockerd refuses to start while the file is there.
  for file in "$PIDFILE" "$PIDFILE.dockerd"; do
    if [ -f "$file" ] && ! kill -0 "$(cat "$file")" 2>/dev/null; then
      log "removing the stale pid file $file"
      rm -f "$file"
    fi
  done
  # A throw-away data root: the tests' engine shares nothing with a system one.
  mkdir -p "$STATE/data"
  log "starting dockerd (data root $STATE/data, log $STATE/dockerd.log)"
  nohup dockerd --data-root "$STATE/data" --pidfile "$PIDFILE.dockerd" \
    >"$STATE/dockerd.log" 2>&1 &
  echo $! >"$PIDFILE"
  deadline=$((SECONDS + START_DEADLINE_SECS))
  until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "dockerd did not answer within ${START_DEADLINE_SECS}s; last log lines:"
      tail -n 20 "$STATE/dockerd.log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
fi

# Re-apply the Slurm bridge's ACCEPT rule in case the Slurm cluster was started first.
if need iptables && ip link show taccbr0 >/dev/null 2>&1; then
  iptables -C FORWARD -i taccbr0 -o taccbr0 -j ACCEPT 2>/dev/null \
    || iptables -I FORWARD 1 -i taccbr0 -o taccbr0 -j ACCEPT
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "building $IMAGE from scratch with a static busybox"
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
  cp /bin/busybox "$context/busybox"
  cat >"$context/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/mkdir", "-p", "/tmp", "/usr/bin"]
ENV PATH=/usr/local/bin:/usr/bin:/bin
DOCKERFILE
  docker build -q -t "$IMAGE" "$context" >/dev/null
fi
log "ready: $(docker version --format 'server {{.Server.Version}}') with $IMAGE"
