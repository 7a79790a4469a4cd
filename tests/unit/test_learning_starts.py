"""replay.learning_starts=0, which the schema allows, serves samples from the first insert on
instead of failing every DQN job at start-up (`min_size_to_sample must be >= 1`)."""

from __future__ import annotations

from collections import deque

import numpy as np

from hpcmarl.comm.protocol import Message
from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import build_replay_shard, item_specs
from hpcmarl.testing.world import OneRank


def test_learning_starts_0_serves_from_the_first_insert() -> None:
    cfg = load_job("jobs/cartpole_dqn.yaml", ["replay.learning_starts=0"])
    world = OneRank(cfg)
    shard = build_replay_shard(cfg, world.spec, world.topology, world.transport, "replay0")
    ((group, items),) = item_specs(cfg, world.spec).items()
    learner: deque[Message] = world.transport.register("learner0")
    world.transport.register("collector0")
    batch = {c.name: np.zeros((8, *items.item_shape(c)), c.dtype) for c in items.columns}
    world.transport.send(Message("batch", "collector0", "replay0", {"group": group}, batch))
    request = Message("sample_request", "learner0", "replay0", {"group": group, "n": 4})
    world.transport.send(request)
    shard.poll()
    samples = [m for m in learner if m.kind == "sample"]
    assert len(samples) == 1 and len(samples[0].arrays["rewards"]) == 4
