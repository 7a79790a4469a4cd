"""Soak across hosts: consecutive runs of the default job on 2 hosts with two CPU hogs beside
them. None may hang, each must end within 3x the median run and exit 0.

Runs: HPCMARL_SOAK_RUNS (CI: 2; the issue's soak is 20, run by hand:
`HPCMARL_SOAK_RUNS=20 .venv/bin/pytest -s tests/multihost/test_soak.py`). A hang shows as a run
past its timeout, which is 3x the first run's wall time (at least 120 s): what the median rule
asks of every run, enforced while it runs instead of after the last."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Cluster, run_on_hosts

pytestmark = pytest.mark.mpi
RUNS = int(os.environ.get("HPCMARL_SOAK_RUNS", "2"))
JOB = ["commander.max_env_steps=4000", "commander.stop_value=null"]
HOG = "while True: pass"


@pytest.fixture
def two_cpu_hogs() -> Iterator[None]:
    """Two busy loops for the length of the soak: the other work a shared node has."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.timeout(max(600, 150 * RUNS))  # the suite's 600 s ended a 20-run soak at run 15
def test_consecutive_2_host_runs_beside_two_cpu_hogs_never_hang(
    cluster: Cluster, two_cpu_hogs: None, tmp_path: Path
) -> None:
    walls: list[float] = []
    timeout = 600.0
    for run in range(RUNS):
        run_dir = tmp_path / f"run{run}"
        job = [sys.executable, "-m", "hpcmarl", *JOB, f"runtime.run_dir={run_dir}"]
        start = time.monotonic()
        done = run_on_hosts(2, 8, job, timeout=timeout)
        walls.append(time.monotonic() - start)
        print(f"soak run {run + 1}/{RUNS}: exit {done.returncode} in {walls[-1]:.1f} s")
        assert done.returncode == 0, f"run {run + 1}: {done.stderr[-3000:]}"
        assert "hpcmarl: finished: step budget reached" in done.stdout
        if run == 0:
            timeout = max(120.0, 3 * walls[0])
    median = statistics.median(walls)
    print(f"soak: {RUNS} runs, median {median:.1f} s, slowest {max(walls):.1f} s")
    assert max(walls) <= 3 * median, walls
