"""PettingZoo AEC environments (the classic board and card games) as turn-based copies.

`env.kind: pettingzoo` with a module that has no `parallel_env()` but an `env()`, such as
`pettingzoo.classic.tictactoe_v3`. The agent whose turn it is (`agent_selection`) is the one
`active` agent of a step; the others' actions are ignored. Observations are PettingZoo's
classic dicts: the `observation` part is what an agent observes, the `action_mask` part the
mover's legal actions (every other agent gets all actions, as in `envs.openspiel`). The steps
PettingZoo needs for agents that are done (`step(None)`) are taken inside the copy, their
rewards added to the step's. The episode is over when no agent is left. A mover's `Box`
action is clipped to its bounds, as in the parallel adapters (items keep the unclipped sample).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from hpcmarl.envs.adapters import PettingZooSpaces, StepBuffers
from hpcmarl.errors import EnvError


class AECCopy(PettingZooSpaces):
    """One PettingZoo AEC env; see the module docstring for what a step is."""

    turn_based = True

    def __init__(self, env: Any, env_id: str) -> None:
        super().__init__(env, env_id)
        self.env_id = env_id
        dims = [gymnasium.spaces.flatdim(self.observation_spaces[a]) for a in self.agents]
        self.state_dim = sum(dims)
        self._last = [np.zeros(d, np.float32) for d in dims]
        self._index = {a: k for k, a in enumerate(self.agents)}
        self._mover_mask: Any = None

    def state_into(self, i: int, out: np.ndarray) -> None:
        """Every agent's observation side by side (zeros for agents that are done)."""
        out[i] = np.concatenate(self._last)

    def masks_into(self, i: int, out: list[np.ndarray]) -> None:
        for mask in out:
            mask[i] = True
        if self.env.agents and self._mover_mask is not None:
            out[self._index[self.env.agent_selection]][i] = self._mover_mask

    def reset_into(self, seed: int | None, i: int, obs: list[np.ndarray]) -> None:
        self.env.reset(seed=seed)
        self._write_obs(i, obs)

    def step_into(self, actions: list[Any], i: int, out: StepBuffers) -> bool:
        env = self.env
        mover = env.agent_selection
        k = self._index[mover]
        clip = self._box[k]
        if clip is not None:  # a Box: clipped to its bounds, as the parallel adapters do
            action = clip(actions[k])
        else:
            action = actions[k] + self._offset[k] if self._offset[k] else actions[k]
            self._check_legal(mover, action)
        env.step(action)
        out.rewards[:, i] = [env.rewards.get(a, 0.0) for a in self.agents]
        out.terminations[:, i] = [env.terminations.get(a, True) for a in self.agents]
        out.truncations[:, i] = [env.truncations.get(a, False) for a in self.agents]
        self._write_obs(i, out.obs)
        out.rewards[:, i] += self._step_finished_agents()
        out.active[:, i] = False
        out.active[k, i] = True
        return not env.agents

    def close(self) -> None:
        self.env.close()

    def _step_finished_agents(self) -> np.ndarray:
        """PettingZoo's `step(None)` for every agent that is done, with what they bring."""
        env, extra = self.env, np.zeros(len(self.agents), np.float32)
        while env.agents and (
            env.terminations[env.agent_selection] or env.truncations[env.agent_selection]
        ):
            env.step(None)
            extra += [env.rewards.get(a, 0.0) for a in self.agents]
        if env.agents and self.has_masks:
            self._mover_mask = env.observe(env.agent_selection)["action_mask"]
        return extra

    def _write_obs(self, i: int, arrays: list[np.ndarray]) -> None:
        live = set(self.env.agents)
        for k, agent in enumerate(self.agents):
            if agent not in live:
                arrays[k][i] = 0.0
            else:
                seen = self.env.observe(agent)
                if self.has_masks:
                    if agent == self.env.agent_selection:
                        self._mover_mask = seen["action_mask"]
                    seen = seen["observation"]
                arrays[k][i] = self._flat[k](seen)
            self._last[k] = arrays[k][i]

    def _check_legal(self, mover: str, action: Any) -> None:
        if self._mover_mask is None or self._mover_mask[action]:
            return
        legal = np.flatnonzero(self._mover_mask).tolist()
        raise EnvError(
            f"{mover} chose action {action} in {self.env_id}, which is illegal here; the legal "
            f"actions are {legal}",
            "act with the env's action_masks (a policy that ignores them is a bug)",
        )
