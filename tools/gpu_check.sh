#!/usr/bin/env bash
# The learner half of the suite on a node with a CUDA GPU, where every learner trains on it:
# deterministic resumes (bit for bit), resume and re-sharding, and the learning tests of DQN,
# MAPPO/IPPO, VDN/QMIX, R2D2 and PSRO. CI has no GPU, so run this by hand on a GPU node after a
# change to an algorithm, a network or the learner (it fails at once where there is no GPU).
#
#   tools/gpu_check.sh [pytest options...]        e.g. -n 4 with pytest-xdist on a big node
#
# Settings: PYTHON (default: .venv/bin/python, else python3) runs the tests and the ranks.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
"$py" - <<'EOF' || exit 2
import torch

from hpcmarl.comm.placement import learner_device

if not torch.cuda.is_available():
    raise SystemExit("gpu_check: error: torch sees no CUDA device; fix: run this on a GPU node")
device = learner_device("auto")
print(f"gpu_check: torch {torch.__version__}, {torch.cuda.device_count()} GPU(s), "
      f"learners here train on {device} ({torch.cuda.get_device_name(device)})")
EOF
exec "$py" -m pytest -q -p no:cacheprovider -rfE "$@" \
  tests/checkpoint/test_deterministic.py \
  tests/checkpoint/test_resume.py \
  tests/mpi/test_train.py \
  tests/mpi/test_marl.py \
  tests/mpi/test_recurrent.py \
  tests/mpi/test_psro.py \
  -k "not tcp_only"
