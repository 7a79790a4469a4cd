"""Acting for many agents at once: one batched forward pass per policy key, not per agent."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import numpy as np

from ..algos.contract import Actor


def act_all(
    actors: dict[str, Actor],
    bindings: dict[str, str],
    obs: dict[str, np.ndarray],
    rng: np.random.Generator,
    env_steps: int,
    greedy: bool | AbstractSet[str],
    masks: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Actions of every agent and what each actor recorded beside them (e.g. `log_probs`),
    with one forward pass per key over the agents bound to it, among each agent's legal
    actions when the env has `masks`. An agent's index (for actors that take it) is its place
    among the agents bound to its key, in environment order. `greedy` is for every key, or
    the set of keys that act greedily (PSRO's frozen opponents) while the others explore."""
    by_key: dict[str, list[str]] = {}
    for agent in bindings:
        by_key.setdefault(bindings[agent], []).append(agent)
    actions: dict[str, np.ndarray] = {}
    extras: dict[str, dict[str, np.ndarray]] = {}
    for key, agents in by_key.items():
        actor = actors[key]
        key_greedy = greedy if isinstance(greedy, bool) else key in greedy
        index = None
        if actor.spec.agent_ids:
            index = np.repeat(np.arange(len(agents)), len(obs[agents[0]]))
        if len(agents) == 1:
            mask = None if masks is None else masks[agents[0]]
            result = actor.act(
                obs[agents[0]],
                rng,
                env_steps=env_steps,
                greedy=key_greedy,
                action_mask=mask,
                agent_index=index,
            )
            actions[agents[0]], extras[agents[0]] = result.actions, result.extras
            continue
        joined = np.concatenate([obs[a] for a in agents])
        mask = None if masks is None else np.concatenate([masks[a] for a in agents])
        result = actor.act(
            joined, rng, env_steps=env_steps, greedy=key_greedy, action_mask=mask, agent_index=index
        )
        parts = np.split(result.actions, len(agents))
        split_extras = {k: np.split(v, len(agents)) for k, v in result.extras.items()}
        for i, agent in enumerate(agents):
            actions[agent] = parts[i]
            extras[agent] = {k: v[i] for k, v in split_extras.items()}
    return actions, extras
