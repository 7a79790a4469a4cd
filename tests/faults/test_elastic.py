"""Losing a collector keeps the run (`runtime.fault_tolerance: collectors`, Open MPI's ULFM).

A collector's rank killed with `kill -9` mid-run: the run reaches its step budget, says what it
lost, counts it in `metrics.jsonl`, and a checkpoint taken after the loss resumes in one
process. Any other role lost still ends the job, within seconds, with one line naming the
rank, its host and its roles, and leaves no rank behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from hpcmarl.testing.ranks import rank_pids

from ..mpi.conftest import BackgroundJob, progress_rows, run_local, run_mpi
from .test_failures import open_mpi

TOLERANT = ["runtime.fault_tolerance=collectors", "commander.stop_value=null"]
SEVEN_RANKS = [
    "topology.param_servers=1",
    "topology.replay_shards=1",
    "topology.learners=1",
    "topology.collectors=3",
    "topology.colocate=false",
]
"""commander, ps0, replay0, learner0, collector0-2 on ranks 0 to 6."""

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not open_mpi(), reason="fault tolerance needs Open MPI's ULFM"),
]


def rows(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]


def test_a_collector_killed_mid_run_is_survived_and_the_run_resumes(tmp_path: Path) -> None:
    budget = ["commander.max_env_steps=5000", "checkpoint.at_end=true"]
    job = BackgroundJob(7, [*TOLERANT, *SEVEN_RANKS, *budget, f"runtime.run_dir={tmp_path}"])
    job.wait_for(progress_rows(tmp_path, 1), 120, "a progress row")
    pids = rank_pids(tmp_path)
    os.kill(pids[5], signal.SIGKILL)  # collector1
    out, err = job.finish(180, "a run that lost collector1")
    assert job.returncode == 0, err[-3000:]
    host = socket.gethostname()
    assert f"hpcmarl: lost rank 5 (collector1) on host {host}; going on with 2 collectors" in out
    assert "hpcmarl: finished: step budget reached" in out
    (lost,) = rows(tmp_path, "rank_lost")
    assert lost["roles"] == ["collector1"] and lost["collectors_left"] == 2
    assert rows(tmp_path, "progress")[-1]["collectors_lost"] == 1
    assert rows(tmp_path, "finished")[0]["env_steps"] >= 5000
    assert not rank_pids(tmp_path), "ranks left behind"

    more = ["commander.max_env_steps=5500", "topology.collectors=1", "topology.colocate=true"]
    resumed = run_local(["-m", "hpcmarl", "resume", str(tmp_path), *more], timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "hpcmarl: resumed from checkpoint" in resumed.stdout
    assert rows(tmp_path, "finished")[-1]["env_steps"] >= 5500


def test_a_collector_killed_while_a_checkpoint_is_written_does_not_hold_it(
    tmp_path: Path,
) -> None:
    """collector1's first checkpoint file waits 60 s to be written; its rank is killed once
    the other roles' files of that checkpoint are on disk: the checkpoint commits without it,
    and the run goes on to its budget."""
    args = [*TOLERANT, *SEVEN_RANKS, "commander.max_env_steps=6000", "checkpoint.interval_s=4"]
    slow = {"HPCMARL_FAULT_WRITE_DELAY": "collector1:60:1"}
    job = BackgroundJob(7, [*args, f"runtime.run_dir={tmp_path}"], env=slow)
    first = tmp_path / "checkpoints" / "000001"
    job.wait_for(lambda: len(list(first.glob("learner0*"))) > 0, 150, "checkpoint 1's files")
    os.kill(rank_pids(tmp_path)[5], signal.SIGKILL)  # collector1, still writing
    out, err = job.finish(180, "a run that lost a collector during a checkpoint")
    assert job.returncode == 0, err[-3000:]
    assert "hpcmarl: lost rank 5 (collector1)" in out
    assert "hpcmarl: checkpoint 000001 written" in out, out[-3000:]
    assert not list(first.glob("collector1*"))
    assert "hpcmarl: finished: step budget reached" in out


def test_an_exception_in_a_collector_is_survived(tmp_path: Path) -> None:
    """The failing rank prints its line and leaves by SIGKILL: a rank that exits without
    MPI_Finalize is never reported to its peers under ULFM (they waited for good)."""
    args = [*TOLERANT, *SEVEN_RANKS, "commander.max_env_steps=2000", f"runtime.run_dir={tmp_path}"]
    result = run_mpi(
        7, ["-m", "hpcmarl", *args], timeout=180, env={"HPCMARL_FAULT": "collector1:200"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hpcmarl: lost: rank 5 (collector1): RuntimeError: injected fault in collector1" in (
        result.stderr
    )
    assert "the run goes on without this rank" in result.stderr
    assert "hpcmarl: failed:" not in result.stderr  # nothing says the job ended
    assert "hpcmarl: lost rank 5 (collector1)" in result.stdout
    assert "hpcmarl: finished: step budget reached" in result.stdout


def test_a_lost_learner_still_ends_the_job_with_one_line(tmp_path: Path) -> None:
    job = BackgroundJob(
        7,
        [*TOLERANT, *SEVEN_RANKS, "commander.max_env_steps=200000", f"runtime.run_dir={tmp_path}"],
    )
    job.wait_for(progress_rows(tmp_path, 1), 120, "a progress row")
    pids = rank_pids(tmp_path)
    os.kill(pids[3], signal.SIGKILL)  # learner0
    killed = time.monotonic()
    _, err = job.finish(60, "kill -9 of learner0 under fault tolerance did not end the job")
    took = time.monotonic() - killed
    print(f"job ended {took:.1f} s after kill -9 of learner0")
    assert job.returncode == 76  # slurm/train.sh requeues it
    assert took < 10
    lines = [line.strip("\x00 ") for line in err.splitlines()]
    failed = [line for line in lines if line.startswith("hpcmarl: failed:")]
    host = socket.gethostname()
    assert len(failed) == 1, err[-3000:]
    assert f"lost rank 3 (learner0) on host {host}: learner0 cannot be replaced" in failed[0]
    deadline = time.monotonic() + 5
    while rank_pids(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not rank_pids(tmp_path), f"orphaned ranks: {rank_pids(tmp_path)}"


def test_a_learner_that_raises_ends_the_job_as_a_crash_not_a_loss(tmp_path: Path) -> None:
    """Its exception would recur on resume, so the job ends with 1, which slurm/train.sh does
    not requeue, and only the failing rank speaks; a learner killed (above) ends it with 76."""
    args = [
        *TOLERANT,
        *SEVEN_RANKS,
        "commander.max_env_steps=200000",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_mpi(
        7, ["-m", "hpcmarl", *args], timeout=180, env={"HPCMARL_FAULT": "learner0:200"}
    )
    assert result.returncode == 1, result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if "hpcmarl: failed:" in line]
    assert len(failed) == 1, result.stderr[-3000:]
    assert "rank 3 (learner0): RuntimeError: injected fault in learner0" in failed[0]
    assert (tmp_path / "logs" / "rank3.crashed").is_file()


def test_fault_tolerance_refuses_deterministic_mode(tmp_path: Path) -> None:
    result = run_local(
        ["-m", "hpcmarl", *TOLERANT, "commander.deterministic=true", f"runtime.run_dir={tmp_path}"],
        timeout=60,
    )
    assert result.returncode == 2
    assert "runtime.fault_tolerance=collectors cannot keep commander.deterministic" in (
        result.stderr
    )
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
