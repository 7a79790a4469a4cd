#!/usr/bin/env bash
# What the whole test suite needs beyond .venv, so that `make test` on a fresh machine skips
# nothing: Debian's hdf5-tools (the h5dump checks that checkpoints stay readable by HDF5 1.10
# tools), iproute2 (`ip netns`, for the hosts of tests/multihost), a real single-node Slurm
# (tests/slurm, via tools/install_slurm.sh) and Horovod built against torch (tests of
# learner.allreduce=horovod, via tools/install_horovod.sh, a cached wheel after the first build).
# Every step is idempotent and quick once done.
#
# apt and the Slurm daemons need root: without it, each missing piece is named with the
# command that installs it, and the tests that need it skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "hpcmarl: setup_tests: $*"; }
root=false
[ "$(id -u)" = 0 ] && root=true

if ! command -v h5dump >/dev/null 2>&1; then
  if $root; then
    say "installing Debian's hdf5-tools (h5dump)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hdf5-tools >/dev/null
  else
    say "h5dump is missing (its checks will skip): sudo apt-get install hdf5-tools"
  fi
fi

if ! command -v ip >/dev/null 2>&1; then # tests/multihost: tools/local_cluster.sh's namespaces
  if $root; then
    say "installing Debian's iproute2 (ip netns, for tests/multihost)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
  else
    say "ip is missing (tests/multihost will skip): sudo apt-get install iproute2"
  fi
fi

if $root; then
  bash tools/install_slurm.sh
elif ! sinfo >/dev/null 2>&1; then
  say "no Slurm here (tests/slurm will skip): sudo bash tools/install_slurm.sh"
fi

bash tools/install_horovod.sh
