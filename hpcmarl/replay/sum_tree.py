"""A sum tree over non-negative priorities, updated and searched one batch at a time.

Prioritized replay draws a whole batch per learner step, so the tree works on arrays: one round
of numpy calls per tree level, never a Python loop per item. The tree lives in one flat float64
array in heap order (root at 1, children of node `i` at `2i` and `2i + 1`, leaves from `size`
on), with the leaf count rounded up to a power of two so that every level is complete. Parents
are always recomputed from their children, never nudged by deltas, so rounding errors do not
accumulate however long the run.

For batches of tens of items the cost is the number of numpy calls, not the arithmetic, so the
loops below keep calls per level few: flat gathers rather than 2-D ones, in-place updates, and
plain scalar arithmetic once a batch's paths have merged into one.
"""

from __future__ import annotations

import numpy as np


def _last_occurrences(indices: np.ndarray) -> np.ndarray:
    """Positions of the last write to each distinct index, in ascending index order.

    numpy does not promise an order for repeated indices in a fancy assignment, so the winner is
    chosen here, explicitly.
    """
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    is_last = np.empty(len(ordered), dtype=bool)
    is_last[-1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=is_last[:-1])
    return order[is_last]


class SumTree:
    """Priorities of `capacity` slots, with their running sum and prefix-sum search.

    Leaf `i` owns the half-open interval `[sum(p[:i]), sum(p[:i + 1]))` of `[0, total())`, so a
    uniform draw in that range lands on leaf `i` with probability `p[i] / total()`. Leaves of
    priority zero own an empty interval and are never found.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._size = 1 << (self.capacity - 1).bit_length()
        self._depth = self._size.bit_length() - 1
        self._tree = np.zeros(2 * self._size, dtype=np.float64)
        self._right = self._tree[1:]  # `_right[i]` is `_tree[i + 1]`: a gather, not an addition
        self._cells = self._tree.data  # a memoryview: scalar reads and writes as Python floats

    def total(self) -> float:
        """The sum of all priorities: the upper end of the range `find_prefix` searches."""
        return float(self._tree[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Priorities of the given leaves (a fresh array)."""
        return self._tree[self._size + self._check_indices(indices)]

    def update(self, indices: np.ndarray, priorities: np.ndarray | float) -> None:
        """Set leaf priorities; where an index repeats, its last priority in the batch wins."""
        indices = self._check_indices(indices)
        priorities = self._check_priorities(priorities, len(indices))
        if len(indices):
            self.set_leaves(indices, priorities)

    def set_leaves(self, indices: np.ndarray, priorities: np.ndarray | float) -> None:
        """`update` for a caller that has checked its arguments itself: at least one int64
        index, each in range, and finite priorities >= 0 (a replay table's priority update,
        whose indices are those of live insert ids, costs fewer numpy calls so)."""
        last = _last_occurrences(indices)
        nodes = indices[last] + self._size
        self._tree[nodes] = priorities[last] if isinstance(priorities, np.ndarray) else priorities
        # `nodes` is sorted, so all paths have merged once its ends have: after as many levels
        # as their XOR has bits. A parent shared by several nodes is written several times with
        # the same sum: cheaper than deduplicating.
        for _ in range((int(nodes[0]) ^ int(nodes[-1])).bit_length()):
            left = nodes & -2
            nodes >>= 1
            self._tree[nodes] = self._tree[left] + self._right[left]
        self._refresh_path(int(nodes[0]))

    def update_range(self, start: int, stop: int, priorities: np.ndarray | float) -> None:
        """Set the priorities of leaves `start..stop-1`; the parents of a run of leaves form a run
        at every level, so this costs slices, not gathers (the path of every replay insert)."""
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"leaf range [{start}, {stop}) is outside [0, {self.capacity})")
        priorities = self._check_priorities(priorities, stop - start)
        if start == stop:
            return
        lo, hi = start + self._size, stop + self._size
        self._tree[lo:hi] = priorities
        tree = self._tree
        while hi - lo > 1:
            lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
            np.add(tree[2 * lo : 2 * hi : 2], tree[2 * lo + 1 : 2 * hi : 2], out=tree[lo:hi])
        self._refresh_path(lo)

    def _refresh_path(self, node: int) -> None:
        """Recompute the ancestors of one node, as scalars: a numpy call per level costs more."""
        tree = self._cells
        while node > 1:
            node >>= 1
            tree[node] = tree[2 * node] + tree[2 * node + 1]

    def find_prefix(self, values: np.ndarray) -> np.ndarray:
        """Leaves whose interval holds each value, found by descending all values level by level.

        A value at or above `total()` (rounding can push a draw there) maps to the last leaf of
        non-zero priority, never to a leaf of priority zero, as long as `total()` is positive.
        """
        return self.find(values)[0]

    def find(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`find_prefix` and the priorities of the leaves found, which sampling needs next."""
        nodes = self._descend(np.maximum(values, 0.0, dtype=np.float64))
        priorities = self._tree[nodes]
        empty = priorities == 0.0
        if empty.any():  # rare: rounding carried a value past its subtree's sum
            redo = np.maximum(np.asarray(values)[empty], 0.0, dtype=np.float64)
            nodes[empty] = self._descend(redo, avoid_empty=True)
            priorities = self._tree[nodes]
        return nodes - self._size, priorities

    def _descend(self, values: np.ndarray, avoid_empty: bool = False) -> np.ndarray:
        """Node ids of the leaves holding `values` (which it consumes). In exact arithmetic a
        value that goes right finds a non-empty right subtree; `avoid_empty` makes sure of it,
        at two more numpy calls per level, for the few values that rounding pushed over."""
        tree, right = self._tree, self._right
        nodes = np.ones(len(values), dtype=np.int64)
        for _ in range(self._depth):
            nodes <<= 1
            left = tree[nodes]
            go_right = values >= left
            if avoid_empty:
                go_right &= right[nodes] > 0.0
            np.subtract(values, left, out=values, where=go_right)
            nodes += go_right
        return nodes

    def state(self) -> dict[str, np.ndarray]:
        """The leaves alone: every inner node follows from them."""
        return {"priorities": self._tree[self._size : self._size + self.capacity].copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore leaves saved by `state` and rebuild the inner nodes bottom-up."""
        leaves = np.asarray(state["priorities"], dtype=np.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(
                f"SumTree state holds {leaves.shape} priorities; this tree needs ({self.capacity},)"
            )
        self.update_range(0, self.capacity, leaves)

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.capacity):
            raise IndexError(f"leaf index outside [0, {self.capacity})")
        return indices

    @staticmethod
    def _check_priorities(priorities: np.ndarray | float, n: int) -> np.ndarray | float:
        """Priorities as a float or a length-`n` float64 array, refused unless finite and >= 0.
        A scalar is checked in plain Python: a replay insert passes one per batch."""
        if isinstance(priorities, (float, int, np.number)):
            if not 0.0 <= priorities < np.inf:
                raise ValueError(f"priorities must be finite and >= 0, got {priorities}")
            return float(priorities)
        priorities = np.asarray(priorities, dtype=np.float64)
        if priorities.shape != (n,):
            raise ValueError(f"expected {n} priorities, got an array of shape {priorities.shape}")
        # NaN fails the first test; +inf fails the second.
        if n and not (priorities.min() >= 0.0 and priorities.max() < np.inf):
            raise ValueError("priorities must be finite and >= 0")
        return priorities
