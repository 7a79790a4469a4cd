"""Fixed-length trajectory fragments, written in place and split into one batch per policy.

A collector steps `num_envs` copies of an environment; every step writes one row per copy per
agent into preallocated arrays. At the end of a fragment the rows of all agents that act with
the same policy form that policy's batch, with the column names of DESIGN.md §3.
"""

from __future__ import annotations

import numpy as np

from ..comm.packing import PackedBatch, allocate_packed, merge_leading
from ..core import Batch


class FragmentBuilder:
    """Accumulates `length` vector steps of every agent, then hands out per-policy batches.

    Each policy's columns live packed in one buffer, laid out [agent, env copy, step], so that
    the finished batch is a reshape (no copy) and travels as one MPI message.
    """

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
        self.members = {p: [a for a in agents if policy_of[a] == p] for p in policy_of.values()}
        self.slot = {a: (policy_of[a], self.members[policy_of[a]].index(a)) for a in agents}
        self.columns: dict[str, PackedBatch] = {}
        self.reset()

    def reset(self) -> None:
        """Fresh buffers: the previous ones now belong to in-flight sends."""
        self.t = 0
        self.columns = {p: self._allocate(p) for p in self.members}

    def _allocate(self, policy: str) -> PackedBatch:
        agents = self.members[policy]
        lead = (len(agents), self.num_envs, self.length)
        obs = lead + (self.obs_dims[agents[0]],)
        specs = [
            ("observations", "<f4", obs),
            ("actions", "<i8", lead),
            ("rewards", "<f4", lead),
            ("next_observations", "<f4", obs),
            ("terminations", "|b1", lead),
            ("truncations", "|b1", lead),
            ("agent_id", "<i2", lead),
            ("episode_id", "<i8", lead),
            ("step", "<i4", lead),
            ("policy_version", "<i8", lead),
        ]
        columns = allocate_packed(specs)
        for j, agent in enumerate(agents):
            columns["agent_id"][j] = self.agents.index(agent)
        return columns

    def add(self, agent: str, rows: dict[str, np.ndarray | int]) -> None:
        """Write this step's rows of one agent (arrays of length num_envs, or scalars)."""
        policy, j = self.slot[agent]
        columns = self.columns[policy]
        for name, value in rows.items():
            columns[name][j, :, self.t] = value

    def advance(self) -> bool:
        """Close the current step; True when the fragment is full."""
        self.t += 1
        return self.t == self.length

    def batches(self) -> dict[str, Batch]:
        """One batch per policy: rows ordered by agent, then env copy, then step."""
        return {policy: merge_leading(columns, 3) for policy, columns in self.columns.items()}
