#!/usr/bin/env bash
# hpcmarl as a Slurm batch job that checkpoints before its time limit and requeues itself.
#
#   mkdir -p runs && sbatch slurm/train.sh jobs/cartpole_dqn.yaml [key=value ...]
#   sbatch --nodes=4 --ntasks-per-node=32 --ntasks=128 slurm/train.sh jobs/default.yaml
#
# Edit the #SBATCH lines below for your site, or override any of them on the command line
# (`sbatch --ntasks=32 --time=08:00:00 slurm/train.sh ...`). With --ntasks-per-node give --ntasks
# too: the --ntasks=16 below would stay and make it a maximum (Slurm then refuses --nodes=2
# --ntasks-per-node=4). Slurm does not create the folder of --output: submit from the repo root
# after `mkdir -p runs`. See slurm/README.md (many nodes, GPUs, a site MPI).
#
#SBATCH --job-name=hpcmarl
#SBATCH --ntasks=16
#SBATCH --time=01:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=runs/slurm-%j.out
#
# Settings (environment, passed through by sbatch):
#   HPCMARL_LAUNCHER      mpirun (default: the repo's tools/mpirun.sh, else mpirun on PATH)
#                         or srun (srun --mpi=$HPCMARL_SRUN_MPI, default pmix: a site MPI)
#   HPCMARL_PYTHON        the python running hpcmarl (default: <repo>/.venv/bin/python)
#   HPCMARL_RUN_DIR       the run directory (default: runs/<job name>-<job id>, the same across
#                         requeues, so a requeued job resumes from its own checkpoint)
#   HPCMARL_MAX_REQUEUES  requeues allowed after a checkpoint at the time limit (default 10)
#   HPCMARL_ROOT          the repo (default: found from this script's submitted path)
#   HPCMARL_SIGNAL_FILE   where this script writes down Slurm's warning for the commander
#                         (default: <run directory>/.slurm-signal)
#   HPCMARL_SIGNAL_LEAD_S seconds between Slurm's warning and the time limit (default: read from
#                         this script's #SBATCH --signal line; set it when you override that on
#                         the command line): hpcmarl warns at start-up when a checkpoint of its
#                         tables would not fit in them, naming the lead it needs
#
# What happens: the launcher runs in the background; Slurm's USR1 (`--signal=B:USR1@120`, which
# reaches only this shell) or a TERM to this shell is written into HPCMARL_SIGNAL_FILE, which
# the commander reads within a second; every rank then checkpoints and exits with 75, and this
# script requeues the job, which resumes from the checkpoint in the same run directory. Exit 0
# from the launcher is a finished run; 76 a run that lost a rank it needs under
# runtime.fault_tolerance=collectors (a failed node): requeued the same way, within
# HPCMARL_MAX_REQUEUES; any other code is a crash: no requeue.
set -uo pipefail

EXIT_CHECKPOINTED=75
EXIT_RANK_LOST=76 # runtime.fault_tolerance=collectors lost a learner, shard, server or commander

# Site modules (a site MPI with HPCMARL_LAUNCHER=srun, CUDA) load here, before the launcher:
#   source /etc/profile.d/modules.sh   # when the batch shell lacks the module function
#   module load openmpi cuda

say() { echo "hpcmarl-slurm: $*"; }

# The repo: sbatch runs a copy of this script from Slurm's spool, so $0 is not in the repo there.
# Arguments: the script's own.
find_root() {
  local here cmd
  if [ -n "${HPCMARL_ROOT:-}" ]; then echo "$HPCMARL_ROOT"; return; fi
  here=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd)
  if [ -n "$here" ] && [ -f "$here/slurm/train.sh" ]; then echo "$here"; return; fi
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    # Command= is the submitted script's path, then its arguments (this script's "$@").
    cmd=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=//p')
    [ $# = 0 ] || cmd=${cmd% "$*"}
    here=$(cd "$(dirname "$cmd")/.." 2>/dev/null && pwd)
    if [ -n "$cmd" ] && [ -f "$here/slurm/train.sh" ]; then echo "$here"; return; fi
  fi
  echo "${SLURM_SUBMIT_DIR:-$PWD}"
}

default_run_dir() {
  local id=${SLURM_JOB_ID:-$$}
  [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && id=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
  echo "runs/${SLURM_JOB_NAME:-hpcmarl}-$id"
}

# Fills the array LAUNCH with the launcher command and its arguments.
launcher_command() {
  local ntasks=${SLURM_NTASKS:-1}
  case "${HPCMARL_LAUNCHER:-mpirun}" in
    mpirun)
      if [ -f "$ROOT/tools/mpirun.sh" ]; then
        LAUNCH=(bash "$ROOT/tools/mpirun.sh" -n "$ntasks")
      else
        LAUNCH=(mpirun -n "$ntasks")
      fi ;;
    srun) LAUNCH=(srun --mpi="${HPCMARL_SRUN_MPI:-pmix}" -n "$ntasks") ;;
    *) say "error: HPCMARL_LAUNCHER=${HPCMARL_LAUNCHER} is not mpirun or srun"; exit 2 ;;
  esac
}

# Both signals become a line in the signal file, not a signal to the launcher: Open MPI's
# mpirun ends the ranks at once on TERM, with no checkpoint, and a USR1 relayed while the ranks
# start up kills one that has no handler yet, or is dropped before they exist (seen on a loaded
# node: the warning was lost and the job died at its limit).
forward() {
  INTERRUPTED=1
  mkdir -p "$(dirname "$SIGNAL_FILE")" && echo "SIG$1" >"$SIGNAL_FILE.tmp" &&
    mv -f "$SIGNAL_FILE.tmp" "$SIGNAL_FILE"
  say "got SIG$1: asking every rank to checkpoint (written to $SIGNAL_FILE)"
}

# Runs the launcher in the background and waits for it, again after each trapped signal.
run_launcher() {
  local rc again
  INTERRUPTED=0 LAUNCHER_PID=""
  trap 'forward USR1' USR1
  trap 'forward TERM' TERM
  "$@" &
  LAUNCHER_PID=$!
  wait "$LAUNCHER_PID"
  rc=$?
  while [ "$INTERRUPTED" = 1 ]; do
    INTERRUPTED=0
    wait "$LAUNCHER_PID"
    again=$?
    [ "$again" = 127 ] || rc=$again # 127: already collected by the previous wait
  done
  trap - USR1 TERM
  return "$rc"
}

# One line per outcome; requeues when the run checkpointed at the time limit.
conclude() {
  local rc=$1 restarts=${SLURM_RESTART_COUNT:-0} max=${HPCMARL_MAX_REQUEUES:-10}
  case "$rc" in
    0) say "finished (exit 0); run directory $RUN_DIR"; exit 0 ;;
    "$EXIT_CHECKPOINTED")
      if [ -n "${SLURM_JOB_ID:-}" ] && [ "$restarts" -lt "$max" ]; then
        say "checkpointed at the time limit: requeueing job $SLURM_JOB_ID" \
          "(restart $((restarts + 1)) of $max); it resumes from $RUN_DIR"
        scontrol requeue "$SLURM_JOB_ID" || { say "error: scontrol requeue failed"; exit "$rc"; }
        exit 0
      fi
      if [ -z "${SLURM_JOB_ID:-}" ]; then
        say "checkpointed (exit 75), not under Slurm: resume with python -m hpcmarl resume $RUN_DIR"
      else
        say "checkpointed, but not requeued: $restarts of $max requeues spent" \
          "(HPCMARL_MAX_REQUEUES); continue with HPCMARL_RUN_DIR=$RUN_DIR sbatch slurm/train.sh ..."
      fi
      exit "$rc" ;;
    "$EXIT_RANK_LOST")
      if [ -n "${SLURM_JOB_ID:-}" ] && [ "$restarts" -lt "$max" ]; then
        say "lost a rank it cannot go on without (exit 76): requeueing job $SLURM_JOB_ID" \
          "(restart $((restarts + 1)) of $max); it resumes from the newest checkpoint in $RUN_DIR"
        scontrol requeue "$SLURM_JOB_ID" || { say "error: scontrol requeue failed"; exit "$rc"; }
        exit 0
      fi
      say "lost a rank (exit 76), not requeued ($restarts of $max requeues spent, or not" \
        "under Slurm): resume with python -m hpcmarl resume $RUN_DIR"
      exit "$rc" ;;
    *) say "crashed (exit $rc): not requeued; see the lines above and $RUN_DIR/logs/"; exit "$rc" ;;
  esac
}

# A first start (restart 0) whose default run directory exists belongs to another job that had
# the same id (a reinstalled test cluster restarts ids): resuming it would be silently wrong.
refuse_stale_run_dir() {
  [ -z "${HPCMARL_RUN_DIR:-}" ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ] && [ -e "$RUN_DIR" ] || return 0
  say "error: $RUN_DIR already exists from an earlier job with this id; move it away, or set" \
    "HPCMARL_RUN_DIR=$RUN_DIR to continue that run on purpose"
  exit 2
}

# The seconds of warning this script's own #SBATCH --signal line asks for.
own_signal_lead() { sed -n 's/^#SBATCH --signal=[^@]*@\([0-9][0-9]*\).*/\1/p' "$0" | head -n 1; }

main() {
  ROOT=$(find_root "$@")
  RUN_DIR=${HPCMARL_RUN_DIR:-$(default_run_dir)}
  refuse_stale_run_dir
  local py=${HPCMARL_PYTHON:-$ROOT/.venv/bin/python} threads=${SLURM_CPUS_PER_TASK:-1}
  if ! command -v "$py" >/dev/null; then
    say "error: no python at $py: set HPCMARL_PYTHON, or HPCMARL_ROOT to the repo"
    exit 2
  fi
  export OMP_NUM_THREADS=$threads PYTHONUNBUFFERED=1
  export HPCMARL_SIGNAL_LEAD_S=${HPCMARL_SIGNAL_LEAD_S:-$(own_signal_lead)}
  # A requeued job starts with no warning pending: the last allocation's was acted on.
  export HPCMARL_SIGNAL_FILE=${HPCMARL_SIGNAL_FILE:-$RUN_DIR/.slurm-signal}
  SIGNAL_FILE=$HPCMARL_SIGNAL_FILE
  rm -f "$SIGNAL_FILE"
  launcher_command
  say "job ${SLURM_JOB_ID:-none} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-$(hostname)}:" \
    "${LAUNCH[*]} $py -m hpcmarl $* runtime.run_dir=$RUN_DIR runtime.torch_threads=$threads"
  run_launcher "${LAUNCH[@]}" "$py" -m hpcmarl "$@" \
    "runtime.run_dir=$RUN_DIR" "runtime.torch_threads=$threads"
  conclude $?
}

main "$@"
