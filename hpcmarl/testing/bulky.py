"""CartPole with a 1 KB observation, for benchmarks whose replay tables must grow to GiB.

`env.kind: gymnasium`, `env.id: hpcmarl.testing.bulky:BulkyCartPole-v1`: CartPole-v1 whose
observation is its 4 numbers followed by 252 zeros (256 float32, 1,024 bytes), so that a run's
replay table costs 2 KB per transition (observation and next observation) while the env still
steps as fast as CartPole. `tools/bench_checkpoint.py` uses it to checkpoint big tables.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "BulkyCartPole-v1"
FLOATS = 256


class Padded(gymnasium.ObservationWrapper):
    """The observation padded with zeros to `FLOATS` float32 values."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, spaces.Box)
        low = np.zeros(FLOATS, np.float32)
        high = np.zeros(FLOATS, np.float32)
        low[:4], high[:4] = box.low, box.high
        self.observation_space = spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        out = np.zeros(FLOATS, np.float32)
        out[:4] = observation
        return out


def make_bulky_cartpole(**kwargs: Any) -> gymnasium.Env:
    return Padded(gymnasium.make("CartPole-v1", **kwargs))


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:make_bulky_cartpole")
