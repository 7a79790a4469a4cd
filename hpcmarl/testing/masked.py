"""A tiny gymnasium environment whose legal actions change every step, for masked learners.

`env.kind: gymnasium`, `env.id: hpcmarl.testing.masked:MaskedChoice-v0` (gymnasium imports this
module, which registers the id). Four actions, two of them legal at each step, drawn at random
and given as `info["action_mask"]`. The observation is [context, mask]: a context bit drawn each
step, then the legal actions as 0/1. The reward of action a is `VALUES[context][a]`, so the best
legal action depends on both the context and the mask. An episode is `horizon` steps (then
truncated). Random legal play earns 0.5 a step, the best legal action 7/9 a step
(`RANDOM_STEP_VALUE`, `BEST_STEP_VALUE`). Choosing an illegal action raises `IllegalAction`: a
learner that ignored the mask would be caught at once.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from hpcmarl.errors import EnvError

ENV_ID = "MaskedChoice-v0"
N_ACTIONS = 4
LEGAL_PER_STEP = 2
VALUES = np.array([[0.0, 1 / 3, 2 / 3, 1.0], [1.0, 2 / 3, 1 / 3, 0.0]], np.float32)
"""Reward of each action in context 0 and context 1."""
RANDOM_STEP_VALUE = 0.5
"""Expected reward per step of a uniformly random legal action."""
BEST_STEP_VALUE = 7 / 9
"""Expected reward per step of the best legal action (the larger of two distinct values)."""


class IllegalAction(EnvError):
    """An action the mask ruled out was chosen."""


class MaskedChoice(gymnasium.Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, horizon: int = 10) -> None:
        self.horizon = horizon
        self.observation_space = spaces.Box(0.0, 1.0, (1 + N_ACTIONS,), np.float32)
        self.action_space = spaces.Discrete(N_ACTIONS)
        self.t = 0
        self.context = 0
        self.mask = np.ones(N_ACTIONS, bool)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {"action_mask": self.mask.copy()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = int(action)
        if not self.mask[action]:
            raise IllegalAction(
                f"{ENV_ID}: action {action} is illegal; the legal actions are "
                f"{np.flatnonzero(self.mask).tolist()}",
                "act with info['action_mask']",
            )
        reward = float(VALUES[self.context, action])
        self.t += 1
        obs = self._draw()
        return obs, reward, False, self.t >= self.horizon, {"action_mask": self.mask.copy()}

    def _draw(self) -> np.ndarray:
        """A new context and a new legal pair; the observation that shows them."""
        self.context = int(self.np_random.integers(2))
        legal = self.np_random.choice(N_ACTIONS, LEGAL_PER_STEP, replace=False)
        self.mask = np.zeros(N_ACTIONS, bool)
        self.mask[legal] = True
        return np.concatenate([[self.context], self.mask]).astype(np.float32)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:MaskedChoice")
