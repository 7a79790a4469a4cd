"""A stop or a checkpoint reaches a learner within an update, whatever `updates_per_task` is.

Before `wrap_up`, a learner task ran to its end: with `updates_per_task` at 1e9 a run never
stopped after its budget, and a signal's checkpoint waited for the whole task.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import BackgroundJob, run_local

ENDLESS_TASKS = [
    "commander.stop_value=null",
    "commander.progress_interval_s=1",
    "learner.updates_per_task=1000000000",
    "replay.learning_starts=200",
    "checkpoint.interval_s=0",
]


def stepped(run_dir: Path, env_steps: int) -> Callable[[], bool]:
    """A readiness check: a progress row counts `env_steps` (learner tasks run by then)."""
    progress = run_dir / "progress.csv"

    def ready() -> bool:
        rows = progress.read_text().splitlines()[1:] if progress.exists() else []
        return bool(rows) and int(rows[-1].split(",")[1]) >= env_steps

    return ready


def learn_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("kind") == "learn"]


@pytest.mark.mpi
def test_a_budget_ends_an_endless_learner_task_in_one_process(tmp_path: Path) -> None:
    """A wall-time budget, not a step budget: an idle machine collects thousands of steps in
    the second before the shards first report their sizes, and no learner task would start."""
    run_dir = tmp_path / "run"
    budget = ["commander.max_env_steps=10000000", "commander.max_wall_time_s=8"]
    args = [*ENDLESS_TASKS, *budget, f"runtime.run_dir={run_dir}"]
    proc = run_local(["-m", "hpcmarl", *args], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "finished: wall-time limit reached" in proc.stdout
    rows = learn_rows(run_dir)
    assert rows and rows[-1]["updates"] > 0 and rows[-1]["unfinished"] > 0, rows


@pytest.mark.mpi
def test_a_signal_wraps_up_a_data_parallel_groups_task_at_one_update(tmp_path: Path) -> None:
    """Two learners of one group hear `wrap_up` at different updates, yet end their task after
    the same one (the allreduce carries the wish), so the checkpoint holds equal learners."""
    run_dir = tmp_path / "run"
    args = [
        *ENDLESS_TASKS,
        "commander.max_env_steps=10000000",
        "topology.learners=2",
        "topology.collectors=1",
        "learner.drift_check_interval=1",
        f"runtime.run_dir={run_dir}",
    ]
    job = BackgroundJob(5, args)
    job.wait_for(stepped(run_dir, 1000), 120, "1,000 env steps")
    job.signal(signal.SIGUSR1)
    out, err = job.finish(60, "it did not stop after SIGUSR1")
    assert job.returncode == 75, out[-2000:] + err[-2000:]
    assert "checkpointed at the time limit" in out
    rows = learn_rows(run_dir)
    assert sorted(row["role"] for row in rows) == ["learner0", "learner1"], rows
    assert len({row["updates"] for row in rows}) == 1, rows
    assert all(row["updates"] > 0 and row["unfinished"] > 0 for row in rows), rows
