"""A lost collector replaced during the run (`runtime.respawn_collectors`, under
`runtime.fault_tolerance: collectors`): collector1's rank killed with `kill -9` mid-run, the
ranks left spawn a new one that hosts collector1 again; it takes tasks, the run reaches its step
budget with exit 0, and its final checkpoint resumes in one process. A collector lost once the
stop has begun is not replaced: ranks already in the closing agreement used to meet the others'
spawn, which failed (MPI_ERR_INTERN) and ended the job with 134."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint
from hpcmarl.testing.ranks import rank_pids

from ..mpi.conftest import BackgroundJob, run_mpi
from .test_elastic import SEVEN_RANKS, TOLERANT, rows
from .test_elastic_kills import check_survived, wrote
from .test_failures import open_mpi

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not open_mpi(), reason="fault tolerance needs Open MPI's ULFM"),
]


def test_a_killed_collector_is_replaced_and_takes_tasks(tmp_path: Path) -> None:
    budget = ["commander.max_env_steps=3000", "checkpoint.at_end=true"]
    respawn = ["runtime.respawn_collectors=true"]
    job = BackgroundJob(
        7, [*TOLERANT, *respawn, *SEVEN_RANKS, *budget, f"runtime.run_dir={tmp_path}"]
    )
    job.wait_for(lambda: wrote(tmp_path, "episode"), 120, "a training episode's row")
    os.kill(rank_pids(tmp_path)[5], signal.SIGKILL)  # collector1
    out, err = job.finish(180, "a run that replaced collector1")
    assert job.returncode == 0, err[-3000:]
    assert "a new rank replaces it" in out  # the start-up's fault tolerance line
    assert "hpcmarl: respawned collector1; 3 collectors" in out
    (back,) = rows(tmp_path, "rank_respawned")
    assert back["role"] == "collector1"
    assert 0 < back["respawn_s"] <= back["seconds_to_first_task"]
    assert rows(tmp_path, "progress")[-1]["collectors_respawned"] == 1
    assert "lost 1 collector(s), 1 replaced" in out  # the progress line
    episodes = [r for r in rows(tmp_path, "episode") if r["collector"] == "collector1"]
    assert [r for r in episodes if r["env_steps"] > back["env_steps"]], "no episode replaced"
    ids = [r["episode_id"] for r in episodes]
    assert len(ids) == len(set(ids)), "the replacement reused its predecessor's episode ids"
    check_survived(tmp_path, out, ["collector1"], 3000)


def test_a_collector_killed_during_the_final_stop_is_not_replaced(tmp_path: Path) -> None:
    """collector1 dies before it handles the commander's stop, as the other ranks finish: they
    agree not to replace it, and every rank leaves with exit 0 (3 of 3 runs had failed)."""
    args = [*TOLERANT, "runtime.respawn_collectors=true", *SEVEN_RANKS]
    args += ["commander.max_env_steps=1500", "checkpoint.at_end=true"]
    kill = {"HPCMARL_FAULT": "collector1:stop:kill"}
    result = run_mpi(7, ["-m", "hpcmarl", *args, f"runtime.run_dir={tmp_path}"], 120, env=kill)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hpcmarl: failed:" not in result.stderr
    assert "hpcmarl: lost collectors are not replaced: the run is stopping" in result.stdout
    assert "hpcmarl: finished: step budget reached" in result.stdout
    (lost,) = rows(tmp_path, "rank_lost")
    assert lost["roles"] == ["collector1"] and lost["env_steps"] >= 1500
    assert not rows(tmp_path, "rank_respawned")
    assert rows(tmp_path, "finished")[0]["env_steps"] >= 1500
    checkpoint, skipped = latest_checkpoint(tmp_path)  # every file of its recorded digest
    assert checkpoint is not None and not skipped, skipped
    assert not rank_pids(tmp_path), "ranks left behind"
