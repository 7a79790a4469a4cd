"""`tools/mpirun.sh` turns on Open MPI's fault tolerance for a job that asks for it wherever
the job says so: its job file, a resumed run's job, or the command line (the last word wins,
as in hpcmarl's own loader)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcmarl.launch.launcher_options import fault_tolerance

from ..faults.test_failures import open_mpi

ROOT = Path(__file__).resolve().parents[2]
TOLERANT_JOB = "runtime:\n  fault_tolerance: collectors\n"


@pytest.fixture
def tolerant_job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(TOLERANT_JOB)
    return path


def test_the_job_file_the_overrides_and_a_resumed_run_are_read(
    tolerant_job: Path, tmp_path: Path
) -> None:
    python = [sys.executable, "-m", "hpcmarl"]
    assert fault_tolerance([*python, str(tolerant_job)]) == "collectors"
    assert fault_tolerance([*python, "train", str(tolerant_job), "seed=3"]) == "collectors"
    assert fault_tolerance([*python, str(tolerant_job), "runtime.fault_tolerance=none"]) == "none"
    assert fault_tolerance([*python, "runtime.fault_tolerance=collectors"]) == "collectors"
    assert fault_tolerance([*python]) == "none"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(TOLERANT_JOB)
    assert fault_tolerance([*python, "resume", str(run_dir)]) == "collectors"


def test_other_commands_and_jobs_that_do_not_load_are_not_tolerant(tolerant_job: Path) -> None:
    assert fault_tolerance(["python", "train.py", str(tolerant_job)]) == "none"
    assert fault_tolerance(["python", "-m", "hpcmarl", "analyze", str(tolerant_job)]) == "none"
    assert fault_tolerance(["python", "-m", "hpcmarl", "no/such/job.yaml"]) == "none"
    assert fault_tolerance(["python", "-m", "hpcmarl", "runtime.fault_tolerance=maybe"]) == "none"


def ft_in_rank(*hpcmarl_args: str) -> str:
    """What a rank started by tools/mpirun.sh for `-m hpcmarl ARGS` sees of fault tolerance
    (a python -c in place of hpcmarl: the launcher decides from the command line alone)."""
    probe = "import os; print(os.environ.get('OMPI_MCA_mpi_ft_enable', 'off'))"
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "mpirun.sh"), "-n", "1", sys.executable, "-c", probe,
         "-m", "hpcmarl", *hpcmarl_args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_mpirun_sh_passes_with_ft_ulfm_for_a_tolerant_job_file(tolerant_job: Path) -> None:
    if not open_mpi():
        pytest.skip("fault tolerance needs Open MPI")
    assert ft_in_rank(str(tolerant_job)) == "1"
    assert ft_in_rank(str(tolerant_job), "runtime.fault_tolerance=none") == "off"
    assert ft_in_rank() == "off"
