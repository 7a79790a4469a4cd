#!/usr/bin/env bash
# A cluster of N hosts on this one Linux machine, for tests, CI and trying hpcmarl across nodes.
#
#   tools/local_cluster.sh up N     make hosts hpc1..hpcN (again, if another count is up)
#   tools/local_cluster.sh up N --slurm
#                                   the same, and a real Slurm on them (tools/cluster_slurm.sh):
#                                   slurmctld, and a slurmd per host; added to hosts already up
#   tools/local_cluster.sh down     remove every trace of them (Slurm's daemons and state too)
#   tools/local_cluster.sh status   list the hosts: name, address, holder PID, alive or not
#
# Each host is a network namespace (its own address and network stack) and a UTS namespace (its
# own hostname), held open by one `sleep` per host; the hosts share the filesystem, as nodes
# share a cluster's filesystem. A veth pair per host joins it to a bridge made here, on a private
# test subnet that exists only inside these namespaces (no address on the machine's own
# interfaces, no route out). /etc/hosts names the hosts (Open MPI silently puts every rank on the
# local host when a host name does not resolve); those lines carry a marker, so that `down`
# removes exactly them. `tools/mpirun.sh --hosts N` runs a job across the hosts; processes enter
# a host with `nsenter -t HOLDER_PID -n -u` (tools/cluster_agent.sh).
#
# State (read by tools/cluster_agent.sh and tests/multihost): $HPCMARL_CLUSTER_DIR/hosts, one
# line per host: name, address, holder PID, network namespace. Needs root, `ip` (iproute2),
# `nsenter` and `unshare` (util-linux). `up` twice is fine; `down` with nothing up is fine.
#
# Settings (environment):
#   HPCMARL_CLUSTER_DIR     state folder (default /run/hpcmarl-cluster)
#   HPCMARL_CLUSTER_SUBNET  first three octets of the hosts' /24 (default 10.213.0)
set -euo pipefail

STATE=${HPCMARL_CLUSTER_DIR:-/run/hpcmarl-cluster}
SUBNET=${HPCMARL_CLUSTER_SUBNET:-10.213.0}
HOSTS_FILE=$STATE/hosts
BRIDGE=hpcmarl-br0
NS_PREFIX=hpcmarl-
MARK="# hpcmarl-local-cluster"
SLURM_TOOL=$(dirname "$0")/cluster_slurm.sh

say() { echo "local_cluster: $*"; }
die() {
  echo "local_cluster: error: $*" >&2
  exit 1
}

need_tools() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces): run it with sudo"
  command -v ip >/dev/null || die "ip is missing: apt-get install iproute2"
  command -v nsenter >/dev/null || die "nsenter is missing: apt-get install util-linux"
  command -v unshare >/dev/null || die "unshare is missing: apt-get install util-linux"
  command -v flock >/dev/null || die "flock is missing: apt-get install util-linux"
}

# One lock for up and down, so that two test sessions do not build and tear down at once.
take_lock() {
  mkdir -p "$STATE"
  exec 9>"$STATE/lock"
  flock 9
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# The state file names N hosts, and every holder is alive.
is_up() {
  local n=$1 count=0 name addr pid ns
  [ -s "$HOSTS_FILE" ] || return 1
  while read -r name addr pid ns; do
    alive "$pid" || return 1
    count=$((count + 1))
  done <"$HOSTS_FILE"
  [ "$count" = "$n" ]
}

make_bridge() {
  ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
}

# Host i: its namespace, a veth pair onto the bridge, its address, and its holder.
make_host() {
  local i=$1 name=hpc$1 addr=$SUBNET.$1 ns=${NS_PREFIX}hpc$1 pidfile=$STATE/hpc$1.pid
  ip netns add "$ns"
  ip link add "hpcm-v$i" type veth peer name eth0 netns "$ns"
  ip link set "hpcm-v$i" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  rm -f "$pidfile"
  # The holder writes its own PID (ip netns exec, unshare and bash each exec the next) and does
  # not keep the lock open.
  setsid ip netns exec "$ns" unshare --uts bash -c \
    "hostname $name; echo \$\$ >$pidfile; exec sleep infinity" </dev/null >/dev/null 2>&1 9>&- &
  for _ in $(seq 50); do
    [ -s "$pidfile" ] && break
    sleep 0.1
  done
  [ -s "$pidfile" ] || die "the holder of $name did not start (ip netns exec $ns unshare --uts)"
  echo "$name $addr $(cat "$pidfile") $ns" >>"$HOSTS_FILE"
  rm -f "$pidfile"
}

# /etc/hosts may be a bind mount (containers): rewrite it in place, never rename over it.
hosts_lines_remove() {
  local kept
  kept=$(grep -vF "$MARK" /etc/hosts || true)
  printf '%s\n' "$kept" >/etc/hosts
}

hosts_lines_add() {
  local name addr pid ns
  [ -z "$(tail -c 1 /etc/hosts)" ] || echo >>/etc/hosts # a last line without its newline
  while read -r name addr pid ns; do
    echo "$addr $name $MARK" >>/etc/hosts
  done <"$HOSTS_FILE"
}

# The last host answers the first over the bridge: a reachable host refuses a connection to a
# closed port at once (no ping or listener needed).
wait_reachable() {
  local last first_pid answer
  last=$(tail -n 1 "$HOSTS_FILE" | cut -d' ' -f2)
  first_pid=$(head -n 1 "$HOSTS_FILE" | cut -d' ' -f3)
  for _ in $(seq 20); do
    answer=$(nsenter -t "$first_pid" -n timeout 1 bash -c "exec 3<>/dev/tcp/$last/9" 2>&1 || true)
    [[ "$answer" != *refused* ]] || return 0
    sleep 0.2
  done
  die "host $last does not answer the first host over bridge $BRIDGE"
}

up() {
  local n=${1:-} slurm=${2:-}
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "up needs a host count from 1 to 99: up 2"
  [[ "$slurm" =~ ^(|--slurm)$ ]] || die "unknown option $slurm: up N or up N --slurm"
  need_tools
  take_lock
  if is_up "$n"; then
    say "$n hosts are up already"
    [ -z "$slurm" ] || bash "$SLURM_TOOL" up
    show
    return
  fi
  tear_down
  make_bridge
  : >"$HOSTS_FILE"
  for i in $(seq "$n"); do
    make_host "$i"
  done
  hosts_lines_add
  wait_reachable
  say "$n hosts up on $SUBNET.0/24 (bridge $BRIDGE)"
  [ -z "$slurm" ] || bash "$SLURM_TOOL" up
  show
}

# Everything `up` may have made, found by name as well as from the state file, so that a lost or
# stale state file leaves nothing behind: every process in our namespaces (holders, and ranks
# left over), the namespaces (their veth ends go with them), the bridge, the /etc/hosts lines.
tear_down() {
  local ns pid link killed=()
  [ ! -d "$STATE/slurm" ] || bash "$SLURM_TOOL" down
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
    killed+=($(ip netns pids "$ns" 2>/dev/null || true))
  done
  [ ! -s "$HOSTS_FILE" ] || killed+=($(cut -d' ' -f3 "$HOSTS_FILE"))
  for pid in "${killed[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
  done
  for pid in "${killed[@]}"; do # gone, not just signalled, when down returns
    for _ in $(seq 50); do
      alive "$pid" || break
      sleep 0.1
    done
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
    grep -E "^(hpcm-v[0-9]+|$BRIDGE)$" || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  ! grep -qF "$MARK" /etc/hosts 2>/dev/null || hosts_lines_remove
  rm -f "$HOSTS_FILE" "$STATE"/hpc*.pid
}

down() {
  need_tools
  take_lock
  tear_down
  rm -rf "$STATE"
  say "down"
}

# Exit status 0 when hosts are up and every holder is alive.
show() {
  local name addr pid ns state bad=0
  if [ ! -s "$HOSTS_FILE" ]; then
    say "no local cluster is up (tools/local_cluster.sh up 2)"
    return 1
  fi
  printf '%-8s %-14s %-8s %s\n' host address holder state
  while read -r name addr pid ns; do
    state=alive
    alive "$pid" || {
      state=dead
      bad=1
    }
    printf '%-8s %-14s %-8s %s\n' "$name" "$addr" "$pid" "$state"
  done <"$HOSTS_FILE"
  [ ! -d "$STATE/slurm" ] || bash "$SLURM_TOOL" status || true # the hosts' status only
  return "$bad"
}

case "${1:-}" in
  up) up "${2:-}" "${3:-}" ;;
  down) down ;;
  status) show ;;
  *) die "usage: tools/local_cluster.sh up N [--slurm] | down | status" ;;
esac
