"""Every algorithm family across the tier's hosts: MAPPO, QMIX, R2D2 and PSRO each run at 4
ranks per host (8 on hpc1 and hpc2; 16 on 4 hosts with HPCMARL_TEST_HOSTS=4), end on their
budget and leave a complete checkpoint; the MAPPO run then resumes on another set of hosts
(4 ranks, all on hpc2) and goes on from its counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint

from ..mpi.conftest import MPIRUN, ROOT, VENV
from .conftest import HOSTS, LOCAL_CLUSTER, Cluster, run_on_hosts

pytestmark = pytest.mark.mpi

JOBS = {
    "mappo": ["jobs/spread_mappo.yaml", "commander.max_env_steps=4000"],
    "qmix": ["jobs/spread_qmix.yaml", "commander.max_env_steps=3000"],
    "r2d2": ["jobs/cartpole_novel_r2d2.yaml", "commander.max_env_steps=3000"],
    "psro": [
        "jobs/kuhn_psro.yaml",
        "psro.iterations=2",
        "psro.steps_per_iteration=1500",
        "psro.updates_per_iteration=60",
        "psro.eval_episodes=50",
    ],
}
"""Budgets that end in seconds: what is checked here is that each runs, stops and checkpoints
across hosts, not that it learns (tests/mpi holds each one's learning test)."""
COMMON = ["commander.stop_value=null", "replay.learning_starts=200"]


def finished_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("hpcmarl: finished")]
    assert lines, out[-3000:]
    return lines[-1]


def hpcmarl_lines(output: str) -> str:
    return "\n".join(line for line in output.splitlines() if "hpcmarl:" in line) + "\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run dir per job, filled by the test that runs it (the resume test continues one)."""
    return {name: tmp_path_factory.mktemp(name) for name in JOBS}


@pytest.mark.parametrize("name", list(JOBS))
def test_each_algorithm_runs_and_checkpoints_across_the_hosts(
    cluster: Cluster, runs: dict[str, Path], name: str
) -> None:
    run_dir = runs[name]
    job = [sys.executable, "-m", "hpcmarl", *JOBS[name], *COMMON, f"runtime.run_dir={run_dir}"]
    done = run_on_hosts(HOSTS, 4 * HOSTS, job, timeout=120 + 60 * HOSTS)
    assert done.returncode == 0, hpcmarl_lines(done.stdout + done.stderr) + done.stderr[-2000:]
    assert "  host hpc1: ranks 0-3 (commander, " in done.stdout
    for host in range(2, HOSTS + 1):
        assert f"  host hpc{host}: ranks {4 * host - 4}-{4 * host - 1} (" in done.stdout
    assert "checkpoint 000001" in finished_line(done.stdout)
    assert latest_checkpoint(run_dir) is not None


def test_a_run_resumes_on_another_set_of_hosts(cluster: Cluster, runs: dict[str, Path]) -> None:
    """The MAPPO run made across the hosts goes on at 4 ranks on hpc2 alone: what a
    requeue onto other nodes of another size does."""
    run_dir = runs["mappo"]
    if latest_checkpoint(run_dir) is None:
        pytest.skip("the MAPPO run across 2 hosts did not leave a checkpoint (its test failed)")
    before = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_before = max(row.get("env_steps", 0) for row in before)
    resume = [sys.executable, "-m", "hpcmarl", "resume", str(run_dir)]
    command = ["bash", str(LOCAL_CLUSTER.parent / "cluster_agent.sh"), "--exec", "hpc2"]
    command += ["bash", str(MPIRUN), "-n", "4", *resume, "commander.max_env_steps=6000"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": VENV}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the resume on hpc2 hung:\n{(exc.stderr or b'')[-3000:]!r}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "  host hpc2: ranks 0-3 (commander, " in done.stdout
    assert "checkpoint 000002" in finished_line(done.stdout)
    after = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_after = max(row.get("env_steps", 0) for row in after)
    assert steps_before >= 4000 and steps_after >= 6000, (steps_before, steps_after)
