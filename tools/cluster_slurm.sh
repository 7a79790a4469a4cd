#!/usr/bin/env bash
# A real multi-node Slurm on the hosts of tools/local_cluster.sh (`local_cluster.sh up N --slurm`
# calls it with `up`; `local_cluster.sh down` with `down`; `local_cluster.sh status` with `status`).
#
#   export SLURM_CONF=/run/hpcmarl-cluster/slurm/slurm.conf
#   sbatch --nodes=2 --ntasks-per-node=4 slurm/train.sh jobs/default.yaml
#
# As on a cluster: one slurmctld on a head node, one slurmd per host with NodeName = the host's
# name, each inside its host's network and UTS namespaces; a job's steps run on the hosts and
# talk across the bridge. The head node is this machine's own namespace, reached by the hosts at
# an address on the bridge (the subnet's .254): so `sbatch`, `squeue` and `scontrol` work from
# this machine's shell, as from a login node. The hosts share the filesystem, as nodes share a
# cluster's.
#
# It leaves a single-node Slurm on this machine (tools/install_slurm.sh: /etc/slurm, ports
# 6817-6818, /run/munge) alone: its own config, ports, munged (own key and socket), state, spool
# and logs, all under $HPCMARL_CLUSTER_DIR/slurm, and its daemons are found by their pid files
# only. Commands reach it through SLURM_CONF; without it they reach the single-node Slurm.
#
# Settings (environment):
#   HPCMARL_CLUSTER_DIR         the cluster's state folder (default /run/hpcmarl-cluster)
#   HPCMARL_CLUSTER_SUBNET      the hosts' /24 (default 10.213.0); the head node is .254
#   HPCMARL_CLUSTER_SLURM_PORT  slurmctld's port; slurmd's is the next (default 6917)
#   HPCMARL_CLUSTER_SLURM_CPUS  CPUs each node offers (default 8; more than the machine has:
#                               ranks oversubscribe its cores, as tools/mpirun.sh lets them)
#   HPCMARL_CLUSTER_SLURM_WAIT  seconds to wait for every node to be idle (default 60)
set -euo pipefail

STATE=${HPCMARL_CLUSTER_DIR:-/run/hpcmarl-cluster}
SUBNET=${HPCMARL_CLUSTER_SUBNET:-10.213.0}
PORT=${HPCMARL_CLUSTER_SLURM_PORT:-6917}
CPUS=${HPCMARL_CLUSTER_SLURM_CPUS:-8}
WAIT=${HPCMARL_CLUSTER_SLURM_WAIT:-60}
HOSTS_FILE=$STATE/hosts
BRIDGE=hpcmarl-br0
HEAD_ADDR=$SUBNET.254
DIR=$STATE/slurm
CONF=$DIR/slurm.conf
MUNGE=$DIR/munge
SOCKET=$MUNGE/munge.socket
export SLURM_CONF=$CONF

say() { echo "local_cluster: slurm: $*"; }
die() {
  echo "local_cluster: slurm: error: $*" >&2
  exit 1
}

# The daemon a pid file names is alive: its process runs that program (not a reused pid).
alive_pidfile() {
  local pid program
  pid=$(cat "$1" 2>/dev/null || true)
  case "$1" in
    */munged.pid) program=munged ;;
    */slurmctld.pid) program=slurmctld ;;
    *) program=slurmd ;;
  esac
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$program" ]
}

need_slurm() {
  local tool
  for tool in slurmctld slurmd munged sinfo; do
    command -v "$tool" >/dev/null ||
      die "$tool is missing: apt-get install slurm-wlm munge (or run tools/install_slurm.sh)"
  done
  [ -s "$HOSTS_FILE" ] || die "no local cluster is up: tools/local_cluster.sh up 2 --slurm"
}

render_conf() {
  local name addr pid ns nodes=()
  cat <<EOF
# Written by tools/cluster_slurm.sh: a Slurm across the hosts of tools/local_cluster.sh.
# Commands use it with: export SLURM_CONF=$CONF
ClusterName=hpcmarl-local
SlurmctldHost=$(hostname)($HEAD_ADDR)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Its own munged; a requeued job may start again after cred_expire seconds (default 120).
AuthInfo=socket=$SOCKET,cred_expire=5
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Each node offers CPUs=$CPUS whatever the machine has (the hosts share its cores).
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/node/%n
# Node-local temporary files (srun --mpi=pmix makes spmix_appdir_* there): /tmp is shared here.
TmpFS=$DIR/node/%n/tmp
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/node/%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=30
Waittime=0
EOF
  while read -r name addr pid ns; do
    echo "NodeName=$name NodeAddr=$addr CPUs=$CPUS State=UNKNOWN"
    nodes+=("$name")
  done <"$HOSTS_FILE"
  local list
  list=$(IFS=,; echo "${nodes[*]}")
  echo "PartitionName=hosts Nodes=$list Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
}

# Every daemon's pid file: munged, slurmctld, one slurmd per host.
pid_files() {
  local name rest
  echo "$MUNGE/munged.pid"
  echo "$DIR/slurmctld.pid"
  [ ! -s "$HOSTS_FILE" ] || while read -r name rest; do echo "$DIR/node/$name.pid"; done <"$HOSTS_FILE"
}

# Runs a daemon that forks into the background: its stdio into a file (a caller capturing this
# script's output would otherwise wait for the daemon's end), never the cluster's lock (fd 9).
start() {
  local what=$1 out=$DIR/log/$1.out
  shift
  "$@" </dev/null >"$out" 2>&1 9>&- || die "$what did not start: $(tail -n 3 "$out") (logs: $DIR/log/)"
}

# Stops the daemons of ours that are alive (slurmds first, munged last), each by its pid file;
# also the slurmd of a host that the hosts file no longer lists.
stop_daemons() {
  local file pid pids=()
  for file in "$DIR"/node/*.pid "$DIR/slurmctld.pid" "$MUNGE/munged.pid"; do
    alive_pidfile "$file" || continue
    pid=$(cat "$file")
    kill "$pid" 2>/dev/null || true
    pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || continue 2
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
  done
}

start_munged() {
  alive_pidfile "$MUNGE/munged.pid" && return 0
  mkdir -p "$MUNGE" && chmod 0755 "$MUNGE" # munged wants its socket's folder open to all
  mkdir -p "$MUNGE/private" && chmod 0700 "$MUNGE/private"
  [ -s "$MUNGE/private/munge.key" ] ||
    dd if=/dev/urandom of="$MUNGE/private/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$MUNGE/private/munge.key"
  say "starting munged ($SOCKET)"
  start munged munged --socket="$SOCKET" --key-file="$MUNGE/private/munge.key" \
    --pid-file="$MUNGE/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$MUNGE/private/munged.seed"
}

start_slurmctld() {
  alive_pidfile "$DIR/slurmctld.pid" && return 0
  # The head node's address on the bridge: the hosts' slurmds and job steps reach it there.
  ip addr replace "$HEAD_ADDR/24" dev "$BRIDGE"
  say "starting slurmctld on $(hostname) ($HEAD_ADDR:$PORT)"
  start slurmctld slurmctld -f "$CONF"
}

start_slurmds() {
  local name addr pid ns
  while read -r name addr pid ns; do
    alive_pidfile "$DIR/node/$name.pid" && continue
    mkdir -p "$DIR/node/$name/tmp" # its TmpFS: node-local, as /tmp is on a cluster's nodes
    say "starting slurmd on $name ($addr:$((PORT + 1)))"
    start "slurmd-$name" nsenter -t "$pid" -n -u -- slurmd -f "$CONF" -N "$name"
  done <"$HOSTS_FILE"
}

# Every node idle (or busy with jobs); a node left down by an earlier run is resumed.
wait_idle() {
  local deadline=$((SECONDS + WAIT)) states name state
  while [ $SECONDS -lt "$deadline" ]; do
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null || true)
    if [ -n "$states" ] && ! grep -qvE ' (idle|mixed|allocated|completing)$' <<<"$states"; then
      say "nodes: $(tr '\n' ' ' <<<"$states")"
      return 0
    fi
    while read -r name state; do
      case "$state" in
        drain* | down*) scontrol update nodename="$name" state=resume 2>/dev/null || true ;;
      esac
    done <<<"$states"
    sleep 1
  done
  die "nodes not idle after ${WAIT}s (sinfo: ${states:-no answer}); see $DIR/log/"
}

up() {
  need_slurm
  mkdir -p "$DIR/ctld" "$DIR/node" "$DIR/log"
  local new
  new=$(render_conf)
  if [ ! -f "$CONF" ] || [ "$new" != "$(cat "$CONF")" ]; then
    stop_daemons # a changed config (other hosts): start again from it
    printf '%s\n' "$new" >"$CONF"
  fi
  start_munged
  start_slurmctld
  start_slurmds
  wait_idle
  say "up: export SLURM_CONF=$CONF"
}

# Stops every daemon and removes the whole Slurm state folder (jobs, spool, logs, key).
down() {
  stop_daemons
  ip addr del "$HEAD_ADDR/24" dev "$BRIDGE" 2>/dev/null || true
  rm -rf "$DIR"
}

# Exit status 0 when every daemon is alive; 1 when none is; 2 when some are (a broken cluster).
status() {
  local file up=0 total=0
  [ -d "$DIR" ] || return 1
  for file in $(pid_files); do
    total=$((total + 1))
    ! alive_pidfile "$file" || up=$((up + 1))
  done
  if [ "$up" = "$total" ]; then
    say "up ($((total - 2)) slurmd): export SLURM_CONF=$CONF"
    return 0
  fi
  say "$up of $total daemons alive (munged, slurmctld, a slurmd per host): up N --slurm again"
  [ "$up" = 0 ] && return 1
  return 2
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: tools/cluster_slurm.sh up | down | status (local_cluster.sh calls it)" ;;
esac
