"""A user's networks and a tiny image env, outside the package: what `learner.model.torso`
names in tests (`tests.unit.user_nets:small_torso`), as a user's own module would be named."""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
from torch import nn

IMAGE_ENV = "TinyImage-v0"
IMAGE_SHAPE = (12, 12, 3)


def small_torso(observation_space: gymnasium.spaces.Box, width: int = 24) -> nn.Module:
    """Observations [B, *shape] to `width` tanh features."""
    size = math.prod(observation_space.shape)
    return nn.Sequential(nn.Flatten(), nn.Linear(size, width), nn.Tanh())


def returns_a_list(observation_space: gymnasium.Space) -> Any:
    return [nn.Linear(4, 4)]


def one_feature_per_batch(observation_space: gymnasium.Space) -> nn.Module:
    """Ends in a 1-D output: no features axis."""
    return nn.Sequential(nn.Flatten(0), nn.LazyLinear(1))


def raises(observation_space: gymnasium.Space, width: int = 8) -> nn.Module:
    raise ValueError("no network for this space")


NOT_CALLABLE = 42


class TinyImageEnv(gymnasium.Env):
    """12x12x3 uint8 images with a bright square on the left or the right half; the reward is 1
    for naming the half (action 0: left, 1: right); 8 steps an episode."""

    observation_space = gymnasium.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return self._draw(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.side)
        self.steps += 1
        return self._draw(), reward, False, self.steps >= 8, {}

    def _draw(self) -> np.ndarray:
        self.side = int(self.np_random.integers(2))
        image = self.np_random.integers(0, 40, IMAGE_SHAPE, dtype=np.uint8)
        column = 2 if self.side == 0 else 7
        image[4:8, column : column + 3] = 255
        return image


if IMAGE_ENV not in gymnasium.registry:
    gymnasium.register(id=IMAGE_ENV, entry_point=f"{__name__}:TinyImageEnv")
