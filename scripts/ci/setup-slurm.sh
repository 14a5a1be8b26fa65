#!/usr/bin/env bash
# Start a throw-away Slurm cluster on this machine for TACC's integration tests:
# munged, slurmctld, and SLURM_NODES slurmd "hosts" (default 2), each in its own network
# namespace with its own host name, joined to a private bridge. Idempotent: running it
# again leaves a healthy cluster as it is and repairs a broken one.
#
# Traffic stays on this machine: the bridge and the namespaces it creates use the private
# range 10.250.77.0/24 and nothing routes it anywhere else.
#
# Usage (as root): scripts/ci/setup-slurm.sh        # install + start
#                  scripts/ci/setup-slurm.sh stop   # stop everything it started
set -euo pipefail

NODES=${SLURM_NODES:-2}
BRIDGE=taccbr0
SUBNET=10.250.77
CONF_DIR=/etc/slurm
STATE=/var/lib/tacc-ci-slurm
HOST=$(hostname)

log() { echo "setup-slurm: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1; }

node_name() { echo "tacc-n$1"; }

stop_all() {
  for pidfile in /run/slurmd-tacc-n*.pid /run/slurmctld.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  for i in $(seq 1 8); do
    ip netns del "$(node_name "$i")" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

if [ "${1:-}" = stop ]; then
  stop_all
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it installs packages, creates network namespaces and starts daemons)"
  exit 1
fi

if ! need slurmctld || ! need slurmd || ! need sbatch || ! need munged || ! need nsenter || ! need ip; then
  log "installing slurmctld slurmd slurm-client munge from the distribution"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null
fi

# Docker sets the FORWARD policy to DROP and has bridged traffic pass iptables, which
# cuts the nodes off from each other (srun then fails with "Communication connection
# failure" on every node but the first). Let traffic between our nodes through.
allow_bridge() {
  if need iptables && ip link show "$BRIDGE" >/dev/null 2>&1; then
    iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null \
      || iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
  fi
}

healthy() {
  timeout 5 sinfo -h -o '%n %t' 2>/dev/null | awk '$2 ~ /^(idle|mix|alloc)/ {n++} END {exit !(n >= '"$NODES"')}'
}
allow_bridge
if healthy; then
  log "cluster already up: $(sinfo -h -o '%n' | tr '\n' ' ')"
  exit 0
fi
stop_all

# --- munge (as the munge user, as Debian's package intends)
if [ ! -s /etc/munge/munge.key ]; then
  if need mungekey; then mungekey --create --force; else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! pgrep -u munge -x munged >/dev/null; then
  runuser -u munge -- munged --force
fi
for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done

# --- network: one bridge, one namespace per node
ip link add "$BRIDGE" type bridge
ip addr add "$SUBNET.1/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
mkdir -p /var/run/netns
for i in $(seq 1 "$NODES"); do
  name=$(node_name "$i")
  ip netns add "$name"
  ip link add "veth-$name" type veth peer name eth0 netns "$name"
  ip link set "veth-$name" master "$BRIDGE" up
  ip -n "$name" addr add "$SUBNET.$((10 + i))/24" dev eth0
  ip -n "$name" link set eth0 up
  ip -n "$name" link set lo up
done
allow_bridge

# --- configuration
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / (NODES + 1) ))
mkdir -p "$CONF_DIR" "$STATE/ctld" /var/log/slurm
{
  echo "ClusterName=tacc-ci"
  echo "SlurmctldHost=$HOST($SUBNET.1)"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "StateSaveLocation=$STATE/ctld"
  echo "SlurmdSpoolDir=$STATE/slurmd-%n"
  echo "SlurmdPidFile=/run/slurmd-%n.pid"
  echo "SlurmdLogFile=/var/log/slurm/slurmd-%n.log"
  echo "SlurmctldPidFile=/run/slurmctld.pid"
  echo "SlurmctldLogFile=/var/log/slurm/slurmctld.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SwitchType=switch/none"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "SchedulerType=sched/backfill"
  echo "SchedulerParameters=sched_min_interval=0"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core_Memory"
  echo "DefMemPerCPU=64"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MinJobAge=600"
  echo "KillWait=2"
  echo "OverTimeLimit=0"
  echo "InactiveLimit=0"
  echo "SlurmctldTimeout=30"
  echo "SlurmdTimeout=60"
  echo "MessageTimeout=10"
  echo "SlurmctldDebug=info"
  echo "SlurmdDebug=info"
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=$(node_name "$i") NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$CONF_DIR/slurm.conf"
rm -f "$CONF_DIR/cgroup.conf"   # the defaults work; 22.05 has no CgroupPlugin=disabled

slurmctld
for _ in $(seq 100); do timeout 2 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
for i in $(seq 1 "$NODES"); do
  name=$(node_name "$i")
  mkdir -p "$STATE/slurmd-$name"
  # `ip netns exec` remounts /sys, after which slurmd cannot initialise; nsenter does not.
  if ! nsenter --net="/var/run/netns/$name" unshare -u sh -c "hostname $name; exec slurmd -N $name"; then
    log "slurmd -N $name failed to start:"
    tail -n 20 "/var/log/slurm/slurmd-$name.log" >&2 || true
    exit 1
  fi
done
for _ in $(seq 300); do
  if healthy; then
    log "cluster up: $(sinfo -h -o '%n %t' | tr '\n' ' ')"
    exit 0
  fi
  sleep 0.2
done
log "slurm did not come up; sinfo says:"
sinfo -N >&2 || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log >&2 || true
exit 1
