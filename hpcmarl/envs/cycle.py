"""PettingZoo parallel envs that are AEC envs underneath, stepped without the conversion's waste.

Most PettingZoo parallel envs (every mpe2 one among them) are `aec_to_parallel` over an AEC
env. Its `step` calls `last()` before every agent's move, which computes that agent's
observation and throws it away, and reads each attribute through three wrapper layers; a
centralised critic's `state()` then computes every observation a third time. On mpe2's
simple_spread these made a third of a collector's time per step (docs/performance.md,
"Collectors on simple_spread"). `AecCycle` plays the same cycle through the same wrapped AEC env
(its checks and clipping stay) and returns the same dicts, reading the live agents and their
flags from the env itself; where the env's `state()` is known to be its observations side by
side (mpe2's `SimpleEnv`, checked against the real `state()` at every reset), it is built from
the observations the step already computed.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

import numpy as np

from hpcmarl.extras import require


def fast_parallel(env: Any) -> Any:
    """`env` stepped by `AecCycle` when it is PettingZoo's AEC-to-parallel conversion, else
    `env` itself."""
    conversions = require("pettingzoo.utils.conversions", "env.kind=pettingzoo")
    return AecCycle(env) if type(env) is conversions.aec_to_parallel_wrapper else env


class AecCycle:
    """The parallel API over `parallel.aec_env`, with PettingZoo's cycle semantics: every live
    agent moves once, in turn, rewards summed over the cycle, agents that finished removed at
    the cycle's end. Anything else (spaces, `possible_agents`, `close`) is the conversion's."""

    def __init__(self, parallel: Any) -> None:
        self.parallel = parallel
        self.aec = parallel.aec_env
        self.raw = parallel.aec_env.unwrapped
        self.state_from_observations = state_is_observations(self.raw)
        """Whether `state()` is the observations of `possible_agents` side by side; turned off
        at a reset where the env's own `state()` says otherwise."""
        self._observations: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parallel, name)

    @property
    def agents(self) -> list[str]:
        return self.raw.agents

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        observations, infos = self.parallel.reset(seed=seed, options=options)
        self._observations = observations
        if self.state_from_observations:
            own = np.reshape(self.parallel.state(), -1)
            side_by_side = self._side_by_side()
            self.state_from_observations = side_by_side is not None and np.array_equal(
                own, side_by_side
            )
        return observations, infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        aec, raw = self.aec, self.raw
        rewards: defaultdict[str, float] = defaultdict(float)
        for agent in list(raw.agents):
            if agent != raw.agent_selection:
                raise AssertionError(
                    f"{type(raw).__name__} expected agent {raw.agent_selection} to move, not "
                    f"{agent}: a parallel env's agents step in a cycle and finish only at its end"
                )
            aec.step(actions[agent])
            for live in raw.agents:
                rewards[live] += raw.rewards[live]
        terminations, truncations = dict(raw.terminations), dict(raw.truncations)
        infos = dict(raw.infos)
        observations = {agent: aec.observe(agent) for agent in raw.agents}
        while raw.agents and (
            raw.terminations[raw.agent_selection] or raw.truncations[raw.agent_selection]
        ):
            aec.step(None)
        self._observations = observations
        return observations, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        if self.state_from_observations:
            side_by_side = self._side_by_side()
            if side_by_side is not None:
                return side_by_side
        return self.parallel.state()

    def _side_by_side(self) -> np.ndarray | None:
        """The observations of every possible agent concatenated, or None when one is
        missing (an agent that finished early)."""
        observations = self._observations
        if any(agent not in observations for agent in self.raw.possible_agents):
            return None
        return np.concatenate([observations[a] for a in self.raw.possible_agents], axis=None)


def state_is_observations(raw: Any) -> bool:
    """mpe2's `SimpleEnv.state()` concatenates `observe(agent)` over `possible_agents`; a
    subclass that overrides `state` is not taken to. An mpe2 env has loaded mpe2's module, so
    any other env never imports mpe2 here."""
    simple_env = sys.modules.get("mpe2._mpe_utils.simple_env")
    if simple_env is None:
        return False
    return isinstance(raw, simple_env.SimpleEnv) and type(raw).state is simple_env.SimpleEnv.state
