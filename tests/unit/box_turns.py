"""A tiny turn-based (AEC) PettingZoo env with continuous actions, outside the package, as a
user's module would be named: `env.kind=pettingzoo env.id=tests.unit.box_turns`.

Two players move in turn, four moves each a game. A move is one number in [-1, 1]; the mover
earns 1 - (move - target)^2, its target being 0.5 for `first` and -0.5 for `second`, which
each observes beside the other's last move. A move outside the bounds is refused, so a policy's
unbounded Gaussian sample reaches the env only through hpcmarl's clipping.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from pettingzoo import AECEnv

AGENTS = ("first", "second")
TARGETS = {"first": 0.5, "second": -0.5}
MOVES = 8
"""Moves a game, both players together."""


class BoxTurns(AECEnv):
    """See the module docstring."""

    metadata = {"name": "box_turns_v0", "is_parallelizable": False}

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = list(AGENTS)
        self.last_move = np.zeros(1, np.float32)
        """The move the env was last given (what a test checks clipping by)."""

    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        return gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent: str) -> gymnasium.spaces.Box:
        return gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([TARGETS[agent], self.last_move[0]], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> None:
        self.agents = list(AGENTS)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict] = {a: {} for a in self.agents}
        self.agent_selection, self.moves = self.agents[0], 0
        self.last_move = np.zeros(1, np.float32)

    def step(self, action: Any) -> None:
        mover = self.agent_selection
        if self.terminations[mover] or self.truncations[mover]:
            self._was_dead_step(action)
            return
        if not self.action_space(mover).contains(np.asarray(action, np.float32)):
            raise ValueError(f"move {action!r} is outside [-1, 1]")
        self.last_move = np.asarray(action, np.float32).reshape(1)
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[mover] = 1.0 - float(self.last_move[0] - TARGETS[mover]) ** 2
        self.moves += 1
        if self.moves == MOVES:
            self.terminations = {a: True for a in self.agents}
        self.agent_selection = AGENTS[self.moves % 2]
        self._cumulative_rewards[mover] = 0.0
        self._accumulate_rewards()


def env() -> BoxTurns:
    """What `env.kind=pettingzoo` calls for a module without `parallel_env()`."""
    return BoxTurns()
