"""The metric rows reach TensorBoard as scalars, read back with TensorBoard's own reader."""

from __future__ import annotations

import io
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpcmarl.metrics import MetricsSink


def progress_row(env_steps: int, updates: int, **extra: object) -> dict:
    return {
        "time_s": 1.0,
        "env_steps": env_steps,
        "env_steps_per_s": 50.0,
        "updates": updates,
        "updates_per_s": 2.0,
        "episodes": 3,
        "train_return": None,
        "eval_return": -5.0,
        "eval_agent_returns": {"a": -2.0, "b": -3.0},
        "replay_fill": 0.25,
        "version_lag": None,
        **extra,
    }


def learn_row(updates: int, env_steps: int = 0, **extra: object) -> dict:
    row = {"role": "learner0", "group": "shared", "env_steps": env_steps, "loss": 0.5}
    return {**row, "updates": updates, "dropped": {"replay0": 2}, **extra}


def read(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return acc


def points(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_rows_become_scalars_stepped_by_env_steps(tmp_path: Path) -> None:
    sink = MetricsSink(str(tmp_path), io.StringIO(), agents=["a", "b"])
    sink.record("learn", learn_row(updates=7, env_steps=100))
    agents = {"a": -2.0, "b": -3.0}
    eval_row = {"time_s": 1.0, "env_steps": 150, "updates": 9, "episodes": 10}
    sink.record(
        "eval", {**eval_row, "return_mean": -5.0, "return_std": 1.0, "agent_returns": agents}
    )
    sink.record("episode", {"collector": "collector0", "return": 1.0, "env_steps": 150})
    sink.progress(progress_row(env_steps=200, updates=9))
    sink.close()
    acc = read(tmp_path)
    assert points(acc, "learn/shared/loss") == [(100, 0.5)]
    assert points(acc, "learn/shared/dropped/replay0") == [(100, 2.0)]
    assert points(acc, "eval/return_mean") == [(150, -5.0)]
    assert points(acc, "eval/agent_returns/b") == [(150, -3.0)]
    assert points(acc, "progress/env_steps_per_s") == [(200, 50.0)]
    assert points(acc, "progress/replay_fill") == [(200, 0.25)]
    tags = set(acc.Tags()["scalars"])
    # progress rows repeat the last eval, strings and missing values are not scalars
    assert not {t for t in tags if t.startswith(("progress/eval", "episode"))}
    assert "progress/train_return" not in tags and "progress/time_s" not in tags
    assert "learn/shared/role" not in tags and "eval/episodes" not in tags


def test_offline_steps_by_updates_and_never_goes_back(tmp_path: Path) -> None:
    sink = MetricsSink(str(tmp_path), io.StringIO(), x_axis="updates")
    sink.progress(progress_row(env_steps=0, updates=400))
    sink.record("learn", learn_row(updates=250))  # one of two learners: its own updates
    sink.progress(progress_row(env_steps=0, updates=900))
    sink.close()
    acc = read(tmp_path)
    assert [s for s, _ in points(acc, "progress/updates_per_s")] == [400, 900]
    assert [s for s, _ in points(acc, "learn/shared/loss")] == [400]


def test_a_resumed_run_appends_and_replaces_what_followed_its_checkpoint(tmp_path: Path) -> None:
    first = MetricsSink(str(tmp_path), io.StringIO())
    for steps in (100, 300):  # 300: written after the checkpoint at 200, then lost
        first.progress(progress_row(env_steps=steps, updates=1))
    first.close()
    first.close()  # every exit path closes; twice is harmless
    # A resumed run is a new process, a second later at least. Event files are read in name
    # order (time in whole seconds, host, PID, then a per-process counter compared as text),
    # so in one process the second file must be a second younger, or `.10` sorts before `.9`.
    time.sleep(max(0.0, 1.0 - time.time() % 1.0) + 0.01)
    second = MetricsSink(str(tmp_path), io.StringIO())
    second.resumed({"env_steps": 200, "updates": 1})
    for steps in (200, 400):
        second.progress(progress_row(env_steps=steps, updates=1))
    second.close()
    assert len(list((tmp_path / "tb").iterdir())) == 2
    assert [s for s, _ in points(read(tmp_path), "progress/updates")] == [100, 200, 400]
