"""Fixed-length trajectory fragments, written in place and split into one batch per policy.

A collector steps `num_envs` copies of an environment; every step writes one row per copy per
agent into preallocated arrays. At the end of a fragment the rows of all agents that act with
the same policy are joined into that policy's batch, with the column names of DESIGN.md §3.
"""

from __future__ import annotations

import numpy as np

from ..core import Batch


class FragmentBuilder:
    """Accumulates `length` vector steps of every agent, then hands out per-policy batches."""

    def __init__(
        self,
        agents: list[str],
        policy_of: dict[str, str],
        obs_dims: dict[str, int],
        length: int,
        num_envs: int,
    ) -> None:
        self.agents = agents
        self.policy_of = policy_of
        self.obs_dims = obs_dims
        self.length = length
        self.num_envs = num_envs
        self.t = 0
        self.columns: dict[str, Batch] = {}
        self.reset()

    def reset(self) -> None:
        """Fresh arrays: the previous ones now belong to in-flight sends."""
        shape = (self.length, self.num_envs)
        self.t = 0
        self.columns = {
            agent: {
                "observations": np.empty(shape + (self.obs_dims[agent],), np.float32),
                "actions": np.empty(shape, np.int64),
                "rewards": np.empty(shape, np.float32),
                "next_observations": np.empty(shape + (self.obs_dims[agent],), np.float32),
                "terminations": np.empty(shape, np.bool_),
                "truncations": np.empty(shape, np.bool_),
                "agent_id": np.full(shape, i, np.int16),
                "episode_id": np.empty(shape, np.int64),
                "step": np.empty(shape, np.int32),
                "policy_version": np.empty(shape, np.int64),
            }
            for i, agent in enumerate(self.agents)
        }

    def add(self, agent: str, rows: dict[str, np.ndarray | int]) -> None:
        """Write this step's rows of one agent (arrays of length num_envs, or scalars)."""
        columns = self.columns[agent]
        for name, value in rows.items():
            columns[name][self.t] = value

    def advance(self) -> bool:
        """Close the current step; True when the fragment is full."""
        self.t += 1
        return self.t == self.length

    def batches(self) -> dict[str, Batch]:
        """One batch per policy: every agent's rows, time-major per env copy, agents joined."""
        by_policy: dict[str, list[Batch]] = {}
        for agent in self.agents:
            flat = {name: _flatten(a) for name, a in self.columns[agent].items()}
            by_policy.setdefault(self.policy_of[agent], []).append(flat)
        return {policy: _join(parts) for policy, parts in by_policy.items()}


def _flatten(array: np.ndarray) -> np.ndarray:
    """[T, E, ...] -> [E*T, ...] so that each env copy's steps stay consecutive."""
    return np.ascontiguousarray(array.swapaxes(0, 1)).reshape((-1,) + array.shape[2:])


def _join(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
