#!/usr/bin/env bash
# The same job over several seeds, one array task per seed; each task is a slurm/train.sh job
# (checkpoint at the time limit, requeue, resume) with its own run directory
# runs/<job name>-<array job id>_<task id>.
#
#   mkdir -p runs && sbatch slurm/array.sh jobs/cartpole_dqn.yaml [key=value ...]
#
# Submit from the repo root (or set HPCMARL_ROOT); sbatch options override the lines below,
# e.g. `sbatch --array=0-9%4 slurm/array.sh ...` for ten seeds, four at a time.
#
#SBATCH --job-name=hpcmarl
#SBATCH --array=0-2
#SBATCH --ntasks=16
#SBATCH --time=01:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=runs/slurm-%A_%a.out
set -euo pipefail

train=${HPCMARL_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}/slurm/train.sh
if [ ! -f "$train" ]; then
  echo "hpcmarl-slurm: error: $train not found: submit from the repo root or set HPCMARL_ROOT"
  exit 2
fi
exec bash "$train" "$@" "seed=${SLURM_ARRAY_TASK_ID:-0}"
