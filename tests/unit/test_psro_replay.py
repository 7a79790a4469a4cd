"""PSRO's replay books across iterations and resumes, on real shards in one process: a resume
with another number of shards keeps the current iteration's items (the re-dealt shards know
which generation their tables hold), and the evicted and dropped counts that progress rows sum
never go backwards when an iteration replaces a table, nor across a resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcmarl.comm.protocol import Message
from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import build_replay_shard, item_specs
from hpcmarl.launch.resume import restore_roles
from hpcmarl.roles.replay_shard import ReplayShard
from hpcmarl.storage.checkpoint import commit_checkpoint, write_role_state
from hpcmarl.testing.world import OneRank

JOB = "jobs/kuhn_psro.yaml"
GROUP = "player_0"


def shards_of(n: int, *overrides: str) -> tuple[list[ReplayShard], OneRank]:
    cfg = load_job(JOB, ["replay.learning_starts=1", f"topology.replay_shards={n}", *overrides])
    world = OneRank(cfg)
    world.transport.register("collector0")
    world.transport.register("learner0")
    names = world.topology.names("replay_shard")
    shards = [
        build_replay_shard(cfg, world.spec, world.topology, world.transport, s) for s in names
    ]
    return shards, world


def insert(world: OneRank, shard: ReplayShard, generation: int, n: int) -> None:
    items = item_specs(world.cfg, world.spec)[GROUP]
    batch = {c.name: np.zeros((n, *items.item_shape(c)), c.dtype) for c in items.columns}
    meta = {"group": GROUP, "items": n, "generation": generation}
    world.transport.send(Message("batch", "collector0", shard.name, meta, batch))
    shard.poll()


def checkpoint(run_dir: Path, shards: list[ReplayShard]) -> None:
    records = [write_role_state(run_dir, "000001", s.name, s.state()) for s in shards]
    commit_checkpoint(run_dir, "000001", records, {}, keep=1)


def resumed(run_dir: Path, n: int, *overrides: str) -> list[ReplayShard]:
    shards, _ = shards_of(n, *overrides)
    restore_roles(shards, str(run_dir), "000001", [s.name for s in shards], 20_000)
    return shards


def totals(shards: list[ReplayShard]) -> tuple[int, int]:
    """(evicted, dropped) of the group, summed over shards as the progress rows sum them."""
    rows = [s.counters() for s in shards]
    return sum(r["evicted"][GROUP] for r in rows), sum(r["dropped"][GROUP] for r in rows)


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
@pytest.mark.parametrize(("saved", "resumed_on"), [(2, 1), (1, 3)])
def test_a_reshard_keeps_the_current_iterations_replay(
    tmp_path: Path, algo: str, saved: int, resumed_on: int
) -> None:
    """It emptied it: 4 items, 2 after a resume on another shard count, 0 at the first
    request, which the shards took for a new iteration's."""
    old, world = shards_of(saved, f"learner.algo={algo}")
    for shard in old:
        insert(world, shard, generation=2, n=4)
    checkpoint(tmp_path, old)
    new = resumed(tmp_path, resumed_on, f"learner.algo={algo}")
    assert [s.generations[GROUP] for s in new] == [2] * resumed_on
    for shard in new:  # what a request of the current iteration does first
        assert shard.current(GROUP, 2)
    assert sum(s.tables[GROUP].size for s in new) == 4 * saved


def test_a_reshard_drops_what_a_shard_held_of_an_older_iteration(tmp_path: Path) -> None:
    old, world = shards_of(2)
    insert(world, old[0], generation=2, n=4)
    insert(world, old[1], generation=1, n=3)  # this shard has not heard of iteration 2 yet
    checkpoint(tmp_path, old)
    (new,) = resumed(tmp_path, 1)
    assert new.generations[GROUP] == 2 and new.tables[GROUP].size == 4


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_evicted_and_dropped_only_grow_across_iterations_and_resumes(
    tmp_path: Path, algo: str
) -> None:
    """They went 384, 896, then 0 in a PSRO run: each iteration's new table counted anew."""
    (shard,), world = shards_of(
        1, f"learner.algo={algo}", "replay.table_capacity=4", "learner.batch_size=4"
    )
    insert(world, shard, generation=1, n=6)  # 2 evicted
    if algo == "ppo":  # fragments of policy version 0 asked for at least version 1: dropped
        request = {"group": GROUP, "ranges": [[2, 4]], "min_version": 1}
        world.transport.send(Message("sample_request", "learner0", "replay0", request))
        shard.poll()
    before = totals([shard])
    assert before == ((2, 4) if algo == "ppo" else (2, 0))
    insert(world, shard, generation=2, n=3)  # the next iteration replaces the table
    assert shard.tables[GROUP].size == 3 and totals([shard]) == before
    checkpoint(tmp_path, [shard])
    for n in (1, 2):  # the same shard count, and a re-deal
        assert totals(resumed(tmp_path, n, f"learner.algo={algo}")) == before
