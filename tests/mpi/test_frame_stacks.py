"""MALib's producer options in a real run: a feed-forward DQN on CartPole without its
velocities, acting on stacks of its last 4 observations (`replay.stack_num`), with tables that
store each frame once and no next observations (`replay.ignore_obs_next`), learns what a single
frame cannot tell it: it passes 100 by 30k env steps (mostly by 20k) where the same DQN on
single frames stays near 45 (tests/mpi/test_recurrent.py holds it below 90). Two collectors
feed two shards, one each; the run checkpoints and resumes on one shard, its runs dealt whole.
An env that stacks its own frames, stored with `replay.save_only_last_obs`, trains exactly as
the same env stacked by hpcmarl."""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint

from ..checkpoint.test_deterministic import rounds
from .conftest import run_local, run_mpi
from .test_train import finished_line

JOB = [
    "jobs/cartpole_novel_stacked.yaml",
    "commander.stop_value=null",
    "commander.eval_interval_s=4",
    "topology.collectors=2",
    "topology.replay_shards=2",
    "topology.learners=1",
    "replay.samples_per_insert=32",
]
RESHARD = "topology.replay_shards=1"
"""The resumed run deals the two shards' runs, each whole, to one."""


def evals(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["return_mean"] for r in rows if r["kind"] == "eval"]


@pytest.mark.mpi
@pytest.mark.slow
def test_stacked_frames_let_a_feed_forward_dqn_balance_without_velocities(tmp_path: Path) -> None:
    first = run_mpi(
        1,
        ["-m", "hpcmarl", *JOB, "commander.max_env_steps=7000", f"runtime.run_dir={tmp_path}"],
        timeout=300,
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "replay stores 44 B per transition (stack_num 4, ignore_obs_next: 0.44" in first.stdout
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    for shard in ("replay0", "replay1"):
        with h5py.File(checkpoint.path / f"{shard}.h5", "r") as f:
            table = f["tables/shared"]
            assert table["column/observations"].shape[1] == 2  # one frame, not four
            assert "next_observations" not in table["column"]
            assert len(table["column/rewards"]) > 1000  # each shard was fed by its collector
    export = run_local(
        ["-m", "hpcmarl", "export", str(checkpoint.path / "replay0.h5"), "--format", "d4rl"],
        timeout=60,
    )
    assert export.returncode == 2 and "stores compact transitions" in export.stderr
    assert "export the run's replay logs" in export.stderr
    resumed = run_mpi(
        1,
        ["-m", "hpcmarl", "resume", str(tmp_path), "commander.max_env_steps=30000", RESHARD]
        # The first evaluation past 100 ends it: by 20k steps in most runs, but 2 of 5 ended
        # there at 96 or below (2026-12-03, 2 cores), so the budget leaves the slow ones room.
        + ["commander.stop_value=100.1"],
        timeout=400,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from checkpoint" in resumed.stdout
    assert re.search("stop_value reached|step budget reached", finished_line(resumed.stdout))
    curve = evals(tmp_path)
    assert max(curve) > 100, curve


@pytest.mark.mpi
def test_an_env_that_stacks_its_own_frames_trains_as_one_stacked_for_it(tmp_path: Path) -> None:
    """Deterministic runs: the env's own stacks (first axis 4), of which the tables keep the
    newest frame, against hpcmarl stacking the single frames; every round's figures equal."""
    quick = [
        *JOB,
        "commander.deterministic=true",
        "commander.max_updates=600",
        "learner.updates_per_task=50",
        "replay.learning_starts=300",
        "checkpoint.interval_s=0",
    ]
    own = [
        "env.id=hpcmarl.envs.partial:CartPoleNoVelocityStacked-v1",
        "replay.save_only_last_obs=true",
    ]
    runs = {"stacked for it": [], "own stacks": own}
    for name, extra in runs.items():
        args = ["-m", "hpcmarl", *quick, *extra, f"runtime.run_dir={tmp_path / name}"]
        result = run_mpi(1, args, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "replay stores 44 B per transition" in result.stdout
    assert rounds(tmp_path / "own stacks") == rounds(tmp_path / "stacked for it")
    assert len(rounds(tmp_path / "own stacks")) >= 10
