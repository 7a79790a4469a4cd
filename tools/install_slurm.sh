#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for tests/slurm and for trying slurm/train.sh.
#
#   tools/install_slurm.sh          install (if missing), configure, start; idempotent
#   tools/install_slurm.sh --stop   stop slurmd, slurmctld and munged
#
# Installs Debian's slurm-wlm, munge and libpmix-dev with apt when missing, writes a munge key
# and a slurm.conf (one node: this machine; one partition: debug), starts munged, slurmctld and
# slurmd as plain daemons (no systemd needed) and waits until `sinfo` shows the node idle. A second run with the
# daemons up and the config unchanged does nothing. Needs root.
#
# Settings (environment):
#   HPCMARL_SLURM_ETC    folder of slurm.conf (default /etc/slurm, where every Slurm command
#                        looks); elsewhere, export SLURM_CONF=$HPCMARL_SLURM_ETC/slurm.conf too
#   HPCMARL_SLURM_STATE  state, spool and log folder (default /var/lib/hpcmarl-slurm)
#   HPCMARL_SLURM_WAIT   seconds to wait for the node to become idle (default 60)
set -euo pipefail

ETC=${HPCMARL_SLURM_ETC:-/etc/slurm}
STATE=${HPCMARL_SLURM_STATE:-/var/lib/hpcmarl-slurm}
WAIT=${HPCMARL_SLURM_WAIT:-60}
CONF=$ETC/slurm.conf
export SLURM_CONF=$CONF

say() { echo "install_slurm: $*"; }
die() { echo "install_slurm: error: $*" >&2; exit 1; }

# This cluster's daemons are found by their pid files, never by name: tools/cluster_slurm.sh runs
# a Slurm of its own (slurmctld, munged, a slurmd per host of tools/local_cluster.sh) beside it.
pid_of() {
  local file pid
  case "$1" in
    munged) file=/run/munge/munged.pid ;;
    *) file=$STATE/$1.pid ;;
  esac
  pid=$(cat "$file" 2>/dev/null || true)
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
}

running() { [ -n "$(pid_of "$1")" ]; }

stop_all() {
  local name pid
  for name in slurmd slurmctld munged; do
    pid=$(pid_of "$name") && kill "$pid" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    running slurmd || running slurmctld || running munged || { say "stopped"; return 0; }
    sleep 0.2
  done
  die "slurmd, slurmctld or munged still running after 10 s"
}

# slurm-wlm and munge; libpmix-dev lets `srun --mpi=pmix` start MPI ranks (HPCMARL_LAUNCHER=srun).
PACKAGES=(slurm-wlm munge libpmix-dev)

install_packages() {
  local missing=() pkg
  if command -v dpkg >/dev/null; then
    for pkg in "${PACKAGES[@]}"; do
      dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
  elif ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    missing=("${PACKAGES[@]}")
  fi
  [ "${#missing[@]}" -gt 0 ] || return 0
  command -v apt-get >/dev/null || die "${missing[*]} not installed and apt-get is unavailable"
  say "installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # Package scripts must not start services (there may be no init system, and no slurm.conf
  # yet): this script starts the daemons itself.
  local policy=/usr/sbin/policy-rc.d ours=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && ours=1
  fi
  local rc=0
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >/dev/null || rc=$?
  [ "$ours" = 0 ] || rm -f "$policy"
  [ "$rc" = 0 ] || die "apt-get install ${missing[*]} failed (exit $rc)"
}

write_munge_key() {
  local key=/etc/munge/munge.key
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  if [ ! -s "$key" ]; then
    say "writing $key"
    dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge "$key" /run/munge /var/lib/munge /var/log/munge
  chmod 0700 /etc/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  chmod 0400 "$key"
}

real_memory_mb() {
  # What slurmd itself reports, so the node is never drained for "Low RealMemory".
  slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1
}

render_conf() {
  local node mem
  node=$(hostname -s)
  mem=$(real_memory_mb)
  [ -n "$mem" ] || mem=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
  cat <<EOF
# Written by tools/install_slurm.sh: a single-node test cluster (this machine).
ClusterName=hpcmarl
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again after cred_expire seconds (default 120).
AuthInfo=cred_expire=10
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Short timeouts: tests wait on these.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=30
Waittime=0
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=$node CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
# OverSubscribe: jobs share cores (tests/slurm runs its three time-limit jobs side by side).
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

start_munged() {
  if running munged && munge -n </dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do
    munge -n </dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "munged does not answer (see /var/log/munge/munged.log)"
}

start_slurm() {
  local changed=$1
  if [ "$changed" = 1 ] && { running slurmctld || running slurmd; }; then
    say "slurm.conf changed: restarting slurmctld and slurmd"
    pkill_exact slurmd
    pkill_exact slurmctld
  fi
  if ! running slurmctld; then
    say "starting slurmctld"
    slurmctld -f "$CONF"
  fi
  if ! running slurmd; then
    say "starting slurmd"
    slurmd -f "$CONF"
  fi
}

pkill_exact() {
  local pid
  pid=$(pid_of "$1") && kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do running "$1" || return 0; sleep 0.2; done
  die "$1 did not stop"
}

wait_idle() {
  local node state deadline=$((SECONDS + WAIT))
  node=$(hostname -s)
  while [ $SECONDS -lt "$deadline" ]; do
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null | head -1 || true)
    case "$state" in
      idle | mixed | allocated | completing) say "node $node is $state"; return 0 ;;
      drain* | down*) scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  die "node $node not idle after ${WAIT}s (sinfo: ${state:-no answer}); see $STATE/log/"
}

main() {
  if [ "${1:-}" = "--stop" ]; then stop_all; return; fi
  [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"
  install_packages
  write_munge_key
  mkdir -p "$ETC" "$STATE/ctld" "$STATE/d" "$STATE/log"
  local new changed=0
  new=$(render_conf)
  if [ ! -f "$CONF" ] || [ "$new" != "$(cat "$CONF")" ]; then
    say "writing $CONF"
    printf '%s\n' "$new" >"$CONF"
    changed=1
  fi
  start_munged
  start_slurm "$changed"
  wait_idle
  [ "$CONF" = /etc/slurm/slurm.conf ] || say "Slurm commands need: export SLURM_CONF=$CONF"
  say "stop with: $0 --stop   (logs: $STATE/log/)"
}

main "$@"
