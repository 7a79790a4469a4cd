"""Acting for many agents at once: one batched forward pass per policy, not per agent."""

from __future__ import annotations

import numpy as np

from ..algos.dqn import QActor


def act_all(
    actors: dict[str, QActor],
    policy_of: dict[str, str],
    obs: dict[str, np.ndarray],
    epsilon: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Actions of every agent, one batched forward pass per policy."""
    by_policy: dict[str, list[str]] = {}
    for agent in obs:
        by_policy.setdefault(policy_of[agent], []).append(agent)
    actions = {}
    for policy, agents in by_policy.items():
        if len(agents) == 1:
            actions[agents[0]] = actors[policy].act(obs[agents[0]], epsilon, rng)
            continue
        joined = actors[policy].act(np.concatenate([obs[a] for a in agents]), epsilon, rng)
        for agent, part in zip(agents, np.split(joined, len(agents)), strict=True):
            actions[agent] = part
    return actions
