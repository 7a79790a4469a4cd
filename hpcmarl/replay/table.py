"""One policy's replay: a columnar ring buffer with uniform or prioritized sampling.

Columns are preallocated numpy arrays, so an insert is a slice copy per column and a sample is a
gather per column; nothing is stored per transition in Python. Every item has a monotonic insert
id, so that a priority update computed from an old sample can tell whether the slot it names still
holds the same item (the ring may have overwritten it since). The ring keeps its items in insert
order, so an id follows from its slot and is never stored. What the ring overwrites is counted in
`evicted`, never dropped silently.

Sampling follows Schaul et al. (2016), "Prioritized Experience Replay": P(i) = p_i / sum_k p_k
with p_i = (|td_i| + eps)^alpha kept in a sum tree, and importance-sampling weights
w_i = (size * P(i))^-beta divided by the batch maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcmarl.replay.schema import ColumnSchema
from hpcmarl.replay.sum_tree import SumTree
from hpcmarl.rng import rng_from_words, rng_to_words
from hpcmarl.storage.hdf5 import Pieces

_COLUMN_PREFIX = "column/"


@dataclass(slots=True)
class SampleInfo:
    """Where a sampled batch came from, so the learner can send priorities back for it."""

    indices: np.ndarray
    """Table slots of the sampled rows (int64)."""
    insert_ids: np.ndarray
    """Insert ids of the sampled rows (int64): a priority update applies only while they match."""
    weights: np.ndarray
    """Importance-sampling weights (float32), all ones for uniform sampling."""


class ReplayTable:
    """A ring buffer of `capacity` rows per column; the first insert fixes the column schema.

    The item with insert id `i` lives in slot `i % capacity`, always: the slot of an id, the id in
    a slot and whether a sampled item is still held all follow from `total_inserted`, so nothing
    is stored per slot beyond the columns and (when prioritized) the sum tree.
    """

    def __init__(
        self,
        capacity: int,
        *,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int = 0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"ReplayTable capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.prioritized = prioritized
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._reset()

    def _reset(self) -> None:
        """Empty the table and forget its schema, keeping its configuration and RNG."""
        self.size = 0
        self.total_inserted = 0
        self.evicted = 0
        self._rows = self._first_rows  # the schema's `rows` once the first batch has fixed it
        self._items: tuple[tuple[str, np.ndarray], ...] = ()
        self._tree = SumTree(self.capacity) if self.prioritized else None
        self._max_priority = 1.0

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names fixed by the first insert (empty before it)."""
        return tuple(name for name, _ in self._items)

    def column(self, name: str) -> np.ndarray:
        """The stored column (all `capacity` slots; slot `i % capacity` holds insert id i)."""
        for held, column in self._items:
            if held == name:
                return column
        raise KeyError(f"the table has no column {name!r}; it has {list(self.columns)}")

    def nbytes(self) -> int:
        """Bytes the preallocated columns hold (the sum tree not counted)."""
        return sum(column.nbytes for _, column in self._items)

    def skip(self, n: int) -> None:
        """Count `n` rows as inserted and evicted at once, as the head of an oversize batch is."""
        self.total_inserted += n
        self.evicted += n

    def insert(self, batch: dict[str, np.ndarray]) -> None:
        """Append a batch; the oldest rows make room once the ring is full."""
        n = self._rows(batch)
        capacity = self.capacity
        if n > capacity:
            batch, n = self._skip_head(batch, n)
        start = self.total_inserted % capacity
        self.total_inserted += n
        size = self.size + n
        if size > capacity:
            self.evicted += size - capacity
            size = capacity
        self.size = size
        if start + n <= capacity and self._tree is None:  # the common case, inlined: no wrap
            window = slice(start, start + n)  # built once, not once per column
            for name, column in self._items:
                column[window] = batch[name]
        else:
            self._write(start, batch, n)

    def _first_rows(self, batch: dict[str, np.ndarray]) -> int:
        """`_rows` until the first insert: fix the schema from this batch, then check against it."""
        self._allocate(ColumnSchema(batch))
        return self._rows(batch)

    def _skip_head(self, batch: dict[str, np.ndarray], n: int) -> tuple[dict, int]:
        """Count the head of an oversize batch as inserted and evicted at once; keep its tail."""
        skipped = n - self.capacity
        self.skip(skipped)
        return {name: column[skipped:] for name, column in batch.items()}, self.capacity

    def sample(self, n: int) -> tuple[dict[str, np.ndarray], SampleInfo]:
        """Draw `n` rows with replacement; the returned arrays are fresh copies the caller owns."""
        return self.sample_leaving(n, ())

    def sample_leaving(
        self, n: int, leave: tuple[str, ...]
    ) -> tuple[dict[str, np.ndarray], SampleInfo]:
        """`sample`, without gathering the columns named in `leave` (a caller that rebuilds
        them itself)."""
        if self.size == 0 or n < 1:
            raise ValueError(f"cannot sample {n} rows from a table of {self.size}; insert first")
        if self._tree is None:
            ids = self._rng.integers(self.total_inserted - self.size, self.total_inserted, n)
            slots = ids % self.capacity
            weights = np.empty(n, dtype=np.float32)
            weights.fill(1.0)
        else:
            slots, weights = self._sample_prioritized(n)
            ids = self._slot_ids(slots)
        batch = {name: column[slots] for name, column in self._items if name not in leave}
        return batch, SampleInfo(slots, ids, weights)

    def update_priorities(
        self, indices: np.ndarray, insert_ids: np.ndarray, td_errors: np.ndarray
    ) -> int:
        """Set p = (|td| + eps)^alpha for rows still holding the sampled item; return how many.

        A row overwritten since it was sampled keeps the priority of its new item: the TD error
        was computed for an item that is gone.
        """
        if self._tree is None:
            raise ValueError("update_priorities needs a table created with prioritized=True")
        indices = np.asarray(indices, dtype=np.int64)
        insert_ids = np.asarray(insert_ids, dtype=np.int64)
        td_errors = np.asarray(td_errors, dtype=np.float64)
        if not indices.shape == insert_ids.shape == td_errors.shape:
            raise ValueError("indices, insert_ids and td_errors must have the same shape")
        if (insert_ids % self.capacity != indices).any():
            raise ValueError("indices do not match insert_ids; pass both from one SampleInfo")
        live = (insert_ids >= self.total_inserted - self.size) & (insert_ids < self.total_inserted)
        if not live.all():
            indices, td_errors = indices[live], td_errors[live]
        if not len(indices):
            return 0
        priorities = (np.abs(td_errors) + self.eps) ** self.alpha
        highest = float(priorities.max())
        if not highest < np.inf:  # NaN fails it too
            raise ValueError(f"td_errors must be finite, got a priority of {highest}")
        # Live insert ids hold rows of this table, so their indices are in range.
        self._tree.set_leaves(indices, priorities)
        self._max_priority = max(self._max_priority, highest)
        return len(indices)

    def state(self, views: bool = False) -> dict[str, Any]:
        """Everything needed to resume: rows oldest first, their ids and priorities, counters and
        the RNG, as plain arrays (no pickles) for an HDF5 checkpoint.

        With `views`, each column is the ring's one or two slices (`Pieces`, oldest first)
        rather than a copy: for a checkpoint written from the table's memory, by a caller that
        inserts nothing until the file is written."""
        ids = np.arange(self.total_inserted - self.size, self.total_inserted, dtype=np.int64)
        order = ids % self.capacity
        if views:
            start = int(order[0]) if len(order) else 0
            tail = min(self.size, self.capacity - start)
            state: dict[str, Any] = {
                _COLUMN_PREFIX + name: Pieces(
                    (column[start : start + tail], column[: self.size - tail])
                )
                for name, column in self._items
            }
        else:
            state = {_COLUMN_PREFIX + name: column[order] for name, column in self._items}
        state["insert_ids"] = ids
        if self._tree is not None:
            state["priorities"] = self._tree.get(order)
            state["max_priority"] = np.array(self._max_priority, dtype=np.float64)
        state["counters"] = np.array([self.total_inserted, self.evicted], dtype=np.int64)
        state["rng"] = rng_to_words(self._rng)
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace this table's contents with a `state()`; the round trip is exact, and with an
        unchanged capacity every row returns to its slot, so later samples match those the saved
        table would have drawn. A larger capacity is fine too. A state that does not fit is
        refused before anything is replaced. A state without `rng` (a shard that a re-deal adds,
        `replay.redistribute`) keeps the generator this table was seeded with, so that no two
        shards draw the same samples."""
        ids = np.asarray(state["insert_ids"], dtype=np.int64)
        total_inserted, evicted = (int(c) for c in state["counters"])
        prefix = len(_COLUMN_PREFIX)
        columns = {k[prefix:]: v for k, v in state.items() if k.startswith(_COLUMN_PREFIX)}
        schema = ColumnSchema(columns) if columns else None
        rows = schema.rows(columns) if schema is not None else 0
        _check_state(state, ids, total_inserted, self, rows)
        self._reset()
        if schema is not None:
            self._allocate(schema)
        self.size, self.total_inserted, self.evicted = len(ids), total_inserted, evicted
        self._write((total_inserted - self.size) % self.capacity, columns, self.size)
        if self._tree is not None:
            self._tree.update(ids % self.capacity, state["priorities"])
            self._max_priority = float(state["max_priority"])
        if "rng" in state:
            self._rng.bit_generator.state = rng_from_words(state["rng"])

    def _slot_ids(self, slots: np.ndarray) -> np.ndarray:
        """Insert ids of the items held in `slots`: the newest id congruent to each slot."""
        cursor = self.total_inserted % self.capacity
        ids = slots + (self.total_inserted - cursor)
        np.subtract(ids, self.capacity, out=ids, where=slots >= cursor)
        return ids

    def _sample_prioritized(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratified draw: one uniform value in each of `n` equal slices of the total priority,
        which spreads a batch over the whole distribution with lower variance than n iid draws.

        The batch maximum of w_i = (size * p_i / total)^-beta belongs to the smallest p, so the
        normalised weight is (p_i / p_min)^-beta: size and total cancel.
        """
        assert self._tree is not None
        total = self._tree.total()
        if not total > 0.0:
            raise ValueError("every priority is zero; use eps > 0 so each item keeps a chance")
        values = self._rng.random(n)
        values += np.arange(n)
        values *= total / n
        slots, priorities = self._tree.find(values)
        priorities /= priorities.min()
        return slots, np.power(priorities, -self.beta, dtype=np.float32)

    def _allocate(self, schema: ColumnSchema) -> None:
        """Adopt a schema and preallocate `capacity` rows per column."""
        self._rows = schema.rows
        self._items = tuple(
            (name, np.zeros((self.capacity, *trailing), dtype))
            for name, (dtype, trailing) in schema.columns.items()
        )

    def _write(self, start: int, batch: dict[str, np.ndarray], n: int) -> None:
        """Copy `n` rows into slots from `start`, as two slices when they wrap past the end."""
        wrap = start + n - self.capacity  # rows that go round to slot 0, if positive
        if wrap <= 0:
            window = slice(start, start + n)
            for name, column in self._items:
                column[window] = batch[name]
        else:
            for name, column in self._items:
                rows = batch[name]
                column[start:] = rows[: n - wrap]
                column[:wrap] = rows[n - wrap :]
        if self._tree is not None:
            self._tree.update_range(start, min(start + n, self.capacity), self._max_priority)
            self._tree.update_range(0, max(wrap, 0), self._max_priority)


def _check_state(
    state: dict[str, np.ndarray], ids: np.ndarray, total: int, table: ReplayTable, rows: int
) -> None:
    """Refuse a state the table cannot hold: too many rows, columns or priorities that do not
    match the ids, or ids that are not the newest `len(ids)` in insertion order."""
    n = len(ids)
    if n > table.capacity:
        raise ValueError(f"state holds {n} rows; this table's capacity is {table.capacity}")
    if not np.array_equal(ids, np.arange(total - n, total)):
        raise ValueError("state insert_ids are not consecutive up to its total_inserted counter")
    if rows != n:
        raise ValueError(f"state columns hold {rows} rows but it lists {n} insert ids")
    if table.prioritized and ("priorities" not in state or np.shape(state["priorities"]) != (n,)):
        raise ValueError(f"a prioritized table needs {n} priorities in the state")
