"""Which replay shards a deterministic off-policy learner samples: together, a group's
learners sample every shard (collectors deal each group's items over all of them), and no two
of them share one unless the group has more learners than there are shards. It sampled only
shard `learner index mod S`: `spread_independent.yaml` (one learner) on 2 shards never
sampled replay1."""

from __future__ import annotations

import pytest

from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import probe_env
from hpcmarl.launch.plan import learner_shards
from hpcmarl.launch.topology import build_topology


@pytest.mark.parametrize(
    ("job", "learners", "shards"),
    [
        ("jobs/spread_independent.yaml", 1, 2),
        ("jobs/spread_independent.yaml", 3, 2),
        ("jobs/default.yaml", 2, 3),
        ("jobs/default.yaml", 1, 3),
        ("jobs/default.yaml", 2, 2),
        ("jobs/default.yaml", 4, 2),
    ],
)
def test_a_groups_learners_sample_every_shard(job: str, learners: int, shards: int) -> None:
    overrides = [f"topology.learners={learners}", f"topology.replay_shards={shards}"]
    cfg = load_job(job, ["commander.deterministic=true", *overrides])
    topology = build_topology(16, cfg.topology, probe_env(cfg).training_groups())
    every = topology.names("replay_shard")
    assert sum(map(len, topology.learners_of_group.values())) >= learners
    for group, members in topology.learners_of_group.items():
        sampled = [learner_shards(cfg, topology, name) for name in members]
        assert sorted({s for mine in sampled for s in mine}) == every, group
        if len(members) <= shards:  # no shard sampled by two of them
            assert sum(len(mine) for mine in sampled) == shards, (group, sampled)
