"""What PSRO asks of the generic roles, checked on real roles in one process: a replay shard
keeps only the newest generation of a group's items (and returns every credit), a learner
switches a group to new keys with fresh networks and publishes them at once, a lone learner
skips an update whose fragments were all too old, and a PSRO job that does not fit is refused
at start-up in one message."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import LocalTransport
from hpcmarl.config.loader import load_job
from hpcmarl.errors import ConfigError, EnvError
from hpcmarl.launch.build import build_learner, build_replay_shard, item_specs, probe_env
from hpcmarl.testing.world import OneRank

JOB = "jobs/kuhn_psro.yaml"


def world(*overrides: str):
    cfg = load_job(JOB, ["replay.learning_starts=1", "topology.learners=1", *overrides])
    world = OneRank(cfg)
    return cfg, world.spec, world.topology, world.transport


def batch_of(cfg, spec, group: str, n: int, value: float) -> dict[str, np.ndarray]:
    items = item_specs(cfg, spec)[group]
    batch = {c.name: np.zeros((n, *items.item_shape(c)), c.dtype) for c in items.columns}
    batch["rewards"][:] = value
    return batch


def test_a_shard_keeps_only_the_newest_generation_of_a_group() -> None:
    cfg, spec, topology, transport = world()
    shard = build_replay_shard(cfg, spec, topology, transport, "replay0")
    credits: deque[Message] = transport.register("collector0")
    samples: deque[Message] = transport.register("learner0")

    def insert(generation: int, value: float, group: str = "player_0") -> None:
        meta = {"group": group, "items": 4, "generation": generation}
        transport.send(
            Message("batch", "collector0", "replay0", meta, batch_of(cfg, spec, group, 4, value))
        )
        shard.poll()

    insert(0, 1.0)
    insert(0, 1.0, group="player_1")
    assert shard.tables["player_0"].size == 4
    insert(1, 2.0)  # the next best response's data: the old items go
    assert shard.tables["player_0"].size == 4 and shard.generations["player_0"] == 1
    assert shard.tables["player_1"].size == 4  # the other group is untouched
    insert(0, 1.0)  # a straggler of the previous iteration: dropped, its credit returned
    assert shard.tables["player_0"].size == 4 and shard.stale == 1
    assert sum(m.meta["n"] for m in credits if m.kind == "credit") == 4  # one per batch
    request = {"group": "player_0", "n": 8, "generation": 1}
    transport.send(Message("sample_request", "learner0", "replay0", request))
    shard.poll()
    (reply,) = [m for m in samples if m.kind == "sample"]
    assert reply.arrays is not None and set(reply.arrays["rewards"].tolist()) == {2.0}
    # A request of a newer generation empties the table and waits for that generation's data.
    transport.send(Message("sample_request", "learner0", "replay0", request | {"generation": 2}))
    shard.poll()
    assert shard.tables["player_0"].size == 0 and len(shard.pending_samples) == 1
    restored = build_replay_shard(cfg, spec, topology, LocalTransport(topology.rank_of), "replay0")
    restored.load_state(shard.state())
    assert restored.generations == {"player_0": 2, "player_1": 0}


def test_a_learner_switches_a_group_to_new_keys_with_fresh_networks() -> None:
    cfg, spec, topology, transport = world()
    (name,) = topology.names("learner")
    learner = build_learner(cfg, spec, topology, transport, None, name, cfg.runtime.run_dir)
    pushes: deque[Message] = transport.register("ps0")
    transport.register("commander")
    trainer = learner.trainers["player_0"]
    before = trainer.algo.group_weights().copy()
    learner.started = True
    train = {"player_0": {"keys": {"player_0": "main/player_0-1"}, "generation": 1}}
    task = {"task_id": "t/learner0", "updates": 0, "train": train}
    transport.send(Message("task", "commander", name, task))
    learner.poll()
    assert trainer.keys == {"player_0": "main/player_0-1"} and trainer.generation == 1
    assert not np.array_equal(trainer.algo.group_weights(), before)  # a new network
    (push,) = [m for m in pushes if m.kind == "weights_push"]
    assert push.meta["key"] == "main/player_0-1" and "spec" in push.meta  # announced with it
    assert trainer.version == 1
    state = learner.state()
    again = build_learner(
        cfg, spec, topology, LocalTransport(topology.rank_of), None, name, cfg.runtime.run_dir
    )
    again.load_state(state)
    resumed = again.trainers["player_0"]
    assert resumed.keys == trainer.keys and resumed.generation == 1
    np.testing.assert_array_equal(resumed.algo.group_weights(), trainer.algo.group_weights())


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        (["learner.algo=r2d2"], ConfigError, "cannot be PSRO's best-response oracle"),
        (["commander.deterministic=true"], ConfigError, "drop offline.dataset and"),
        (
            ["env.kind=pettingzoo", "env.id=mpe2.simple_spread_v3"],
            ConfigError,
            "PSRO plays two-player games",
        ),
        (["env.id=kuhn_poker", "env.kwargs={players: 3}"], ConfigError, "PSRO plays two-player"),
    ],
)
def test_a_psro_job_that_does_not_fit_is_refused(overrides, error, words) -> None:
    cfg = load_job(JOB, overrides)
    with pytest.raises(error, match=words):
        probe_env(cfg)


def test_exploitability_needs_a_zero_sum_game() -> None:
    cfg = load_job(JOB, ["env.id=tiny_hanabi"])
    with pytest.raises(EnvError, match="psro.exploitability: .*not zero-sum"):
        probe_env(cfg)


def test_a_lone_learner_skips_an_update_whose_fragments_were_all_stale() -> None:
    # PPO as PSRO's oracle: the shard drops fragments older than max_policy_lag versions.
    # An update left with none must not step the optimizer or report a loss of 0.0 as if it
    # had trained: it is skipped and counted, and its unchanged weights are the next version
    # (the commander's books count one version per batch).
    cfg, spec, topology, transport = world(
        "learner.algo=mappo", "learner.ppo.max_policy_lag=1", "psro.exploitability=false"
    )
    shard = build_replay_shard(cfg, spec, topology, transport, "replay0")
    (name,) = topology.names("learner")
    learner = build_learner(cfg, spec, topology, transport, None, name, cfg.runtime.run_dir)
    commander: deque[Message] = transport.register("commander")
    pushes: deque[Message] = transport.register("ps0")
    transport.register("collector0")
    stale = batch_of(cfg, spec, "player_0", 4, 1.0)
    stale["policy_version"][:] = 1
    meta = {"group": "player_0", "items": 4, "generation": 0}
    transport.send(Message("batch", "collector0", "replay0", meta, stale))
    shard.poll()
    trainer = learner.trainers["player_0"]
    learner.started, trainer.version = True, 3  # two updates on: version 1 is too old
    before = trainer.algo.group_weights().copy()
    take = {"player_0": {"replay0": [[0, 4]]}}
    task = {"task_id": "t/learner0", "updates": 1, "take": take}
    transport.send(Message("task", "commander", name, task))
    for _ in range(100):  # until the task is done (an update on nothing took several polls)
        learner.poll()
        shard.poll()
        if any(m.kind == "task_done" for m in commander):
            break
    (done,) = [m for m in commander if m.kind == "task_done"]
    row = done.meta["stats"]["groups"]["player_0"]
    assert row["dropped"] == {"replay0": 4}
    assert "policy_loss" not in row and row["updates"] == 0 and row["empty_updates"] == 1
    np.testing.assert_array_equal(trainer.algo.group_weights(), before)
    assert row["version"] == 4
    (push,) = [m for m in pushes if m.kind == "weights_push" and m.meta["key"] in trainer.specs]
    assert push.arrays is not None
    np.testing.assert_array_equal(push.arrays["weights"], trainer.algo.publish()[push.meta["key"]])
