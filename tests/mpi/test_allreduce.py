"""Learner collectives under real mpirun: MPI and Horovod against a one-process reference.

One 6-rank run per backend holds a bystander rank and two independent learner groups (2 and 3
learners); see scripts/allreduce_check.py for what each member checks. The MPI run also lets
the second group ask for `auto` with Horovod unavailable, to see the fallback and its line.
Horovod runs are skipped, with the reason, where Horovod does not import. The end-to-end
CartPole runs of test_train.py use `learner.allreduce=auto`, so they train with Horovod wherever
it is installed.
"""

from __future__ import annotations

import subprocess

import pytest

from hpcmarl.comm import horovod

from .conftest import ROOT, run_mpi

# `-m mpi4py`: a failed check on one rank aborts the world instead of leaving the others waiting.
SCRIPT = ["-m", "mpi4py", str(ROOT / "tests" / "mpi" / "scripts" / "allreduce_check.py")]
RANKS = 6
HOROVOD_MISSING = horovod.unavailable_reason()


def check_all_ok(result: subprocess.CompletedProcess, backend: str) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(f"ok backend={backend} learners=2") == 2, result.stdout
    assert result.stdout.count(f"ok backend={backend} learners=3") == 3, result.stdout
    assert "0: ok (stood by)" in result.stdout


@pytest.fixture(scope="module")
def mpi_run() -> subprocess.CompletedProcess:
    # Where Horovod is installed it is hidden; where it is not, its absence is the real thing.
    env = {horovod.HIDE_VAR: "1"} if HOROVOD_MISSING is None else {}
    return run_mpi(RANKS, [*SCRIPT, "mpi,auto", "mpi"], timeout=240, env=env)


@pytest.fixture(scope="module")
def horovod_run() -> subprocess.CompletedProcess:
    if HOROVOD_MISSING is not None:
        pytest.skip(f"{HOROVOD_MISSING}; `bash tools/install_horovod.sh` builds it")
    return run_mpi(RANKS, [*SCRIPT, "horovod,auto", "horovod"], timeout=240)


@pytest.mark.mpi
def test_mpi_backend_matches_reference_with_2_and_3_learners(
    mpi_run: subprocess.CompletedProcess,
) -> None:
    check_all_ok(mpi_run, "mpi")
    assert "learners of policy p0 average gradients with mpi (2 ranks)" in mpi_run.stdout


@pytest.mark.mpi
def test_auto_falls_back_to_mpi_with_one_clear_line(mpi_run: subprocess.CompletedProcess) -> None:
    check_all_ok(mpi_run, "mpi")
    reason = f"hidden by {horovod.HIDE_VAR}=1" if HOROVOD_MISSING is None else HOROVOD_MISSING
    lines = [line for line in mpi_run.stdout.splitlines() if "policy p1" in line]
    assert len(lines) == 1, mpi_run.stdout
    assert lines[0].startswith("hpcmarl: learners of policy p1: horovod"), lines[0]
    assert lines[0].endswith(f"{reason}, using mpi (3 ranks)"), lines[0]


@pytest.mark.mpi
def test_horovod_backend_matches_reference_with_2_and_3_learners(
    horovod_run: subprocess.CompletedProcess,
) -> None:
    check_all_ok(horovod_run, "horovod")
    out = horovod_run.stdout
    assert "learners of policy p0 average gradients with horovod (2 ranks)" in out
    assert "learners of policy p1 average gradients with horovod (3 ranks)" in out  # auto
