"""A learner's failed task is reported before the job ends (DI-engine's
`notify_fail_learner_task`), and its statistics reach the record after every task
(`update_learner_info`).

An update that raises (a plugin's bug) or whose loss is not finite (the learner's NaN guard)
fails its task: the learner tells the commander the cause, the group and the updates applied;
the commander writes a `task_failed` row and ends the job with one `failed:` line naming the
learner's rank. The run is not retried: the group's weights were left half updated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmarl.analysis.learners import learner_summary
from hpcmarl.analysis.report import render

from ..mpi.conftest import run_local, run_mpi
from .test_failures import open_mpi

BRITTLE = [
    "learner.algo=tests.unit.plugin_algos:BrittleReinforce",
    "learner.reinforce.batch_fragments=4",
    "commander.stop_value=null",
    "commander.max_env_steps=3000",
    "topology.collectors=1",
    "topology.learners=1",
    "topology.replay_shards=1",
]
"""CartPole, REINFORCE on 4 fragments of 32 steps per update, breaking at an update."""


def rows(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]


def failed_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hpcmarl: failed:")]


def test_a_nan_loss_fails_the_task_with_its_cause_group_and_update_count(tmp_path: Path) -> None:
    args = [*BRITTLE, "learner.reinforce.fail_at_update=3", "learner.reinforce.failure=nan"]
    result = run_local(["-m", "hpcmarl", *args, f"runtime.run_dir={tmp_path}"], timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = failed_lines(result.stderr)
    assert line.startswith("hpcmarl: failed: rank 0 (learner0): FloatingPointError: update 3 ")
    assert "non-finite loss (policy_loss nan)" in line and "after 3 updates" in line
    assert "Traceback" not in result.stderr
    (failed,) = rows(tmp_path, "task_failed")
    assert failed["role"] == "learner0" and failed["group"] == "shared"
    assert failed["updates"] == 3 and failed["cause"].startswith("FloatingPointError")
    infos = rows(tmp_path, "update_learner_info")
    assert [info["updates"] for info in infos] == [1, 2]  # one row per finished task
    assert failed["last_info"] == {k: v for k, v in infos[-1].items() if k not in ROW_KEYS}
    assert set(infos[-1]["losses"]["shared"]) == {"policy_loss", "baseline_loss"}
    assert infos[-1]["lr"] == 1e-3 and infos[-1]["task_updates"] == 1

    learners = learner_summary([tmp_path])  # what `python -m hpcmarl analyze` reports
    assert learners is not None and learners["learner0"]["tasks"] == 2
    assert learners["learner0"]["updates"] == 2
    (failure,) = learners["learner0"]["failed"]
    assert failure["group"] == "shared" and failure["updates"] == 3
    report = render({"learners": learners, "totals": {"items": 0}, "files": []})
    assert "## Learners" in report
    assert "learner0: task " in report and "failed after 3 updates: FloatingPointError" in report


ROW_KEYS = {"kind", "role", "task_id", "env_steps"}
"""The fields of an `update_learner_info` row that are the commander's, not the learner's."""


@pytest.mark.mpi
@pytest.mark.parametrize("tolerance", ["none", "collectors"])
def test_a_plugins_exception_on_a_learner_rank_is_recorded_before_the_job_ends(
    tmp_path: Path, tolerance: str
) -> None:
    """The learner reports and waits; the commander records the row, then ends the world
    (under fault tolerance, as a crash: exit 1, one line, not a lost commander's 76)."""
    if tolerance == "collectors" and not open_mpi():
        pytest.skip("fault tolerance needs Open MPI's ULFM")
    args = [*BRITTLE, "learner.reinforce.fail_at_update=2", "topology.colocate=false"]
    args += ["topology.param_servers=1", f"runtime.fault_tolerance={tolerance}"]
    result = run_mpi(5, ["-m", "hpcmarl", *args, f"runtime.run_dir={tmp_path}"], timeout=120)
    assert result.returncode == 1
    (line,) = failed_lines(result.stderr)
    expected = "hpcmarl: failed: rank 3 (learner0): ValueError: brittle_reinforce broke in update 2"
    assert line.startswith(expected), result.stderr[-3000:]
    assert f"[traceback: {tmp_path}/logs/rank3.traceback]" in line
    assert "compute_gradients" in (tmp_path / "logs" / "rank3.traceback").read_text()
    (failed,) = rows(tmp_path, "task_failed")
    assert failed["role"] == "learner0" and failed["updates"] == 1
    assert failed["cause"] == "ValueError: brittle_reinforce broke in update 2"
