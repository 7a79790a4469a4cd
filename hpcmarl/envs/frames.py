"""Frame stacks for PettingZoo parallel envs (`replay.stack_num` k > 1), as gymnasium's
`FrameStackObservation(padding_type="reset")` makes them for one agent: each agent observes its
last k observations, newest last, on a new first axis; at an episode's start its first
observation stands in for those before it. An agent that has finished observes nothing more,
so its stack stops with it. The global state (`state()`) is the env's own, unstacked.

Only array observations stack (Box spaces); an env whose observations carry action masks or
other structure stacks its own frames (`replay.save_only_last_obs`) or runs unstacked.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium
import numpy as np

from hpcmarl.errors import EnvError


class ParallelFrameStack:
    """A PettingZoo parallel env whose observations are each agent's last `k` frames; every
    other attribute (agents, action spaces, `state()`, `close()`) is the env's."""

    def __init__(self, env: Any, k: int, env_id: str) -> None:
        self.env, self.k = env, k
        self._spaces: dict[str, gymnasium.spaces.Box] = {}
        for agent in env.possible_agents:
            space = env.observation_space(agent)
            if not isinstance(space, gymnasium.spaces.Box):
                raise EnvError(
                    f"replay.stack_num {k} stacks array observations, and {agent} of {env_id} "
                    f"observes {space}",
                    "give the env stacked observations itself and set "
                    "replay.save_only_last_obs=true, or set replay.stack_num=1",
                )
            low = np.repeat(space.low[None], k, axis=0)
            high = np.repeat(space.high[None], k, axis=0)
            self._spaces[agent] = gymnasium.spaces.Box(low, high, dtype=space.dtype)
        self._frames: dict[str, deque[np.ndarray]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        return self._spaces[agent]

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed)
        self._frames = {a: deque([np.asarray(o)] * self.k, maxlen=self.k) for a, o in obs.items()}
        return self._stacks(obs), infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        for agent, frame in obs.items():
            frames = self._frames.get(agent)
            if frames is None:  # an agent that joins mid-episode starts its own stack
                frames = self._frames[agent] = deque([np.asarray(frame)] * self.k, self.k)
            frames.append(np.asarray(frame))
        return self._stacks(obs), rewards, terminations, truncations, infos

    def _stacks(self, obs: dict[str, Any]) -> dict[str, np.ndarray]:
        return {agent: np.stack(self._frames[agent]) for agent in obs}
