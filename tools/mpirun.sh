#!/usr/bin/env bash
# The virtualenv's mpirun with what a workstation needs: Open MPI refuses to run as root unless
# told it may, and refuses more ranks than cores unless allowed to oversubscribe.
#
# Signals: Open MPI's mpirun ends the ranks at once on TERM, INT (Ctrl-C) and HUP (a dropped
# ssh session), with no checkpoint. So this script stays mpirun's parent, runs it in a process
# group of its own (a terminal's Ctrl-C reaches this script only) and turns each of those
# signals into a request to checkpoint and stop: it writes the signal's name into
# HPCMARL_SIGNAL_FILE (set here unless the caller, e.g. slurm/train.sh, set it), which the
# commander reads within a second, also during start-up; if the file is still unread after
# RELAY_AFTER_S seconds (the commander on another host, where the file is not), it sends
# SIGUSR2, which mpirun forwards to every rank. USR1 and USR2 sent to this script go to mpirun,
# which forwards them. A second signal of the same kind is relayed again; KILL this script's
# process group and mpirun's to end the job without a checkpoint.
#
# A rank killed by a signal (kill -9, the OOM killer, a segfault): mpirun ends every other rank
# at once, so no rank is left to print hpcmarl's failure line. mpirun's stderr therefore passes
# through hpcmarl/launch/lost_rank.py, which forwards it unchanged as it comes and notes Open
# MPI's "process rank N ... exited on signal S"; when mpirun fails, this script prints the line
# it makes of that and of the rank map rank 0 wrote at start (HPCMARL_RANK_MAP: each rank's host
# and roles): "hpcmarl: failed: rank 5 (collector1) on host hpc2, pid 1234: killed by signal 9".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --hosts ]; then
  # Across the hosts of tools/local_cluster.sh: this script again, inside the first host.
  shift
  exec bash "$root/tools/cluster_mpirun.sh" "$@"
fi
# .venv-mpich for the MPICH wheel (tools/setup.sh --mpi mpich); .venv-site for a site MPI, whose
# bin/mpirun tools/setup.sh --mpi site points at the launcher of the MPI that built its mpi4py.
venv=${HPCMARL_VENV:-$root/.venv}
python="$venv/bin/python"
[ -x "$python" ] || python=$(command -v python3 || true)

# Whether the hpcmarl job of this command line asks for fault tolerance: resolved by hpcmarl's
# own loader (hpcmarl/launch/launcher_options.py), asked only when an argument or a job file
# mentions the key, so that other starts pay nothing.
wants_fault_tolerance() {
  [[ " $* " == *" -m hpcmarl "* ]] && [ -n "$python" ] || return 1
  local arg mentioned=false
  for arg in "$@"; do
    case $arg in
      *fault_tolerance=*) mentioned=true ;;
      *.yaml | *.yml) ! grep -qs fault_tolerance "$arg" || mentioned=true ;;
      *) [ ! -f "$arg/config.yaml" ] || ! grep -qs "fault_tolerance: collectors" "$arg/config.yaml" \
        || mentioned=true ;;
    esac
  done
  $mentioned && [ "$("$python" "$root/hpcmarl/launch/launcher_options.py" fault-tolerance "$@" \
    2>/dev/null)" = collectors ]
}
mpirun="$venv/bin/mpirun"
[ -x "$mpirun" ] || mpirun=$(command -v mpirun)
extra=()
if "$mpirun" --version 2>&1 | grep -q "Open MPI"; then
  extra+=(--oversubscribe)
  # In a Slurm job on several nodes, ranks in blocks as Slurm's slots lay them out
  # (SLURM_TASKS_PER_NODE): --oversubscribe alone mapped by core and put every rank of
  # `sbatch --nodes=2 --ntasks-per-node=2` on the first node (Open MPI 5.0.11).
  if [ "${SLURM_JOB_NUM_NODES:-1}" != 1 ] && [[ " $* " != *" --map-by"* ]]; then
    extra+=(--map-by slot)
  fi
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  # A job with runtime.fault_tolerance=collectors (in its job file, a resumed run's job or on
  # the command line; or HPCMARL_FAULT_TOLERANCE=collectors): Open MPI's fault tolerance, so
  # that a collector's rank may die without ending the job.
  if [ "${HPCMARL_FAULT_TOLERANCE:-}" = collectors ] || wants_fault_tolerance "$@"; then
    extra+=(--with-ft ulfm)
  fi
fi
export PATH="$venv/bin:$PATH"

RELAY_AFTER_S=2
own_signal_file=""
if [ -z "${HPCMARL_SIGNAL_FILE:-}" ]; then
  own_signal_file=$(mktemp -u "${TMPDIR:-/tmp}/hpcmarl-signal.XXXXXXXX")
  export HPCMARL_SIGNAL_FILE=$own_signal_file
fi

# TERM, INT or HUP: ask the commander to checkpoint and stop (see the top of this file).
relay_stop() {
  echo "hpcmarl-mpirun: got SIG$1: asking the job to checkpoint and stop" >&2
  echo "SIG$1" >"$HPCMARL_SIGNAL_FILE.tmp" && mv -f "$HPCMARL_SIGNAL_FILE.tmp" "$HPCMARL_SIGNAL_FILE"
  relay_at=$((SECONDS + RELAY_AFTER_S))
}

# USR1 / USR2: mpirun forwards them to every rank.
relay_as_is() { kill -"$1" "$pid" 2>/dev/null || true; }

# mpirun's stderr through the watch (above), with the rank map beside its report; no watch
# where there is no python, no temporary folder or no FIFO: then mpirun writes to stderr.
watch_dir=$(mktemp -d "${TMPDIR:-/tmp}/hpcmarl-mpirun.XXXXXXXX" 2>/dev/null || true)
stderr_fifo=""
if [ -n "$python" ] && [ -n "$watch_dir" ] && mkfifo "$watch_dir/stderr" 2>/dev/null; then
  stderr_fifo="$watch_dir/stderr"
  export HPCMARL_RANK_MAP="$watch_dir/ranks"
fi
stdin_is_tty=false
[ ! -t 0 ] || stdin_is_tty=true

# mpirun in place of this (background) shell, so that $! is mpirun: stdin from /dev/null
# rather than a terminal, stderr into the watch.
exec_mpirun() {
  ! $stdin_is_tty || exec </dev/null
  [ -z "$stderr_fifo" ] || exec 2>"$stderr_fifo"
  exec "$mpirun" "${extra[@]}" "$@"
}

# After mpirun: the watch has its stderr to the end (bounded: a daemon may keep it open), then
# a failed job gets its line. Prints nothing when a rank printed its own failure line.
report_lost_rank() {
  [ -n "$watcher" ] || return 0
  local until=$((SECONDS + 5))
  while kill -0 "$watcher" 2>/dev/null && [ "$SECONDS" -lt "$until" ]; do sleep 0.1; done
  [ "$1" = 0 ] || "$python" "$root/hpcmarl/launch/lost_rank.py" report "$watch_dir/report" \
    "$1" "$([ ${#extra[@]} = 0 ] && echo other || echo open-mpi)" || true
}

finish() {
  [ -z "$own_signal_file" ] || rm -f "$own_signal_file" "$own_signal_file.tmp"
  [ -z "$watch_dir" ] || rm -rf "$watch_dir"
}

relay_at=""
trap 'relay_stop TERM' TERM
trap 'relay_stop INT' INT
trap 'relay_stop HUP' HUP
trap 'relay_as_is USR1' USR1
trap 'relay_as_is USR2' USR2
trap finish EXIT
set -m # mpirun's own process group: signals to this script's group do not reach it
watcher=""
if [ -n "$stderr_fifo" ]; then # in a process group of its own too: Ctrl-C must not end it
  "$python" "$root/hpcmarl/launch/lost_rank.py" watch "$watch_dir/report" <"$stderr_fifo" &
  watcher=$!
fi
exec_mpirun "$@" &
pid=$!
set +m
# Fault tolerance on: a rank lost before MPI is up everywhere would leave the others waiting in
# MPI_Init for good; hpcmarl/launch/start_watch.py ends the job then (this host's ranks). Only
# an hpcmarl job writes the rank map that tells the watch MPI is up: another program's losses
# (tools/bench_respawn.py's, on purpose) are its own to handle.
start_watch=""
if [[ " ${extra[*]} " == *" --with-ft ulfm "* ]] && [ -n "${HPCMARL_RANK_MAP:-}" ] \
  && [[ " $* " == *" -m hpcmarl "* ]]; then
  "$python" "$root/hpcmarl/launch/start_watch.py" "$pid" "$HPCMARL_RANK_MAP" \
    "$watch_dir/lost-at-start" &
  start_watch=$!
fi
rc=""
while [ -z "$rc" ]; do
  if [ -n "$relay_at" ] && [ "$SECONDS" -ge "$relay_at" ]; then
    relay_at=""
    [ ! -e "$HPCMARL_SIGNAL_FILE" ] || relay_as_is USR2
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
  else
    sleep 0.2 &
    wait $! || true
  fi
done
[ -z "$start_watch" ] || kill "$start_watch" 2>/dev/null || true
if [ -n "$start_watch" ] && [ -e "$watch_dir/lost-at-start" ]; then
  rc=76 # start_watch.py named the rank; requeued like any lost rank
else
  report_lost_rank "$rc"
fi
exit "$rc"
