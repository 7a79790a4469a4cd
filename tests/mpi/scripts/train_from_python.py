"""`hpcmarl.train` called by every rank of an mpirun, as a user's script does.

Usage: train_from_python.py RUN_DIR. First a job the schema refuses: every rank must raise the
same `UserError` (none left waiting for another), then the ranks go on to train a tiny job
together and each prints `<rank>: ran <env steps> in <run dir>` from the `Run` it got.
"""

from __future__ import annotations

import sys

from mpi4py import MPI

import hpcmarl
from hpcmarl.errors import UserError

TINY = {"commander": {"stop_value": None, "max_env_steps": 300}, "topology": {"collectors": 1}}

rank = MPI.COMM_WORLD.Get_rank()
try:
    hpcmarl.train({**TINY, "learner": {"lr": "fast"}}, run_dir=sys.argv[1])
except UserError as err:
    print(f"{rank}: refused: {err}", flush=True)
run = hpcmarl.train(TINY, run_dir=sys.argv[1])
print(f"{rank}: ran {run.final['env_steps']} in {run.run_dir}", flush=True)
