"""SumTree against brute force: numpy cumsum + searchsorted on the same priorities."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.replay.sum_tree import SumTree


def brute_find(priorities: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The leaf whose interval [cumsum[i-1], cumsum[i]) holds each value; beyond the total, the
    last non-zero leaf."""
    cumsum = np.cumsum(priorities)
    found = np.searchsorted(cumsum, values, side="right")
    last_nonzero = np.flatnonzero(priorities)[-1]
    return np.where(values >= cumsum[-1], last_nonzero, found)


@pytest.mark.parametrize("capacity", [1, 2, 5, 8, 100, 1000])
def test_find_prefix_matches_brute_force_on_integer_priorities(capacity: int) -> None:
    # Integer priorities keep every sum exact in float64, so leaves must match exactly.
    rng = np.random.default_rng(capacity)
    priorities = rng.integers(0, 5, capacity).astype(np.float64)
    priorities[rng.integers(0, capacity)] = 3.0  # at least one non-zero leaf
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), priorities)
    assert tree.total() == priorities.sum()
    cumsum = np.cumsum(priorities)
    boundaries = np.concatenate([[0.0], cumsum, cumsum - 0.5, [priorities.sum() + 1.0]])
    values = np.concatenate([rng.uniform(0, tree.total(), 500), boundaries])
    values = values[(values >= 0)]
    np.testing.assert_array_equal(tree.find_prefix(values), brute_find(priorities, values))


def test_find_prefix_never_returns_zero_priority_leaves() -> None:
    rng = np.random.default_rng(1)
    priorities = rng.random(777) * (rng.random(777) < 0.3)
    tree = SumTree(777)
    tree.update(np.arange(777), priorities)
    values = np.concatenate([rng.uniform(0, tree.total(), 5000), [0.0, tree.total()]])
    found = tree.find_prefix(values)
    assert np.all(priorities[found] > 0)
    # Each found leaf's interval holds its value, up to rounding of the float sums.
    cumsum = np.cumsum(priorities)
    inner = values < tree.total()
    lower, upper = cumsum[found] - priorities[found], cumsum[found]
    assert np.all(lower[inner] <= values[inner] + 1e-9)
    assert np.all(values[inner] <= upper[inner] + 1e-9)


def test_batch_update_with_duplicates_keeps_last_write() -> None:
    rng = np.random.default_rng(2)
    tree = SumTree(50)
    expected = np.zeros(50)
    for _ in range(20):
        indices = rng.integers(0, 50, 40)  # many duplicates
        priorities = rng.random(40)
        tree.update(indices, priorities)
        for i, p in zip(indices, priorities, strict=True):
            expected[i] = p
        np.testing.assert_array_equal(tree.get(np.arange(50)), expected)
        assert tree.total() == pytest.approx(expected.sum(), rel=1e-12)
    values = rng.uniform(0, tree.total(), 1000)
    np.testing.assert_array_equal(tree.find_prefix(values), brute_find(expected, values))


def test_update_range_matches_update() -> None:
    rng = np.random.default_rng(3)
    by_range, by_index = SumTree(37), SumTree(37)
    for _ in range(30):
        start = int(rng.integers(0, 37))
        stop = int(rng.integers(start, 38))
        priorities = rng.random(stop - start)
        by_range.update_range(start, stop, priorities)
        by_index.update(np.arange(start, stop), priorities)
    np.testing.assert_array_equal(by_range.state()["priorities"], by_index.state()["priorities"])
    assert by_range.total() == by_index.total()


def test_scalar_priority_broadcasts_and_zeroing_removes_weight() -> None:
    tree = SumTree(6)
    tree.update_range(0, 6, 2.0)
    assert tree.total() == 12.0
    tree.update(np.array([0, 5]), 0.0)
    assert tree.total() == 8.0
    np.testing.assert_array_equal(tree.find_prefix(np.array([0.0, 7.99, 8.0])), [1, 4, 4])


def test_state_round_trip_rebuilds_inner_nodes() -> None:
    rng = np.random.default_rng(4)
    tree = SumTree(100)
    tree.update(rng.integers(0, 100, 300), rng.random(300))
    restored = SumTree(100)
    restored.load_state(tree.state())
    np.testing.assert_array_equal(restored.state()["priorities"], tree.state()["priorities"])
    assert restored.total() == tree.total()
    values = rng.uniform(0, tree.total(), 500)
    np.testing.assert_array_equal(restored.find_prefix(values), tree.find_prefix(values))


def test_find_returns_leaves_with_their_priorities() -> None:
    rng = np.random.default_rng(5)
    tree = SumTree(300)
    tree.update(np.arange(300), rng.random(300))
    leaves, priorities = tree.find(rng.uniform(0, tree.total(), 64))
    np.testing.assert_array_equal(priorities, tree.get(leaves))


def test_rejects_bad_input() -> None:
    tree = SumTree(4)
    with pytest.raises(IndexError):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError):
        tree.load_state({"priorities": np.zeros(5)})
