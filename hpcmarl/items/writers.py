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
- `EpisodeWriter` (episode and sequence items): one item per episode of each env copy,
  `[T_max, agents, ...]`, padded after the episode's last step and marked by `filled`; an
  episode longer than T_max goes on in the next item, which for sequences starts with the
  previous one's last `overlap` steps. Items complete when episodes end (or fill up), so a
  fragment yields zero or more of them.
- `TurnBasedWriter` (transition items of a turn-based env): a player's transition spans from
  one of its decisions to its next one (or the episode's end), so it is stitched across steps
  and fragments; see the class.
- `NStepWriter` (n-step transitions): wraps either transition writer and folds each agent's
  one-step transitions of an episode into n-step ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcmarl.comm.packing import Layout, PackedBatch, merge_leading, pack, plan_layout, views
from hpcmarl.envs.vector import VectorStep
from hpcmarl.items.spec import Column, ItemSpec

Batch = dict[str, np.ndarray]


@dataclass(slots=True)
class StepRecord:
    """One vector step of every agent: what was seen, what was done, what came of it (made
    every step: slots make it cheaper to build and to free)."""

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
    action_masks: dict[str, np.ndarray] | None = None
    """Per agent, the legal actions at s_t, bool [num_envs, n_actions] (None: no masks)."""
    recurrent_states: dict[str, np.ndarray] = field(default_factory=dict)
    """Per agent, the recurrent actor's state it acted from at s_t, [num_envs, width] (an
    agent without one yet: zeros)."""


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
    "action_masks": lambda r, a: _masks(r.action_masks)[a],
    "next_action_masks": lambda r, a: _masks(r.step.next_action_masks)[a],
    "recurrent_state": lambda r, a: r.recurrent_states.get(a, 0.0),
}
"""Where each column of DESIGN.md §3 comes from in a step record."""


def _masks(masks: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    if masks is None:
        raise ValueError("the item spec has mask columns and the env supplies no masks")
    return masks


def _getter(column: Column, agent_ids: dict[str, int], agents: list[str]) -> Getter:
    """How `column` is read from a step record, for a writer of `agents` (the group's own)."""
    if column.name == "agent_id":
        return lambda r, a: agent_ids[a]
    if column.name == "filled":
        return lambda r, a: True
    if column.name == "policy_version":
        if column.per == "group":
            # The oldest of the group's own agents: a frozen opponent bound in the same env
            # (PSRO) stays at its version, and counting it would make every item look stale.
            return lambda r, a: min(r.versions[agent] for agent in agents)
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
        self.getters = {c.name: _getter(c, agent_ids, agents) for c in spec.columns}
        self.agent_ids = agent_ids
        self.t = 0
        self._plan: tuple[Layout, int] | None = None
        self.columns: PackedBatch = self.allocate()

    def allocate(self) -> PackedBatch:
        raise NotImplementedError

    def packed(self, specs: list[tuple[str, str, tuple[int, ...]]]) -> PackedBatch:
        """A fresh packed buffer's columns (`specs` are the same every fragment, so their
        layout is planned once)."""
        if self._plan is None:
            self._plan = plan_layout(specs)
        layout, nbytes = self._plan
        return views(np.empty(nbytes, np.uint8), layout)

    def add(self, record: StepRecord) -> None:
        """Take one vector step of every agent."""
        raise NotImplementedError

    def batch(self) -> Batch:
        """The items of the fragment just completed."""
        raise NotImplementedError

    def reset(self) -> None:
        """Fresh buffers: the previous ones now belong to in-flight sends."""
        self.t = 0
        self.columns = self.allocate()

    def advance(self) -> bool:
        """Close the current step; True when the items are complete."""
        self.t += 1
        return self.t == self.length

    def discard_pending(self) -> None:
        """The episodes in progress were cut (env recreated, seeded restart): forget what was
        waiting for them. Writers that hold nothing across steps have nothing to forget."""


def step_slots(target: np.ndarray, length: int) -> list[np.ndarray]:
    """Views of `target[:, t]`, where step t's value goes, for every step of a fragment."""
    return [target[:, t] for t in range(length)]


RUN_COLUMNS = frozenset({"policy_version", "agent_id", "filled"})
"""Columns whose value at a step is one Python scalar for every env copy (`_getter`), the same
object for runs of steps (a weight version changes when new weights arrive)."""


def fill_runs(target: np.ndarray, start: int, values: list[object]) -> None:
    """`target[:, start + k] = values[k]` for every k, one assignment per run of one object
    (a scalar, broadcast over the run's env copies and steps)."""
    first = 0
    for k in range(1, len(values) + 1):
        if k == len(values) or values[k] is not values[first]:
            target[:, start + first : start + k] = values[first]
            first = k


class StagedWriter(ItemWriter):
    """A writer whose steps go into a stage kept for the writer's life, through views of each
    step's slot made once (`writes`); `batch()` copies the stage into the fragment's fresh
    packed buffer, one copy per column. A fresh buffer per fragment (the previous one is in
    flight) would need every view made anew, and writing through a ready view costs 60 % of
    indexing a column by step (numpy's per-call cost is most of a small write): on CartPole
    the writes were the collector's largest cost beside acting and stepping. A scalar column
    (`RUN_COLUMNS`: a weight version) is appended to a list per step instead, and written into
    the stage at `flush` (by `batch()` and `reset()`) with one assignment per run of one value:
    a list append costs a tenth of a numpy write."""

    stage: dict[str, np.ndarray]
    writes: list[tuple[list[np.ndarray], Getter, str]]
    """(the slots by step of a column or of one agent's part of it, getter, agent) of every
    array written per step: the hot loop's one flat list."""
    runs: list[tuple[list[object], Getter, str, np.ndarray]]
    """(this fragment's values so far, getter, agent, the [copy, step, ...] target) of every
    `RUN_COLUMNS` value taken per step."""
    staged = 0
    """Steps of this fragment whose `runs` are in the stage."""

    def plan_writes(self, targets: list[tuple[str, np.ndarray, Getter, str]]) -> None:
        """`writes` and `runs` of (column, its [copy, step, ...] target, getter, agent)."""
        self.writes, self.runs = [], []
        for name, target, get, agent in targets:
            if name in RUN_COLUMNS:
                self.runs.append(([], get, agent, target))
            else:
                self.writes.append((step_slots(target, self.length), get, agent))

    def add(self, record: StepRecord) -> None:
        t = self.t
        for slots, get, agent in self.writes:
            slots[t][...] = get(record, agent)
        for values, get, agent, _ in self.runs:
            values.append(get(record, agent))

    def flush(self) -> None:
        """Write the `runs` values taken since the last flush into the stage."""
        taken = len(self.runs[0][0]) if self.runs else 0
        if not taken:
            return
        start, self.staged = self.staged, self.staged + taken
        for values, _, _, target in self.runs:
            fill_runs(target, start, values)
            values.clear()

    def reset(self) -> None:
        self.flush()  # the stage holds every step taken, as if written when it was taken
        self.staged = 0
        super().reset()


class TransitionWriter(StagedWriter):
    """One row per agent, env copy and step; inactive rows dropped at `batch()`. The stage is
    [agent, copy, step, ...] per column, `active` included; the packed buffer holds the
    batch's rows, [agent * copy * step, ...], so a batch of only active rows is that buffer as
    it is."""

    def __init__(
        self,
        spec: ItemSpec,
        agents: list[str],
        agent_ids: dict[str, int],
        num_envs: int,
        length: int,
    ) -> None:
        super().__init__(spec, agents, agent_ids, num_envs, length)
        lead = (len(agents), num_envs, length)
        self.stage = {c.name: np.empty(lead + c.shape, c.dtype) for c in spec.columns}
        if "agent_id" in self.stage:
            for j, agent in enumerate(agents):
                self.stage["agent_id"][j] = agent_ids[agent]
        self._active = np.ones(lead, bool)
        filled = [(n, get) for n, get in self.getters.items() if n != "agent_id"]
        filled.append(("active", _SOURCES["active"]))
        self.plan_writes(
            [
                (n, self._active[j] if n == "active" else self.stage[n][j], get, a)
                for j, a in enumerate(agents)
                for n, get in filled
            ]
        )

    def allocate(self) -> PackedBatch:
        rows = len(self.agents) * self.num_envs * self.length
        return self.packed([(c.name, c.dtype, (rows, *c.shape)) for c in self.spec.columns])

    def batch(self) -> Batch:
        """Rows ordered by agent, then env copy, then step; only active agents' rows."""
        self.flush()
        for name, column in self.columns.items():
            column[...] = self.stage[name].reshape(column.shape)
        active = self._active
        if self.t < self.length:  # steps not taken yet count as active, as in a fresh buffer
            active = active.copy()
            active[:, :, self.t :] = True
        if active.all():
            return self.columns
        keep = active.reshape(-1)
        return pack({name: column[keep] for name, column in self.columns.items()})


class FragmentWriter(StagedWriter):
    """One fragment item per env copy: `[T, agents, ...]` and `[T, ...]` columns, staged in
    that shape (made at the first fragment: the episode writer below keeps its own)."""

    def allocate(self) -> PackedBatch:
        specs = self.spec.batch_specs(self.num_envs)
        if not hasattr(self, "stage"):
            self.stage = {name: np.empty(shape, dtype) for name, dtype, shape in specs}
            targets = []
            for column in self.spec.columns:
                get, target = self.getters[column.name], self.stage[column.name]
                if column.per == "group":
                    targets.append((column.name, target, get, self.agents[0]))
                else:
                    targets += [
                        (column.name, target[:, :, j], get, agent)
                        for j, agent in enumerate(self.agents)
                    ]
            self.plan_writes(targets)
        return self.packed(specs)

    def write_step(
        self, columns: dict[str, np.ndarray], record: StepRecord, at: tuple[Any, Any]
    ) -> None:
        """Every column's value of this step into `columns` at `at` = (env copies, time
        slots) of their `[copies, T, (agents,) ...]` arrays."""
        for column in self.spec.columns:
            get, target = self.getters[column.name], columns[column.name]
            if column.per == "group":
                target[at] = get(record, self.agents[0])
            else:
                for j, agent in enumerate(self.agents):
                    target[(*at, j)] = get(record, agent)

    def batch(self) -> Batch:
        self.flush()
        for name, column in self.columns.items():
            column[...] = self.stage[name]
        return self.columns


_AT_TURN_OR_END: dict[str, tuple[Getter, Getter]] = {
    "next_observations": (_SOURCES["observations"], _SOURCES["next_observations"]),
    "next_action_masks": (_SOURCES["action_masks"], _SOURCES["next_action_masks"]),
    "next_state": (_SOURCES["state"], _SOURCES["next_state"]),
    "terminations": (lambda r, a: False, _SOURCES["terminations"]),
    "truncations": (lambda r, a: False, _SOURCES["truncations"]),
}
"""The columns a turn-based transition takes where it ends: (at the agent's next turn, at the
end of its episode). `rewards` is summed over the steps between; every other column is read
where the agent acted."""


class EpisodeWriter(FragmentWriter):
    """Episode and sequence items. Each env copy fills its open item step by step (a time
    cursor per copy); when the copy's episode ends, or the item is full, the item is closed:
    copied out, and the open one zeroed for what comes next, or, for a full sequence whose
    episode goes on, started with the closed one's last `overlap` steps. `batch()` packs the
    items closed since the last one. Episodes cut by a restart (`discard_pending`) are dropped
    whole, never stored half."""

    def __init__(
        self,
        spec: ItemSpec,
        agents: list[str],
        agent_ids: dict[str, int],
        num_envs: int,
        length: int,
    ) -> None:
        super().__init__(spec, agents, agent_ids, num_envs, length)
        self.limit, self.overlap = spec.length, spec.overlap
        self.open = {
            name: np.zeros(shape, dtype) for name, dtype, shape in spec.batch_specs(num_envs)
        }
        """The item each env copy is filling, [num_envs, T_max, ...] per column."""
        self.cursor = np.zeros(num_envs, np.int64)
        """Each copy's next time slot in its open item."""
        self.closed: list[dict[str, np.ndarray]] = []
        self.rows = np.arange(num_envs)
        self.filled_steps = 0
        self.padded_steps = 0
        """Steps stored and padding slots, over the closed items: what padding costs."""

    def allocate(self) -> PackedBatch:
        return PackedBatch()  # items are built in `open` and packed at `batch()`

    def add(self, record: StepRecord) -> None:
        self.write_step(self.open, record, (self.rows, self.cursor))
        self.cursor += 1
        ended, full = record.step.episode_ended, self.cursor == self.limit
        if (ended | full).any():
            self.close(np.flatnonzero(ended | full), np.flatnonzero(full & ~ended))

    def close(self, copies: np.ndarray, going_on: np.ndarray) -> None:
        """Move the open items of `copies` to the closed list and start empty ones; those of
        `going_on` (full, their episode not over) start with their last `overlap` steps."""
        self.closed.append({name: column[copies].copy() for name, column in self.open.items()})
        steps = int(self.cursor[copies].sum())
        self.filled_steps += steps
        self.padded_steps += len(copies) * self.limit - steps
        ended, keep = np.setdiff1d(copies, going_on), self.overlap
        for column in self.open.values():
            if keep:
                column[going_on, :keep] = column[going_on, self.limit - keep :]
            column[going_on, keep:] = 0
            column[ended] = 0
        self.cursor[ended] = 0
        self.cursor[going_on] = keep

    def batch(self) -> Batch:
        """The items closed since the last batch, in the order they closed (maybe none)."""
        if not self.closed:
            return pack({n: np.zeros((0, *s[1:]), d) for n, d, s in self.spec.batch_specs(1)})
        return pack({n: np.concatenate([c[n] for c in self.closed]) for n in self.spec.names})

    def reset(self) -> None:
        self.t = 0
        self.closed = []

    def discard_pending(self) -> None:
        for column in self.open.values():
            column[:] = 0
        self.cursor[:] = 0


class TurnBasedWriter(ItemWriter):
    """Transitions of a turn-based env: one pending transition per (agent, env copy), opened
    when the agent acts and completed at its next turn (next_obs is what it sees then, done
    False) or at the end of the episode (the final observation, terminated or truncated). Its
    reward is the sum of the agent's rewards in between, including those that arrive while it
    waits, such as the payoff after the opponent's last move. A transition still pending when a
    fragment ends carries over into the next one; an agent completes at most `length + 1`
    transitions per fragment (one carried in, one per step), which sizes the buffers.
    """

    def __init__(
        self,
        spec: ItemSpec,
        agents: list[str],
        agent_ids: dict[str, int],
        num_envs: int,
        length: int,
    ) -> None:
        super().__init__(spec, agents, agent_ids, num_envs, length)
        opened = [c for c in spec.columns if c.name not in (*_AT_TURN_OR_END, "rewards")]
        shape = (len(agents), num_envs)
        self.pending = {c.name: np.zeros(shape + c.shape, c.dtype) for c in opened}
        """The columns of each pending transition, as read where the agent acted."""
        self.starts = [(self.pending[n], self.getters[n]) for n in self.pending]
        self.ends = [(n, _AT_TURN_OR_END[n]) for n in spec.names if n in _AT_TURN_OR_END]
        self.pending_rewards = np.zeros(shape, np.float64)
        self.waiting = np.zeros(shape, bool)
        """(agent, copy) has a pending transition."""

    def allocate(self) -> PackedBatch:
        lead = (len(self.agents), self.num_envs, self.length + 1)
        columns = self.packed([(c.name, c.dtype, lead + c.shape) for c in self.spec.columns])
        self.completed = np.zeros(lead[:2], np.int64)
        """Transitions completed this fragment per (agent, copy): the next free slot."""
        return columns

    def add(self, record: StepRecord) -> None:
        ended = record.step.episode_ended
        for j, agent in enumerate(self.agents):
            acted = record.step.active[agent]
            self._complete(j, agent, record, acted & self.waiting[j], at_end=False)
            self._open(j, agent, record, acted)
            self.pending_rewards[j] += record.step.rewards[agent]
            self._complete(j, agent, record, ended & self.waiting[j], at_end=True)

    def batch(self) -> Batch:
        """The completed transitions, ordered by agent, then env copy, then completion."""
        filled = np.arange(self.length + 1) < self.completed[..., None]
        keep = filled.reshape(-1)
        return pack({name: column[keep] for name, column in merge_leading(self.columns, 3).items()})

    def discard_pending(self) -> None:
        self.waiting[:] = False

    def _open(self, j: int, agent: str, record: StepRecord, acted: np.ndarray) -> None:
        rows = np.flatnonzero(acted)
        if not len(rows):
            return
        for pending, get in self.starts:
            pending[j, rows] = _rows_of(get(record, agent), rows)
        self.pending_rewards[j, rows] = 0.0
        self.waiting[j, rows] = True

    def _complete(
        self, j: int, agent: str, record: StepRecord, due: np.ndarray, at_end: bool
    ) -> None:
        rows = np.flatnonzero(due)
        if not len(rows):
            return
        slots = self.completed[j, rows]
        for name, pending in self.pending.items():
            self.columns[name][j, rows, slots] = pending[j, rows]
        for name, getters in self.ends:
            value = getters[at_end](record, agent)
            self.columns[name][j, rows, slots] = _rows_of(value, rows)
        self.columns["rewards"][j, rows, slots] = self.pending_rewards[j, rows]
        self.completed[j, rows] += 1
        self.waiting[j, rows] = False


class NStepWriter:
    """n-step transitions made of the one-step ones an inner writer completes: each agent's
    transitions of one episode are consecutive (same `agent_id` and `episode_id`, in order),
    so transition i folds in those up to i + n - 1, or to the one that ends the episode:
    reward sum_k gamma^k r_{i+k}, the `next_observations`, done flags and next masks of the
    last one, `discounts` gamma^m for the m steps folded. A transition whose window is still
    open when a fragment ends waits (with the rows it needs) for the next fragment; an episode
    cut by a restart drops what waits. Turn-based transitions fold turn by turn."""

    def __init__(self, spec: ItemSpec, inner: ItemWriter) -> None:
        self.spec, self.inner = spec, inner
        self.n, self.gamma = spec.n_step, spec.gamma
        self.agents, self.length = inner.agents, inner.length
        self.waiting: Batch | None = None
        """The one-step rows whose window is still open (the last ones of their episodes)."""

    def add(self, record: StepRecord) -> None:
        self.inner.add(record)

    def advance(self) -> bool:
        return self.inner.advance()

    def reset(self) -> None:
        self.inner.reset()

    def discard_pending(self) -> None:
        self.inner.discard_pending()
        self.waiting = None

    def batch(self) -> Batch:
        rows = self.inner.batch()
        if self.waiting is not None:
            rows = {k: np.concatenate([self.waiting[k], rows[k]]) for k in rows}
        folded, self.waiting = fold_n_step(rows, self.n, self.gamma)
        return pack(folded)


_FROM_LAST = ("next_observations", "terminations", "truncations", "next_action_masks")
"""The columns an n-step transition takes from the last one-step transition it folds in."""


def fold_n_step(rows: Batch, n: int, gamma: float) -> tuple[Batch, Batch | None]:
    """(the n-step transitions complete in `rows`, the rows still needed later or None)."""
    order = np.lexsort((rows["step"], rows["episode_id"], rows["agent_id"]))
    rows = {k: v[order] for k, v in rows.items()}
    count = len(order)
    run = np.stack([rows["agent_id"].astype(np.int64), rows["episode_id"]], axis=1)
    ends = rows["terminations"] | rows["truncations"]
    index = np.arange(count)
    last = index.copy()
    reward = rows["rewards"].astype(np.float64)
    extending = np.ones(count, bool)
    for k in range(1, n):
        later = np.minimum(index + k, max(count - 1, 0))
        same_run = (index + k < count) & (run[later] == run).all(axis=1)
        extending &= same_run & ~ends[last]
        reward[extending] += gamma**k * rows["rewards"][later[extending]]
        last[extending] = later[extending]
    folded = last - index + 1
    complete = (folded == n) | ends[last]
    out = {k: v[complete] for k, v in rows.items()}
    for name in _FROM_LAST:
        if name in rows:
            out[name] = rows[name][last[complete]]
    out["rewards"] = reward[complete].astype(rows["rewards"].dtype)
    out["discounts"] = (gamma ** folded[complete]).astype(np.float32)
    if complete.all():
        return out, None
    # a run's open rows are its last ones (a later row's window is shorter still), and they
    # are all that an open window needs
    return out, {k: v[~complete] for k, v in rows.items()}


def _rows_of(value: object, rows: np.ndarray) -> object:
    """The copies' rows of a per-copy array; a per-step scalar (a version, a flag) as is."""
    return value[rows] if isinstance(value, np.ndarray) and value.ndim else value


def make_writer(
    spec: ItemSpec,
    agents: list[str],
    agent_ids: dict[str, int],
    num_envs: int,
    length: int,
    turn_based: bool = False,
) -> ItemWriter:
    """The writer of a group's item kind; transitions of a turn-based env are stitched from
    each agent's turn to its next; n-step transitions fold the one-step ones."""
    if spec.n_step > 1:
        inner = make_writer(spec.one_step(), agents, agent_ids, num_envs, length, turn_based)
        return NStepWriter(spec, inner)  # type: ignore[return-value]
    if spec.kind == "transition" and turn_based:
        return TurnBasedWriter(spec, agents, agent_ids, num_envs, length)
    if spec.kind == "transition":
        return TransitionWriter(spec, agents, agent_ids, num_envs, length)
    if spec.kind == "fragment":
        return FragmentWriter(spec, agents, agent_ids, num_envs, length)
    if spec.kind in ("episode", "sequence"):
        return EpisodeWriter(spec, agents, agent_ids, num_envs, length)
    raise ValueError(f"collectors cannot write {spec.kind} items yet")
