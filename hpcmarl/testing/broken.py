"""A tiny gymnasium environment that goes wrong on purpose, for the checks on what envs return.

`env.kind: gymnasium`, `env.id: hpcmarl.testing.broken:Broken-v0` (gymnasium imports this
module, which registers the id). Observations are 4 floats, 2 actions, reward 1 a step; an
episode ends after `episode_steps` steps (terminated), or never when that is None: the id is
registered without a time limit, so `episode_steps=None` is an env with no end at all.

`fault` names what goes wrong from the env's `at_step`-th step on (counted over its whole life,
not per episode): `nan_reward`, `none_reward`, `nan_obs`, `short_obs` (shape (1,) where the
space says (4,)), `text_obs` (a string array) or `nan_reset` (a NaN in the first observation of
every episode that starts then); `none` (the default) is a well-behaved env.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "Broken-v0"
FAULTS = ("none", "nan_reward", "none_reward", "nan_obs", "short_obs", "text_obs", "nan_reset")


class Broken(gymnasium.Env):
    """See the module docstring."""

    def __init__(self, fault: str = "none", at_step: int = 200, episode_steps: int | None = 50):
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {FAULTS}")
        self.fault, self.at_step, self.episode_steps = fault, at_step, episode_steps
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.steps = 0
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        obs = self._obs()
        if self.fault == "nan_reset" and self.steps >= self.at_step:
            obs[0] = np.nan
        return obs, {}

    def step(self, action: int) -> tuple[Any, Any, bool, bool, dict]:
        self.steps += 1
        self.t += 1
        broken = self.steps >= self.at_step
        obs: Any = self._obs()
        reward: Any = 1.0
        if broken and self.fault == "nan_reward":
            reward = float("nan")
        elif broken and self.fault == "none_reward":
            reward = None
        elif broken and self.fault == "nan_obs":
            obs[2] = np.nan
        elif broken and self.fault == "short_obs":
            obs = obs[:1]
        elif broken and self.fault == "text_obs":
            obs = np.array(["a", "b", "c", "d"])
        ended = self.episode_steps is not None and self.t >= self.episode_steps
        return obs, reward, ended, False, {}

    def _obs(self) -> np.ndarray:
        phase = self.t / 10.0
        return np.array([np.sin(phase), np.cos(phase), 0.5, -0.5], np.float32)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:Broken")
