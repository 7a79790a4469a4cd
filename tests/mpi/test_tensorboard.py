"""A real one-process run, and its resume, leave TensorBoard scalars that TensorBoard reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .conftest import run_local

SHORT_RUN = [
    "-m",
    "hpcmarl",
    "commander.max_env_steps=3000",
    "commander.stop_value=null",
    "commander.eval_interval_s=1",
    "commander.progress_interval_s=1",
    "replay.learning_starts=200",
]


def finished_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["env_steps"] for r in rows if r["kind"] == "finished"]


def test_a_run_and_its_resume_write_scalars_by_env_steps(tmp_path: Path) -> None:
    first = run_local([*SHORT_RUN, f"runtime.run_dir={tmp_path}"], timeout=120)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = ["-m", "hpcmarl", "resume", str(tmp_path), "commander.max_env_steps=4500"]
    second = run_local(again, timeout=120)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert len(list((tmp_path / "tb").iterdir())) == 2  # the resume appended a file

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("progress/env_steps_per_s")]
    assert steps == sorted(steps) and len(set(steps)) > 3
    first_end, second_end = finished_steps(tmp_path)
    assert steps[0] < first_end < steps[-1] == second_end  # both runs' rows, in order
    evals = acc.Scalars("eval/return_mean")
    assert evals and all(0 < e.value <= 500 for e in evals)  # CartPole's return range
    assert [e.value for e in acc.Scalars("eval/agent_returns/agent_0")] == [e.value for e in evals]
    assert all(0 <= e.value <= 1 for e in acc.Scalars("progress/replay_fill"))
    losses = acc.Scalars("learn/shared/loss")
    assert losses and all(math.isfinite(e.value) for e in losses)
    assert {"progress/updates_per_s", "learn/shared/updates"} <= set(acc.Tags()["scalars"])
