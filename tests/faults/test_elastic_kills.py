"""Collectors killed at the awkward moments, under `runtime.fault_tolerance: collectors`.

`kill -9` of a collector before its first batch, while the job stops at its budget, and of
three of ten collectors at once: each run reaches its step budget without a hang, exits 0,
names what it lost, and its final checkpoint resumes. The moments are events, never sleeps:
the first two kills are struck by the rank itself (`HPCMARL_FAULT=collector1:1:kill` at its
first poll, `collector1:stop:kill` before it handles the commander's stop), the third from
outside once the first training episode is in `metrics.jsonl`. A collector lost earlier, in
the start-up collectives (`collector1:start:kill`) or before MPI_Init (`rank5:init:kill`), ends
the job before training with one line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from hpcmarl.testing.ranks import rank_pids

from ..mpi.conftest import BackgroundJob, run_local, run_mpi
from .test_elastic import SEVEN_RANKS, TOLERANT, rows
from .test_failures import open_mpi

ARGS = [*TOLERANT, *SEVEN_RANKS, "checkpoint.at_end=true"]
"""commander, ps0, replay0, learner0 on ranks 0 to 3; the collectors from rank 4 on."""

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not open_mpi(), reason="fault tolerance needs Open MPI's ULFM"),
]


def wrote(run_dir: Path, kind: str) -> bool:
    """Whether the run has written a row of this kind (the first collect task's end)."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and f'"kind": "{kind}"' in metrics.read_text()


def check_survived(run_dir: Path, out: str, lost: list[str], budget: int) -> None:
    """The run named its losses, reached its budget, left no rank behind and resumes."""
    assert "hpcmarl: finished: step budget reached" in out, out[-3000:]
    assert sorted(r for row in rows(run_dir, "rank_lost") for r in row["roles"]) == lost
    assert rows(run_dir, "finished")[0]["env_steps"] >= budget
    assert not rank_pids(run_dir), "ranks left behind"
    more = [f"commander.max_env_steps={budget + 300}", "topology.collectors=1"]
    more.append("topology.colocate=true")
    resumed = run_local(["-m", "hpcmarl", "resume", str(run_dir), *more], timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "hpcmarl: resumed from checkpoint" in resumed.stdout
    assert rows(run_dir, "finished")[-1]["env_steps"] >= budget + 300


def test_a_collector_killed_before_its_first_batch(tmp_path: Path) -> None:
    args = [*ARGS, "commander.max_env_steps=1500"]
    kill = {"HPCMARL_FAULT": "collector1:1:kill"}
    result = run_mpi(7, ["-m", "hpcmarl", *args, f"runtime.run_dir={tmp_path}"], 120, env=kill)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hpcmarl: lost rank 5 (collector1)" in result.stdout
    assert "hpcmarl: failed:" not in result.stderr
    every = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lost_at = next(i for i, row in enumerate(every) if row["kind"] == "rank_lost")
    before = [row for row in every[:lost_at] if row.get("collector") == "collector1"]
    assert not before  # no episode before its loss (a replacement's may come after)
    check_survived(tmp_path, result.stdout, ["collector1"], 1500)


def test_a_collector_killed_in_the_start_up_collectives_ends_the_job_with_one_line(
    tmp_path: Path,
) -> None:
    """Before the roles exist nothing can go on without a rank: the job ends before training,
    named once, exit 76 (requeued). It used to end silently with exit 1."""
    kill = {"HPCMARL_FAULT": "collector1:start:kill"}
    args = [*ARGS, "commander.max_env_steps=1500", f"runtime.run_dir={tmp_path}"]
    result = run_mpi(7, ["-m", "hpcmarl", *args], 120, env=kill)
    assert result.returncode == 76, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("hpcmarl: failed:")]
    host = socket.gethostname()
    assert lines == [
        f"hpcmarl: failed: lost rank 5 (collector1) on host {host} during start-up, before "
        "training began: nothing was trained; start the job again (slurm/train.sh requeues it)"
    ], result.stderr[-3000:]
    assert not rank_pids(tmp_path), "ranks left behind"


def test_a_rank_killed_before_mpi_init_ends_the_job_instead_of_hanging_it(tmp_path: Path) -> None:
    """Open MPI's fault-tolerant mpirun leaves the other ranks in MPI_Init for good; the
    launcher's start-up watch (launch/start_watch.py) ends the job, named once, exit 76."""
    kill = {"HPCMARL_FAULT": "rank5:init:kill"}
    args = [*ARGS, "commander.max_env_steps=1500", f"runtime.run_dir={tmp_path}"]
    result = run_mpi(7, ["-m", "hpcmarl", *args], 120, env=kill)
    assert result.returncode == 76, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("hpcmarl: failed:")]
    assert len(lines) == 1 and lines[0].startswith("hpcmarl: failed: lost rank 5 (pid "), lines
    assert "during start-up, before every rank had MPI up" in lines[0]
    assert "Killed" not in result.stderr
    assert not rank_pids(tmp_path), "ranks left behind"


def test_a_collector_killed_during_the_final_stop(tmp_path: Path) -> None:
    """collector1 dies before it acknowledges the stop: the commander does not wait for it."""
    args = [*ARGS, "commander.max_env_steps=1500"]
    kill = {"HPCMARL_FAULT": "collector1:stop:kill"}
    result = run_mpi(7, ["-m", "hpcmarl", *args, f"runtime.run_dir={tmp_path}"], 120, env=kill)
    assert result.returncode == 0, result.stderr[-3000:]
    (lost,) = rows(tmp_path, "rank_lost")
    assert lost["env_steps"] >= 1500  # after the budget, with the stop under way
    check_survived(tmp_path, result.stdout, ["collector1"], 1500)


def test_three_of_ten_collectors_killed_at_once(tmp_path: Path) -> None:
    args = [*ARGS, "topology.collectors=10", "commander.max_env_steps=3000"]
    job = BackgroundJob(14, [*args, f"runtime.run_dir={tmp_path}"])
    job.wait_for(lambda: wrote(tmp_path, "episode"), 120, "a training episode's row")
    pids = rank_pids(tmp_path)
    for rank in (5, 9, 12):  # collector1, collector5, collector8
        os.kill(pids[rank], signal.SIGKILL)
    out, err = job.finish(120, "a run that lost 3 of 10 collectors")
    assert job.returncode == 0, err[-3000:]
    assert "hpcmarl: failed:" not in err
    assert rows(tmp_path, "progress")[-1]["collectors_lost"] == 3
    check_survived(tmp_path, out, ["collector1", "collector5", "collector8"], 3000)
