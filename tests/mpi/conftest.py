"""Running commands under the real `mpirun` of the virtualenv, always with a hard timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = ROOT / "tools" / "mpirun.sh"
VENV = str(Path(sys.executable).parent.parent)
"""The virtualenv running the tests; its mpirun launches them (Open MPI's or MPICH's)."""


def run_mpi(
    ranks: int, args: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`mpirun -n ranks python ARGS`; a hang fails the test instead of the suite."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": VENV, **(env or {})}
    cmd = ["bash", str(MPIRUN), "-n", str(ranks), sys.executable, *args]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"mpirun -n {ranks} {' '.join(args)} hung past {timeout}s:\n"
            f"{(exc.stdout or b'')[-3000:]!r}\n{(exc.stderr or b'')[-3000:]!r}"
        )


def run_local(
    args: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """One plain process, no mpirun."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=cwd or ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"python {' '.join(args)} hung past {timeout}s:\n{(exc.stdout or b'')[-3000:]!r}"
        )
