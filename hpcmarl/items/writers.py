"""Item writers: a collector's steps cut into the items a group's algorithm trains on.

A collector steps `num_envs` copies of an environment; every step is one `StepRecord` of all
agents. Each training group has a writer built from its item spec; after `length` steps it hands
out one batch of that group's items:

- `TransitionWriter` (transition items): one row per agent per env copy per step, laid out
  [agent, copy, step] in one packed buffer so the batch is a reshape and travels as one MPI
  message. Rows of agents that were not active (padding after an agent finished) are dropped.
- `FragmentWriter` (fragment items): one item per env copy, `[T, agents, ...]` per agent column
  and `[T, ...]` per group column, packed likewise; inactive steps stay, marked by `active`, so
  the time axis stays whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hpcmarl.comm.packing import PackedBatch, allocate_packed, merge_leading, pack
from hpcmarl.envs.vector import VectorStep
from hpcmarl.items.spec import Column, ItemSpec

Batch = dict[str, np.ndarray]


@dataclass
class StepRecord:
    """One vector step of every agent: what was seen, what was done, what came of it."""

    observations: dict[str, np.ndarray]
    """s_t per agent, [num_envs, obs_dim]."""
    actions: dict[str, np.ndarray]
    step: VectorStep
    episode_id: np.ndarray
    """[num_envs] int64: the episode each copy is in at s_t."""
    step_index: np.ndarray
    """[num_envs] int32: the step of that episode."""
    versions: dict[str, int]
    """Per agent, the weight version it acted with."""
    state: np.ndarray | None = None
    """Global s_t, [num_envs, state_dim], when tracked."""
    extras: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    """Per agent, what its actor recorded (e.g. `log_probs`)."""


Getter = Callable[[StepRecord, str], object]
"""A column's value at one step, for one agent (its argument; ignored by group columns)."""

_SOURCES: dict[str, Getter] = {
    "observations": lambda r, a: r.observations[a],
    "actions": lambda r, a: r.actions[a],
    "rewards": lambda r, a: r.step.rewards[a],
    "next_observations": lambda r, a: r.step.next_observations[a],
    "terminations": lambda r, a: r.step.terminations[a],
    "truncations": lambda r, a: r.step.truncations[a],
    "active": lambda r, a: r.step.active[a],
    "log_probs": lambda r, a: r.extras[a]["log_probs"],
    "episode_id": lambda r, a: r.episode_id,
    "step": lambda r, a: r.step_index,
    "state": lambda r, a: r.state,
    "next_state": lambda r, a: r.step.next_states,
}
"""Where each column of DESIGN.md §3 comes from in a step record."""


def _getter(column: Column, agent_ids: dict[str, int]) -> Getter:
    if column.name == "agent_id":
        return lambda r, a: agent_ids[a]
    if column.name == "policy_version":
        if column.per == "group":
            return lambda r, a: min(r.versions.values())
        return lambda r, a: r.versions[a]
    if column.name not in _SOURCES:
        raise ValueError(f"no collector writes a column named {column.name!r}")
    return _SOURCES[column.name]


class ItemWriter:
    """What both writers share: the group's agents, the spec, the step counter."""

    def __init__(
        self,
        spec: ItemSpec,
        agents: list[str],
        agent_ids: dict[str, int],
        num_envs: int,
        length: int,
    ) -> None:
        self.spec, self.agents, self.num_envs, self.length = spec, agents, num_envs, length
        self.getters = {c.name: _getter(c, agent_ids) for c in spec.columns}
        self.agent_ids = agent_ids
        self.t = 0
        self.columns: PackedBatch = self.allocate()

    def allocate(self) -> PackedBatch:
        raise NotImplementedError

    def reset(self) -> None:
        """Fresh buffers: the previous ones now belong to in-flight sends."""
        self.t = 0
        self.columns = self.allocate()

    def advance(self) -> bool:
        """Close the current step; True when the items are complete."""
        self.t += 1
        return self.t == self.length


class TransitionWriter(ItemWriter):
    """One row per agent, env copy and step; inactive rows dropped at `batch()`."""

    def allocate(self) -> PackedBatch:
        lead = (len(self.agents), self.num_envs, self.length)
        columns = allocate_packed([(c.name, c.dtype, lead + c.shape) for c in self.spec.columns])
        if "agent_id" in columns:
            for j, agent in enumerate(self.agents):
                columns["agent_id"][j] = self.agent_ids[agent]
        self._active = np.ones(lead, bool)
        self.sources = [(columns[n], get) for n, get in self.getters.items() if n != "agent_id"]
        """(target column, getter) of every column filled per step: the hot loop's list."""
        return columns

    def add(self, record: StepRecord) -> None:
        t, active = self.t, record.step.active
        for j, agent in enumerate(self.agents):
            for target, get in self.sources:
                target[j, :, t] = get(record, agent)
            self._active[j, :, t] = active[agent]

    def batch(self) -> Batch:
        """Rows ordered by agent, then env copy, then step; only active agents' rows."""
        rows = merge_leading(self.columns, 3)
        if self._active.all():
            return rows
        keep = self._active.reshape(-1)
        return pack({name: column[keep] for name, column in rows.items()})


class FragmentWriter(ItemWriter):
    """One fragment item per env copy: `[T, agents, ...]` and `[T, ...]` columns."""

    def allocate(self) -> PackedBatch:
        return allocate_packed(self.spec.batch_specs(self.num_envs))

    def add(self, record: StepRecord) -> None:
        t = self.t
        for column in self.spec.columns:
            get, target = self.getters[column.name], self.columns[column.name]
            if column.per == "group":
                target[:, t] = get(record, self.agents[0])
            else:
                for j, agent in enumerate(self.agents):
                    target[:, t, j] = get(record, agent)

    def batch(self) -> Batch:
        return self.columns


def make_writer(
    spec: ItemSpec, agents: list[str], agent_ids: dict[str, int], num_envs: int, length: int
) -> TransitionWriter | FragmentWriter:
    """The writer of a group's item kind."""
    if spec.kind == "transition":
        return TransitionWriter(spec, agents, agent_ids, num_envs, length)
    if spec.kind == "fragment":
        return FragmentWriter(spec, agents, agent_ids, num_envs, length)
    raise ValueError(f"collectors cannot write {spec.kind} items yet")
