"""Compact transition storage: MALib's producer options as a way of storing rows, undone at
sample time (DESIGN.md §7), never a second data path.

Collectors send full transitions; a `CompactTable` keeps less of each and rebuilds the full
rows when it samples:
- frame stacks (`replay.stack_num` k): an observation is a stack of the run's last k frames,
  newest last (flattened, so the newest frame is its last `obs_dim / k` values). Only the newest
  frame is stored; a sampled row's stack is rebuilt from the frames of its predecessors in the
  same run. The first row of a run keeps its whole stack (what the env or the frame stacker
  padded it with), so stacks never reach across an episode's start.
- `ignore_obs_next`: `next_observations` is not stored; it is rebuilt from the row's successor
  in the same run. A row without one (an episode's last step, terminated or truncated, or the
  newest step of a run still being collected) keeps its next observation aside.

A run is one agent's steps in one episode (`episode_id`, `agent_id`), in `step` order. The links
between a run's rows are not stored: they follow from those bookkeeping columns, so a resumed
table rebuilds them. All rows of a run must reach the same table: collectors send every batch
of such a group to one shard of their own. Before the ring evicts a run's older rows, its
oldest remaining row keeps its whole stack, so every held row's stack stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcmarl.replay.table import ReplayTable, SampleInfo

_ZERO_32, _NONE_32 = np.zeros((), np.int32), np.full((), -1, np.int32)
_ZERO, _ONE, _NONE = np.zeros((), np.int64), np.ones((), np.int64), np.full((), -1, np.int64)
_AGENT_SPAN = np.full((), 65_536, np.int64)
"""Operands for arithmetic on arrays of a few rows, which is all call overhead: numpy takes a
0-d array of the operand's dtype about twice as fast as a Python int, which it converts first."""
FEW_STARTS = 8
"""Up to this many rows of a sample whose stacks reach back past their run's first held row
(one or two of 64, typically) are filled one by one: a dozen vectorised calls cost more."""


@dataclass(frozen=True)
class StorageForm:
    """How a transition table stores its rows."""

    stack_num: int = 1
    """Frames per observation stack; with k > 1 only the newest frame of each is stored."""
    ignore_obs_next: bool = False
    """Store no `next_observations`; rebuild them from the next row of the same run."""

    @property
    def compact(self) -> bool:
        return self.stack_num > 1 or self.ignore_obs_next

    def describe(self) -> str:
        parts = [f"stack_num {self.stack_num}"] if self.stack_num > 1 else []
        return ", ".join([*parts, *(["ignore_obs_next"] if self.ignore_obs_next else [])])

    def words(self) -> np.ndarray:
        """The form as a table state saves it: int64 [stack_num, ignore_obs_next]."""
        return np.array([self.stack_num, int(self.ignore_obs_next)], np.int64)

    @classmethod
    def of_words(cls, words: Any) -> StorageForm:
        """The form `words()` saved."""
        stack_num, ignore = (int(v) for v in np.asarray(words))
        return cls(stack_num=stack_num, ignore_obs_next=bool(ignore))


def run_keys(episode_id: np.ndarray, agent_id: np.ndarray) -> np.ndarray:
    """One int64 per run: episode ids are below 2^47 (collector index x 10^9 + count)."""
    return episode_id.astype(np.int64, copy=False) * _AGENT_SPAN + agent_id


def chain_runs(
    keys: np.ndarray, steps: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows (run `keys`, `steps`, insert `ids`) chained within their runs: (order, same, prev,
    next) with `order` the rows by run then step, `same[i]` whether `order[i]` and
    `order[i + 1]` are of one run, and each row's predecessor and successor ids (-1: none)."""
    return _chain_runs(keys, steps, ids)[:4]


def _chain_runs(
    keys: np.ndarray, steps: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """`chain_runs`, and whether each run's rows came in step order (each row after its
    predecessor in the batch)."""
    order = np.lexsort((steps, keys))
    same = keys[order[1:]] == keys[order[:-1]]
    before, after = order[:-1][same], order[1:][same]
    prev = np.full(len(ids), -1, np.int64)
    nxt = np.full(len(ids), -1, np.int64)
    prev[after] = ids[before]
    nxt[before] = ids[after]
    return order, same, prev, nxt, not (after < before).any()


def run_blocks(keys: np.ndarray, steps: np.ndarray) -> np.ndarray | None:
    """The rows after which another run's rows follow, when every run's rows form one block of
    the batch in step order, the way collectors send them; None otherwise (and for an empty
    batch). Each other row's successor is then the row after it: what `chain_runs` finds
    with a sort and a dozen more numpy calls."""
    n = len(keys)
    if n == 0:
        return None
    cut = keys[1:] != keys[:-1]
    if np.count_nonzero(cut | (steps[1:] >= steps[:-1])) != n - 1:
        return None
    ends = cut.nonzero()[0]
    if len(ends):
        listed = keys.tolist()
        heads = {listed[row + 1] for row in ends.tolist()}
        if listed[0] in heads or len(heads) < len(ends):  # a run in two blocks
            return None
    return ends


def stored_bytes_per_row(columns: dict[str, tuple[str, tuple[int, ...]]], form: StorageForm) -> int:
    """Bytes one row takes in the table (without the side stores) for columns {name: (dtype,
    shape)} of the full transition; the side stores add about a frame per episode."""
    total = 0
    for name, (dtype, shape) in columns.items():
        width = int(np.prod(shape, dtype=np.int64))
        if name in ("observations", "next_observations"):
            if name == "next_observations" and form.ignore_obs_next:
                continue
            width //= form.stack_num
        total += width * np.dtype(dtype).itemsize
    return total


class SideStore:
    """Values kept aside for a few held rows, found by the row's ring slot.

    A slot holds one row at a time, so the store maps slot -> an entry of a pool of values, and
    each entry remembers the insert id it belongs to: a value of a row the ring has evicted is
    never returned for the row now in its slot. Adding, finding and dropping are one vectorised
    pass over the rows concerned, whatever the store holds (a sorted list of ids had to merge
    the whole store whenever an older row's value arrived, which `_pass_on_stacks` does for
    every batch once the ring is full)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entry = np.full(capacity, -1, np.int32)
        """Slot -> its entry in the pool (-1: none). Read and written by insert id with
        `take` / `put` in mode "wrap", which find the slot (id % capacity) themselves."""
        self.ids = np.zeros(0, np.int64)
        """Entry -> the insert id of the row it belongs to (-1: free)."""
        self.values: np.ndarray | None = None
        self.free = np.zeros(0, np.int32)
        """A stack of free entries: the first `n_free` are free, the next to use last."""
        self.n_free = 0

    def add(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Keep `values` for the held rows `ids` (one per slot), in place of whatever their
        slots' entries held."""
        if len(ids) == 0:
            return
        if self.values is None:
            self.values = np.zeros((0, *values.shape[1:]), values.dtype)
        entries = self.entry.take(ids, mode="wrap")
        fresh = (entries < _ZERO_32).nonzero()[0]
        if len(fresh):
            entries[fresh] = self._take(len(fresh))
            self.entry.put(ids, entries, mode="wrap")
        self.ids.put(entries, ids)
        self.values[entries] = values

    def _take(self, n: int) -> np.ndarray:
        """`n` free entries, the pool grown (doubling) when it has fewer."""
        if self.n_free < n:
            assert self.values is not None
            old = len(self.ids)
            grow = max(old + n - self.n_free, 2 * old, 64)
            self.ids = np.concatenate([self.ids, np.full(grow - old, -1, np.int64)])
            fresh = np.zeros((grow - old, *self.values.shape[1:]), self.values.dtype)
            self.values = np.concatenate([self.values, fresh])
            stack = np.concatenate([np.arange(grow - 1, old - 1, -1), self.free[: self.n_free]])
            self.free = np.zeros(grow, np.int32)  # room for every entry
            self.free[: len(stack)], self.n_free = stack, len(stack)
        self.n_free -= n
        return self.free[self.n_free : self.n_free + n].copy()

    def _held(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The entries of `ids`' slots, and whether each one belongs to its row."""
        entries = self.entry.take(ids, mode="wrap")
        if len(self.ids) == 0:
            return entries, np.zeros(len(ids), bool)
        return entries, (entries >= _ZERO_32) & (self.ids[entries] == ids)

    def discard(self, ids: np.ndarray) -> None:
        """Drop the entries of `ids` (those present)."""
        if len(ids) == 0:
            return
        entries, mine = self._held(ids)
        self._release(ids[mine] % self.capacity, entries[mine])

    def replace(self, gone: np.ndarray, ids: np.ndarray, values: np.ndarray) -> None:
        """Drop the values of the held rows `gone` and keep `values` for the rows `ids`, whose
        slots hold nothing (the ring evicted them): as `discard` then `add`, with the entries
        of `gone` handed on to `ids` (a run's newest row passes its place to its successor)."""
        m = len(gone)
        entries, mine = self._held(gone)
        if m == 0 or m > len(ids) or np.count_nonzero(mine) < m:
            self.discard(gone)
            self.add(ids, values)
            return
        assert self.values is not None
        taking, rest = (ids, None) if m == len(ids) else (ids[:m], ids[m:])
        self.entry.put(gone, _NONE_32, mode="wrap")
        self.entry.put(taking, entries, mode="wrap")
        self.ids.put(entries, taking)
        self.values[entries] = values if rest is None else values[:m]
        if rest is not None:
            self.add(rest, values[m:])

    def _release(self, slots: np.ndarray, entries: np.ndarray) -> None:
        self.entry[slots] = -1
        self.ids[entries] = -1
        self.free[self.n_free : self.n_free + len(entries)] = entries
        self.n_free += len(entries)

    def get(self, ids: np.ndarray) -> np.ndarray:
        """The values of `ids`, every one of which must be held."""
        entries, mine = self._held(ids)
        if np.count_nonzero(mine) < len(ids):
            raise KeyError("a compact table lost a row's kept-aside value; this is a bug")
        assert self.values is not None
        return self.values.take(entries, axis=0)

    def evict(self, slots: np.ndarray | slice) -> None:
        """The ring is about to overwrite `slots`: their rows' values go."""
        entries = self.entry[slots]
        held = entries[entries >= _ZERO_32]
        if len(held):
            self.entry[slots] = -1
            self.ids.put(held, _NONE)
            self.free[self.n_free : self.n_free + len(held)] = held
            self.n_free += len(held)

    def nbytes(self) -> int:
        values = 0 if self.values is None else self.values.nbytes
        return self.entry.nbytes + self.ids.nbytes + self.free.nbytes + values

    def state(self) -> dict[str, np.ndarray]:
        """The held values as (ids, values), oldest row first."""
        used = np.flatnonzero(self.ids >= 0)
        used = used[np.argsort(self.ids[used])]
        state = {"ids": self.ids[used]}
        if self.values is not None:
            state["values"] = self.values[used]
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.__init__(self.capacity)  # type: ignore[misc]
        if "values" in state:
            self.add(np.asarray(state["ids"], np.int64), np.asarray(state["values"]))


class CompactTable:
    """A `ReplayTable` holding transitions in a `StorageForm`; `insert` takes and `sample`
    returns full rows, as if the table stored them whole."""

    def __init__(self, table: ReplayTable, form: StorageForm) -> None:
        self.table, self.form = table, form
        capacity = table.capacity
        self._back = np.full(capacity, -1, np.int64)
        """Slot -> insert id of the row before it in its run, or its own for its run's first
        held row: a link never leaves the ring (`_pass_on_stacks` points a row at itself
        before its predecessor goes), so k - 1 gathers give a stack's rows (stack_num > 1)."""
        self._next = np.full(capacity, -1, np.int64)
        """Slot -> insert id of the row after it in its run (-1: none held yet)."""
        self._open: dict[int, int] = {}
        """Run key -> insert id of its newest row, for runs that have not ended."""
        self.first_stacks = SideStore(capacity)
        """Whole observation stacks of the rows that start a run (stack_num > 1)."""
        self.next_frames = SideStore(capacity)
        """Next observations (their newest frame) of rows with no successor (ignore_obs_next)."""
        self._used = self._used_stores()

    # The table's counters, as the shard and its checkpoint read them.
    @property
    def capacity(self) -> int:
        return self.table.capacity

    @property
    def size(self) -> int:
        return self.table.size

    @property
    def total_inserted(self) -> int:
        return self.table.total_inserted

    @property
    def evicted(self) -> int:
        return self.table.evicted

    @property
    def prioritized(self) -> bool:
        return self.table.prioritized

    def nbytes(self) -> int:
        """Bytes this table holds: its columns, links and kept-aside values."""
        side = sum(store.nbytes() for _, store in self._stores())
        return self.table.nbytes() + self._back.nbytes + self._next.nbytes + side

    def update_priorities(
        self, indices: np.ndarray, insert_ids: np.ndarray, td_errors: np.ndarray
    ) -> int:
        return self.table.update_priorities(indices, insert_ids, td_errors)

    def insert(self, batch: dict[str, np.ndarray]) -> None:
        """Store the batch's rows in compact form and link them into their runs."""
        n, capacity = len(batch["rewards"]), self.capacity
        if n > capacity:  # only the newest rows would stay: count the rest as evicted at once
            batch = {name: column[n - capacity :] for name, column in batch.items()}
            self.table.skip(n - capacity)
            n = capacity
        first_id = self.table.total_inserted
        ids = np.arange(first_id, first_id + n, dtype=np.int64)
        start = first_id % capacity  # a slice indexes the slots faster, unless they wrap
        slots = slice(start, start + n) if start + n <= capacity else ids % capacity
        oldest = first_id + n - min(self.size + n, capacity)  # the oldest row held afterwards
        heirs = self._pass_on_stacks(oldest)
        for store in self._used:  # the rows the ring overwrites now
            store.evict(slots)
        batch, keys, prev, nxt, heads, tails = self._chain(batch, ids)
        held, joined = self._join_open_runs(batch, keys, heads, tails, first_id, oldest)
        held_ids = np.array(held, np.int64)
        if held:
            prev.put(joined, held_ids)
        starts, alone = (prev < _ZERO).nonzero()[0], (nxt < _ZERO).nonzero()[0]
        self.table.insert(self._stored(batch))
        self._keep_aside(batch, ids, starts, alone, heirs, held_ids)
        if len(starts):  # a run's first held row links to itself
            prev[starts] = ids[starts]
        self._back[slots], self._next[slots] = prev, nxt
        if held:
            self._next.put(held_ids, ids[joined], mode="wrap")  # at slots id % capacity

    def _chain(
        self, batch: dict[str, np.ndarray], ids: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, list[int], list[int]]:
        """The batch (its runs' rows in step order), its run keys, each row's predecessor and
        successor ids here (-1: none) and the first and last rows of its runs. A batch whose
        runs come as blocks in step order (as collectors send them) needs no sort."""
        keys = run_keys(batch["episode_id"], batch["agent_id"])
        ends = run_blocks(keys, batch["step"])
        if ends is not None:
            prev, nxt = ids - _ONE, ids + _ONE
            prev[0], nxt[-1] = -1, -1
            prev[1:].put(ends, _NONE)  # `put`: a scatter of few rows at half the cost
            nxt.put(ends, _NONE)
            tails = ends.tolist()
            return batch, keys, prev, nxt, [0, *(row + 1 for row in tails)], [*tails, len(ids) - 1]
        order, same, prev, nxt, in_order = _chain_runs(keys, batch["step"], ids)
        if not in_order:  # a run's rows out of step order
            batch = self._in_step_order(batch)
            keys = run_keys(batch["episode_id"], batch["agent_id"])
            order, same, prev, nxt = chain_runs(keys, batch["step"], ids)
        edges = np.concatenate([[True], ~same, [True]])
        return batch, keys, prev, nxt, order[edges[:-1]].tolist(), order[edges[1:]].tolist()

    def _join_open_runs(
        self,
        batch: dict[str, np.ndarray],
        keys: np.ndarray,
        heads: list[int],
        tails: list[int],
        first_id: int,
        oldest: int,
    ) -> tuple[list[int], list[int]]:
        """Link each run's first row here to the held row before it (a run still open), and
        open the runs whose last row here has not ended: (held rows, the rows here they lead
        to)."""
        ended = (batch["terminations"] | batch["truncations"]).tolist()
        listed = keys.tolist()
        open_runs, held, joined = self._open, [], []
        for row in heads:
            before = open_runs.pop(listed[row], -1)
            if before >= oldest:
                held.append(before)
                joined.append(row)
        for row in tails:
            if not ended[row]:
                open_runs[listed[row]] = first_id + row
        if len(open_runs) > 4096:
            self._open = {key: i for key, i in open_runs.items() if i >= oldest}
        return held, joined

    @staticmethod
    def _in_step_order(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch with its rows in step order (a stable sort), so that each run's rows get
        increasing insert ids: a row's successor then never leaves the ring before it."""
        by_step = np.argsort(batch["step"], kind="stable")
        return {name: column[by_step] for name, column in batch.items()}

    def _pass_on_stacks(self, oldest: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Before the ring evicts the rows older than `oldest`: a held row whose predecessor goes
        becomes its run's first held row, and keeps its whole stack (rebuilt while the frames
        it needs are still there, kept aside with the batch's own first rows), so every held
        row's stack stays exact. The heirs and their stacks, or None."""
        if self.form.stack_num == 1 or self.size == 0:
            return None
        held_from = self.table.total_inserted - self.size
        if oldest <= held_from:
            return None
        start, leaving = held_from % self.capacity, oldest - held_from  # oldest <= total
        if start + leaving <= self.capacity:
            after = self._next[start : start + leaving]
        else:
            after = self._next[(held_from + np.arange(leaving)) % self.capacity]
        heirs = after[after >= oldest]  # no two rows share a successor: no repeats
        if len(heirs) == 0:
            return None
        stacks = self._stacks(heirs).reshape(len(heirs), -1)
        self._back.put(heirs, heirs, mode="wrap")
        return heirs, stacks

    def _stored(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        stored = dict(batch)
        k = self.form.stack_num
        if k > 1:
            frame = batch["observations"].shape[1] // k
            stored["observations"] = batch["observations"][:, -frame:]
            if not self.form.ignore_obs_next:
                stored["next_observations"] = batch["next_observations"][:, -frame:]
        if self.form.ignore_obs_next:
            del stored["next_observations"]
        return stored

    def _keep_aside(
        self,
        batch: dict[str, np.ndarray],
        ids: np.ndarray,
        starts: np.ndarray,
        alone: np.ndarray,
        heirs: tuple[np.ndarray, np.ndarray] | None,
        joined: np.ndarray,
    ) -> None:
        """Whole stacks of the rows that now start a run (`starts`: the batch's; and the heirs
        of evicted rows); next observations of the rows with no successor (`alone`), in place
        of those of the held rows this batch `joined`."""
        if self.form.stack_num > 1:
            if len(starts):  # most batches start no run: then the heirs alone
                self.first_stacks.add(ids[starts], batch["observations"][starts])
            if heirs is not None:
                self.first_stacks.add(*heirs)
        if self.form.ignore_obs_next:
            frame = batch["observations"].shape[1] // self.form.stack_num
            values = batch["next_observations"][alone, -frame:]
            self.next_frames.replace(joined, ids[alone], values)

    def sample(self, n: int) -> tuple[dict[str, np.ndarray], SampleInfo]:
        """Draw `n` rows as `ReplayTable.sample` does and return them whole."""
        leave = ("observations",) if self.form.ignore_obs_next else ()
        columns, info = self.table.sample_leaving(n, leave)
        return self.rebuild(columns, info.insert_ids), info

    def rebuild(self, columns: dict[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
        """Full rows from the stored columns of the rows `ids`. With `ignore_obs_next` a row's
        next observation is its stack moved on by one frame, with the newest frame of its
        successor (or the one kept aside) last: one gather of that frame, and a copy of the
        others, never a second gather of the whole stack."""
        k = self.form.stack_num
        if not self.form.ignore_obs_next:
            if k > 1:
                stacks = self._stacks(ids).reshape(len(ids), -1)
                columns["observations"] = stacks
                columns["next_observations"] = np.concatenate(
                    [stacks[:, stacks.shape[1] // k :], columns["next_observations"]], axis=1
                )
            return columns
        stored = self.table.column("observations")
        stacks = self._stacks(ids) if k > 1 else stored.take(ids, axis=0, mode="wrap")[:, None]
        after = self._next.take(ids, mode="wrap")
        held = after >= _ZERO
        nexts = np.empty_like(stacks)
        nexts[:, : k - 1] = stacks[:, 1:]
        nexts[:, k - 1] = stored.take(np.where(held, after, ids), axis=0, mode="wrap")
        if np.count_nonzero(held) < len(ids):
            alone = (after < _ZERO).nonzero()[0]
            nexts[alone, k - 1] = self.next_frames.get(ids[alone])
        columns["observations"] = stacks.reshape(len(ids), -1)
        columns["next_observations"] = nexts.reshape(len(ids), -1)
        return columns

    def _stacks(self, ids: np.ndarray) -> np.ndarray:
        """The observation stacks of rows `ids`, [n, k, frame] with the oldest frame first, from
        the stored frames.

        Each row's predecessors are followed back k - 1 steps at once for every row, and the
        frames of the rows reached (the row itself for the newest) are gathered in one pass; a
        row whose run's first held row came sooner takes its older frames from that row's whole
        stack."""
        rows = self._chains(ids)
        stacks = self.table.column("observations").take(rows, axis=0, mode="wrap")
        self._fill_from_first_stacks(stacks, rows)
        return stacks

    def _chains(self, ids: np.ndarray) -> np.ndarray:
        """int64 [n, k]: the insert id of the row whose frame each position of a row's stack
        holds, newest last; where the run's first held row came sooner, that row's id repeats."""
        k, back = self.form.stack_num, self._back
        rows = np.empty((len(ids), k), np.int64)
        rows[:, k - 1] = cursor = ids
        for j in range(k - 2, -1, -1):
            cursor = rows[:, j] = back.take(cursor, mode="wrap")
        return rows

    def _fill_from_first_stacks(self, stacks: np.ndarray, rows: np.ndarray) -> None:
        """Frames from before a run's first held row: that row's whole stack has them."""
        starts = (rows[:, 0] == rows[:, 1]).nonzero()[0]
        if len(starts) == 0:
            return
        k, frame = stacks.shape[1:]
        chains = rows[starts]
        whole = self.first_stacks.get(chains[:, 0]).reshape(len(starts), k, frame)
        if len(starts) <= FEW_STARTS:
            # A chain holds its run's first held row at positions 0..q-1: the positions before
            # q - 1 take the frames before that row's own, the last of its whole stack but one.
            for row, chain, first in zip(starts.tolist(), chains.tolist(), whole, strict=True):
                q = chain.count(chain[0])
                stacks[row, : q - 1] = first[k - q : k - 1]
            return
        missing = chains[:, :-1] == chains[:, 1:]  # a prefix of each row's positions
        depth = k - 1 - missing.sum(1)  # steps back from the row to its run's first held row
        at = np.nonzero(missing)
        stacks[starts[at[0]], at[1]] = whole[at[0], at[1] + depth[at[0]]]

    def state(self, views: bool = False) -> dict[str, Any]:
        """The table's state (its columns as views with `views`, see `ReplayTable.state`), its
        kept-aside values and its open runs, as plain arrays."""
        state = self.table.state(views=views)
        for prefix, store in self._stores():
            state.update({prefix + k: v for k, v in store.state().items()})
        state["open_runs"] = np.array(sorted(self._open.items()), np.int64).reshape(-1, 2)
        state["storage_form"] = self.form.words()
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore a `state()`; the links follow from the rows' bookkeeping columns."""
        saved = StorageForm.of_words(state.get("storage_form", [1, 0]))
        if saved != self.form:
            raise ValueError(
                f"the checkpoint's table stores stack_num {saved.stack_num}, ignore_obs_next "
                f"{saved.ignore_obs_next}; this job asks for {self.form.describe() or 'full rows'}"
            )
        table_state = {
            k: v
            for k, v in state.items()
            if not k.startswith(("first_stacks/", "next_frames/", "open_runs", "storage_form"))
        }
        self.table.load_state(table_state)
        for prefix, store in self._stores():
            store.load_state(
                {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
            )
        self._open = {int(k): int(i) for k, i in np.asarray(state["open_runs"]).reshape(-1, 2)}
        self._relink()

    def _stores(self) -> tuple[tuple[str, SideStore], ...]:
        return (("first_stacks/", self.first_stacks), ("next_frames/", self.next_frames))

    def _used_stores(self) -> tuple[SideStore, ...]:
        """The side stores this form fills (an unused one stays empty)."""
        used = (self.form.stack_num > 1, self.form.ignore_obs_next)
        return tuple(store for (_, store), use in zip(self._stores(), used, strict=True) if use)

    def _relink(self) -> None:
        """Rebuild the links of every held row from its run and step."""
        self._back.fill(-1)
        self._next.fill(-1)
        if self.size == 0:
            return
        ids = np.arange(self.table.total_inserted - self.size, self.table.total_inserted)
        slots = ids % self.capacity
        column = self.table.column
        keys = run_keys(column("episode_id")[slots], column("agent_id")[slots])
        _, _, prev, self._next[slots] = chain_runs(keys, column("step")[slots], ids)
        self._back[slots] = np.where(prev < 0, ids, prev)
