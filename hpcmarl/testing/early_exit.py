"""A tiny PettingZoo parallel environment in which one agent finishes before the other.

`env.kind: pettingzoo`, `env.id: hpcmarl.testing.early_exit`. Two agents: `runner` lives for
`runner_steps` steps (then the episode is truncated), `quitter` terminates after
`quitter_steps`. Every real observation is [1, t / runner_steps, agent index], never all zeros,
so padding rows of a finished agent (zeros) are easy to tell from its real ones. Reward: 1 for
action 1, 0 for action 0; a policy that learns anything learns to press 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

AGENTS = ("quitter", "runner")


class EarlyExit(ParallelEnv):
    metadata = {"name": "early_exit_v0", "render_modes": []}

    def __init__(self, runner_steps: int = 8, quitter_steps: int = 3) -> None:
        self.possible_agents = list(AGENTS)
        self.lifetimes = {"quitter": quitter_steps, "runner": runner_steps}
        self.horizon = runner_steps
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 2.0, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        self.t = 0
        self.agents = list(AGENTS)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        terms = {a: a == "quitter" and self.t >= self.lifetimes[a] for a in self.agents}
        truncs = {a: a == "runner" and self.t >= self.lifetimes[a] for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([1.0, self.t / self.horizon, AGENTS.index(agent)], np.float32)


def parallel_env(**kwargs: Any) -> EarlyExit:
    return EarlyExit(**kwargs)
