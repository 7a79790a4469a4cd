"""A FIFO queue of on-policy items with a maximum policy lag (Reverb's `Queue`, plus the lag).

On-policy data is trained on once, by a policy at most `max_policy_lag` versions newer than the
one that collected it. Every inserted item gets the next insert id of its queue (the shard
tells the collector the ids of each batch it inserts, the collector tells the commander), so
the commander hands each learner exact ranges of ids to take (`take(ranges, min_version)`): no
two learners race for the same items, a batch holds the fragments its collect tasks were
planned to fill, and a deterministic run takes the same items every time. Items asked for
that are older than `min_version` are dropped (counted in `dropped`), never trained on
silently. A queue over `capacity` items evicts its oldest, counted in `evicted`. Items are kept
as the inserted batches (no ring, no preallocation: on-policy queues are short-lived and their
items large).
"""

from __future__ import annotations

from collections import deque

import numpy as np

Batch = dict[str, np.ndarray]
_COLUMN = "column/"


class ItemQueue:
    """Items of one group, in arrival order, with their insert ids and collecting versions."""

    prioritized = False

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ItemQueue capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.parts: deque[tuple[np.ndarray, Batch]] = deque()
        """(insert ids, columns) of each inserted batch still (partly) held."""
        self.size = 0
        self.total_inserted = 0
        self.evicted = 0
        self.dropped = 0
        self.taken = 0

    @staticmethod
    def versions_of(batch: Batch) -> np.ndarray:
        """One version per item: the oldest of its steps."""
        versions = batch["policy_version"]
        return versions.reshape(len(versions), -1).min(axis=1)

    def insert(self, batch: Batch) -> int:
        """Append a batch; returns the insert id of its first item (the others follow)."""
        n = len(batch["policy_version"])
        first = self.total_inserted
        ids = np.arange(first, first + n, dtype=np.int64)
        self.parts.append((ids, {k: np.array(v, copy=True) for k, v in batch.items()}))
        self.size += n
        self.total_inserted += n
        if self.size > self.capacity:
            self._evict(self.size - self.capacity)
        return first

    def take(self, ranges: list[list[int]], min_version: int) -> tuple[Batch | None, int]:
        """The held items whose insert ids lie in `ranges` ([first, count] pairs), in the
        order of the ranges, removed from the queue, and how many of them were dropped for a
        version older than `min_version`; (None, dropped) when none is left."""
        merged = self._merged()
        if merged is None:
            return None, 0
        ids, whole = merged
        position = {int(i): k for k, i in enumerate(ids)}
        asked = [i for first, n in ranges for i in range(first, first + n)]
        picked = np.array([position[i] for i in asked if i in position], np.int64)
        wanted = np.zeros(len(ids), bool)
        wanted[picked] = True
        fresh = picked[self.versions_of(whole)[picked] >= min_version]
        self._keep(ids, whole, ~wanted)
        dropped = len(picked) - len(fresh)
        self.dropped += dropped
        self.taken += len(fresh)
        if not len(fresh):
            return None, dropped
        return {k: v[fresh] for k, v in whole.items()}, dropped

    def _merged(self) -> tuple[np.ndarray, Batch] | None:
        if not self.parts:
            return None
        if len(self.parts) == 1:
            return self.parts[0]
        ids = np.concatenate([i for i, _ in self.parts])
        names = self.parts[0][1].keys()
        return ids, {k: np.concatenate([p[k] for _, p in self.parts]) for k in names}

    def _keep(self, ids: np.ndarray, whole: Batch, keep: np.ndarray) -> None:
        self.parts.clear()
        if keep.any():
            self.parts.append((ids[keep], {k: v[keep] for k, v in whole.items()}))
        self.size = int(keep.sum())

    def _evict(self, n: int) -> None:
        merged = self._merged()
        assert merged is not None
        ids, whole = merged
        keep = np.ones(len(ids), bool)
        keep[:n] = False
        self._keep(ids, whole, keep)
        self.evicted += n

    # -- checkpoints --------------------------------------------------------------------------
    def state(self, views: bool = False) -> dict[str, np.ndarray]:
        """Held items in order with their ids, and the counters, as plain arrays. Items are
        never changed in place, so `views` (taken by a checkpoint) changes nothing."""
        state: dict[str, np.ndarray] = {}
        merged = self._merged()
        if merged is not None:
            ids, whole = merged
            state = {_COLUMN + k: v for k, v in whole.items()}
            state["insert_ids"] = ids
        counters = [self.total_inserted, self.evicted, self.dropped, self.taken]
        state["queue_counters"] = np.array(counters, dtype=np.int64)
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        columns = {k[len(_COLUMN) :]: v for k, v in state.items() if k.startswith(_COLUMN)}
        self.parts.clear()
        self.size = 0
        if columns:
            ids = np.asarray(state["insert_ids"], np.int64)
            self.parts.append((ids, {k: np.asarray(v) for k, v in columns.items()}))
            self.size = len(ids)
        if self.size > self.capacity:
            raise ValueError(
                f"state holds {self.size} items; this queue's capacity is {self.capacity}"
            )
        counters = [int(c) for c in state["queue_counters"]]
        self.total_inserted, self.evicted, self.dropped, self.taken = counters
