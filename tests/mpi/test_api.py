"""`hpcmarl.train` under mpirun: every rank calls it and gets the same `Run` back.

The one-process API is tested in tests/unit/test_api.py; here the ranks must agree, also on a
refusal (a rank that raised alone would leave the others waiting: FACTS.md's MPI trap).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi" / "scripts" / "train_from_python.py")


@pytest.mark.mpi
def test_every_rank_gets_the_refusal_and_then_the_same_run(tmp_path: Path) -> None:
    result = run_mpi(3, [SCRIPT, str(tmp_path / "run")], timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line[:3] in ("0: ", "1: ", "2: "))
    refused = [line for line in lines if "refused" in line]
    assert len(refused) == 3 and all("learner.lr = 'fast'" in line for line in refused), lines
    steps = int(next(line for line in lines if "ran" in line).split()[2])
    assert steps >= 300
    assert [line for line in lines if "ran" in line] == [
        f"{rank}: ran {steps} in {tmp_path / 'run'}" for rank in range(3)
    ]
