"""Fragments: rows land in order per env copy and split into one batch per policy."""

from __future__ import annotations

import numpy as np

from hpcmarl.roles.fragment import FragmentBuilder


def fill(builder: FragmentBuilder, steps: int) -> None:
    for t in range(steps):
        for i, agent in enumerate(builder.agents):
            obs = np.full((builder.num_envs, 2), t, np.float32)
            builder.add(
                agent,
                {
                    "observations": obs,
                    "next_observations": obs + 1,
                    "actions": np.arange(builder.num_envs) + 10 * i,
                    "rewards": np.full(builder.num_envs, t, np.float32),
                    "terminations": False,
                    "truncations": False,
                    "episode_id": np.arange(builder.num_envs),
                    "step": t,
                    "policy_version": 7,
                },
            )
        builder.advance()


def test_shared_policy_joins_agents_and_keeps_env_copies_time_ordered() -> None:
    agents = ["a", "b"]
    builder = FragmentBuilder(agents, {"a": "p", "b": "p"}, {"a": 2, "b": 2}, 3, 2)
    fill(builder, 3)
    batches = builder.batches()
    assert list(batches) == ["p"]
    batch = batches["p"]
    assert len(batch["rewards"]) == 2 * 3 * 2
    # agent a, env 0: steps 0,1,2; then env 1: steps 0,1,2; then agent b.
    assert batch["step"].tolist() == [0, 1, 2] * 4
    assert batch["episode_id"].tolist() == [0, 0, 0, 1, 1, 1] * 2
    assert batch["agent_id"].tolist() == [0] * 6 + [1] * 6
    assert batch["actions"].tolist() == [0, 0, 0, 1, 1, 1, 10, 10, 10, 11, 11, 11]
    assert (batch["policy_version"] == 7).all()


def test_independent_policies_get_their_own_batches_and_reset_gives_new_arrays() -> None:
    builder = FragmentBuilder(["a", "b"], {"a": "a", "b": "b"}, {"a": 2, "b": 2}, 2, 1)
    fill(builder, 2)
    before = builder.batches()
    assert sorted(before) == ["a", "b"]
    old = builder.columns["a"]["observations"]
    builder.reset()
    assert builder.columns["a"]["observations"] is not old
