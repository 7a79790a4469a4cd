"""Acting for many agents at once: one batched forward pass per policy key, not per agent.

Recurrent actors carry a state per agent and env copy (`Memory`): `act_all` passes each agent's
state in and stores the next one, and the caller zeroes a copy's states where its episode ends,
so no state leaks from one episode into the next."""

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
    memory: Memory | None = None,
    groups: list[tuple[str, list[str]]] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Actions of every agent and what each actor recorded beside them (e.g. `log_probs`),
    with one forward pass per key over the agents bound to it, among each agent's legal
    actions when the env has `masks`. An agent's index (for actors that take it) is its place
    among the agents bound to its key, in environment order. `greedy` is for every key, or
    the set of keys that act greedily (PSRO's frozen opponents) while the others explore.
    Recurrent actors read and advance their agents' states in `memory`. `groups`: the
    bindings grouped by key (`agents_by_key`), for a caller that acts every step with the
    same bindings and groups them once."""
    if groups is None:
        groups = agents_by_key(bindings)
    actions: dict[str, np.ndarray] = {}
    extras: dict[str, dict[str, np.ndarray]] = {}
    for key, agents in groups:
        actor = actors[key]
        spec = actor.spec
        key_greedy = greedy if isinstance(greedy, bool) else key in greedy
        index = None
        if spec.agent_ids:
            index = np.repeat(np.arange(len(agents)), len(obs[agents[0]]))
        recurrent = memory if spec.recurrent else None
        state = None
        if recurrent is not None:
            state = recurrent.joined(agents, len(obs[agents[0]]), spec.recurrent)
        result = actor.act(
            _joined(obs, agents),
            rng,
            env_steps=env_steps,
            greedy=key_greedy,
            action_mask=None if masks is None else _joined(masks, agents),
            recurrent_state=state,
            agent_index=index,
        )
        if len(agents) == 1:
            actions[agents[0]], extras[agents[0]] = result.actions, result.extras
        else:
            rows = len(result.actions) // len(agents)  # slices: np.split costs ten times more
            for i, agent in enumerate(agents):
                part = slice(i * rows, (i + 1) * rows)
                actions[agent] = result.actions[part]
                extras[agent] = {k: v[part] for k, v in result.extras.items()}
        if recurrent is not None and result.recurrent_state is not None:
            recurrent.store(agents, result.recurrent_state)
    return actions, extras


def agents_by_key(bindings: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(key, the agents bound to it in environment order) per key, in order of first use."""
    by_key: dict[str, list[str]] = {}
    for agent, key in bindings.items():
        by_key.setdefault(key, []).append(agent)
    return list(by_key.items())


def _joined(arrays: dict[str, np.ndarray], agents: list[str]) -> np.ndarray:
    """The agents' rows stacked (one agent's as they are: no copy, and no list made, on the
    common path)."""
    return arrays[agents[0]] if len(agents) == 1 else np.concatenate([arrays[a] for a in agents])


class Memory:
    """Recurrent states per agent, [env copies, width]; an agent without one starts at zeros."""

    def __init__(self) -> None:
        self.states: dict[str, np.ndarray] = {}

    def joined(self, agents: list[str], copies: int, width: int) -> np.ndarray:
        """The agents' states stacked in `agents` order, [len(agents) * copies, width]."""
        parts = []
        for agent in agents:
            state = self.states.get(agent)
            if state is None or state.shape != (copies, width):
                state = np.zeros((copies, width), np.float32)
            parts.append(state)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def store(self, agents: list[str], joined: np.ndarray) -> None:
        rows = len(joined) // len(agents)
        for i, agent in enumerate(agents):
            self.states[agent] = joined[i * rows : (i + 1) * rows]

    def reset(self, copies: np.ndarray | None = None) -> None:
        """Zero the states of the env copies `copies` (bool [num_envs]) or of every copy."""
        if copies is None:
            self.states.clear()
            return
        if self.states and copies.any():  # feed-forward actors keep no states: no test
            for state in self.states.values():
                state[copies] = 0.0
