"""Partially observed tasks: environments whose observation leaves out what a memoryless
policy needs, so that only an agent with memory (a recurrent network) can do well.

`env.kind: gymnasium`, `env.id: hpcmarl.envs.partial:CartPoleNoVelocity-v1` (gymnasium imports
this module, which registers the id): CartPole-v1 observing only the cart position and the pole
angle. The velocities must be inferred from how those change, step to step (RLlib's
"stateless CartPole"). Episodes, rewards and the 500-step limit are CartPole-v1's.

`hpcmarl.envs.partial:CartPoleNoVelocityStacked-v1` is the same env observing its last 4
observations, shape [4, 2], newest last (gymnasium's `FrameStackObservation`, an episode's first
observation standing in before it): an env that stacks its own frames, as Atari's wrappers do,
for `replay.save_only_last_obs`.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "CartPoleNoVelocity-v1"
STACKED_ID = "CartPoleNoVelocityStacked-v1"
STACK = 4
KEPT = np.array([0, 2])
"""CartPole's cart position and pole angle (its velocities, 1 and 3, are dropped)."""


class NoVelocity(gymnasium.ObservationWrapper):
    """CartPole's observation without its two velocities."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, spaces.Box)
        self.observation_space = spaces.Box(box.low[KEPT], box.high[KEPT], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, np.float32)[KEPT]


def make_cartpole_no_velocity(**kwargs: Any) -> gymnasium.Env:
    return NoVelocity(gymnasium.make("CartPole-v1", **kwargs))


def make_stacked_cartpole_no_velocity(**kwargs: Any) -> gymnasium.Env:
    return gymnasium.wrappers.FrameStackObservation(
        make_cartpole_no_velocity(**kwargs), STACK, padding_type="reset"
    )


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:make_cartpole_no_velocity")
if STACKED_ID not in gymnasium.registry:
    gymnasium.register(id=STACKED_ID, entry_point=f"{__name__}:make_stacked_cartpole_no_velocity")
