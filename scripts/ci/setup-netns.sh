#!/usr/bin/env bash
# A throw-away multi-host network on this machine for TACC's multi-machine tests
# (crates/taccd/tests/netns.rs): NETNS_HOSTS network namespaces (default 4) named
# tacc-h1…, each with its own address on a private bridge, as separate machines would be.
# The bridge side (10.250.78.1) is where the test server listens; agents run inside the
# namespaces (`nsenter --net=/var/run/netns/tacc-hN taccd agent …`) and reach it over
# the bridge. A test cuts a host off with `ip link set veth-tacc-hN down`.
# Idempotent: a healthy network is left as it is, a broken one is rebuilt.
#
# Traffic stays on this machine: 10.250.78.0/24 is routed nowhere else.
#
# Usage (as root): scripts/ci/setup-netns.sh        # create
#                  scripts/ci/setup-netns.sh stop   # remove
set -euo pipefail

HOSTS=${NETNS_HOSTS:-4}
BRIDGE=taccbr1
SUBNET=10.250.78

log() { echo "setup-netns: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1; }
host_name() { echo "tacc-h$1"; }

stop_all() {
  for i in $(seq 1 8); do
    ip netns del "$(host_name "$i")" 2>/dev/null || true
    ip link del "veth-$(host_name "$i")" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

if [ "${1:-}" = stop ]; then
  stop_all
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it creates network namespaces, a bridge and veth pairs)"
  exit 1
fi
if ! need ip || ! need nsenter; then
  log "installing iproute2 and util-linux from the distribution"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq iproute2 util-linux >/dev/null
fi

# Docker sets the FORWARD policy to DROP and has bridged traffic pass iptables; let
# traffic between our hosts through.
allow_bridge() {
  if need iptables; then
    iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null \
      || iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
  fi
}

# Whether namespace $1 reaches the bridge: a TCP connection to a closed port there is
# refused (reached) rather than timing out or finding no route.
reaches() {
  nsenter --net="/var/run/netns/$1" python3 -c '
import socket, sys
try:
    socket.create_connection(("'"$SUBNET"'.1", 9), timeout=1)
except ConnectionRefusedError:
    sys.exit(0)
except OSError:
    sys.exit(1)
' 2>/dev/null
}

healthy() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
  for i in $(seq 1 "$HOSTS"); do
    name=$(host_name "$i")
    ip link set "veth-$name" up 2>/dev/null || return 1
    reaches "$name" || return 1
  done
}

if healthy; then
  allow_bridge
  log "network already up: $(ip netns list | grep -o 'tacc-h[0-9]*' | sort | tr '\n' ' ')"
  exit 0
fi
stop_all

ip link add "$BRIDGE" type bridge
ip addr add "$SUBNET.1/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
mkdir -p /var/run/netns
for i in $(seq 1 "$HOSTS"); do
  name=$(host_name "$i")
  ip netns add "$name"
  ip link add "veth-$name" type veth peer name eth0 netns "$name"
  ip link set "veth-$name" master "$BRIDGE" up
  ip -n "$name" addr add "$SUBNET.$((10 + i))/24" dev eth0
  ip -n "$name" link set eth0 up
  ip -n "$name" link set lo up
  ip -n "$name" route add default via "$SUBNET.1"
done
allow_bridge

for _ in $(seq 50); do
  if healthy; then
    log "network up: $(ip netns list | grep -o 'tacc-h[0-9]*' | sort | tr '\n' ' ')"
    exit 0
  fi
  sleep 0.1
done
log "the namespaces cannot reach the bridge:"
ip -br addr >&2 || true
exit 1
