"""A deterministic run samples every replay shard that holds its groups' items: one learner
of `spread_independent.yaml` on 2 shards sampled only replay0 (replay1 served 0 of 60)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint

from .conftest import run_local


@pytest.mark.mpi
def test_one_learner_samples_both_shards_in_turn(tmp_path: Path) -> None:
    args = [
        "jobs/spread_independent.yaml",
        "commander.deterministic=true",
        "topology.replay_shards=2",
        "topology.collectors=1",
        "commander.max_updates=60",
        "learner.updates_per_task=10",
        "learner.batch_size=16",
        "replay.learning_starts=100",
        "commander.eval_every_rounds=1000",
        "checkpoint.interval_s=0",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(["-m", "hpcmarl", *args], timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    served = [int(checkpoint.read_role(s)["samples_served"]) for s in ("replay0", "replay1")]
    assert served == [30, 30]  # 3 groups x 20 updates, each group's batches from both in turn


@pytest.mark.mpi
def test_a_shard_without_the_groups_items_does_not_hold_the_round(tmp_path: Path) -> None:
    """The first round deals each group's one batch to replay0 only: update 1's turn, replay1,
    holds nothing, and the request waited there for good (0 updates until a checkpoint
    timeout). Now replay1 answers empty at once and the update asks replay0."""
    args = [
        "jobs/spread_independent.yaml",
        "commander.deterministic=true",
        "topology.replay_shards=2",
        "topology.collectors=1",
        "collector.fragments_per_task=1",
        "env.num_envs=1",
        "replay.learning_starts=1",
        "commander.max_updates=60",
        "learner.updates_per_task=10",
        "learner.batch_size=16",
        "commander.eval_every_rounds=1000",
        "checkpoint.interval_s=0",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(["-m", "hpcmarl", *args], timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    served = [int(checkpoint.read_role(s)["samples_served"]) for s in ("replay0", "replay1")]
    assert served == [45, 15]  # round 1: 30 from replay0; round 2: 15 from each in turn
