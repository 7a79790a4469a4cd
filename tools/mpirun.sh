#!/usr/bin/env bash
# The virtualenv's mpirun with what a workstation needs: Open MPI refuses to run as root unless
# told it may, and refuses more ranks than cores unless allowed to oversubscribe.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${HPCMARL_VENV:-$root/.venv}   # .venv-mpich for MPICH (tools/setup.sh --mpi mpich)
mpirun="$venv/bin/mpirun"
[ -x "$mpirun" ] || mpirun=$(command -v mpirun)
extra=()
if "$mpirun" --version 2>&1 | grep -q "Open MPI"; then
  extra+=(--oversubscribe)
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
fi
export PATH="$venv/bin:$PATH"
exec "$mpirun" "${extra[@]}" "$@"
