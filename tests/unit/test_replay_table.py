"""ReplayTable: ring order, eviction counts, schema errors, sampling laws and checkpoint state."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.replay.table import ReplayTable


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """Rows numbered from `start`, so the table's contents say which rows it kept."""
    ids = np.arange(start, start + n)
    return {
        "observations": np.stack([ids, -ids], axis=1).astype(np.float32),
        "actions": ids.astype(np.int64),
        "terminations": ids % 2 == 0,
    }


def fill(table: ReplayTable, total: int, batch: int) -> None:
    for start in range(0, total, batch):
        table.insert(make_batch(start, min(batch, total - start)))


def held_rows(table: ReplayTable) -> np.ndarray:
    return table.state()["column/actions"]


def test_ring_wraps_keeping_newest_in_order_and_counts_evictions() -> None:
    table = ReplayTable(10)
    fill(table, 27, batch=4)
    np.testing.assert_array_equal(held_rows(table), np.arange(17, 27))
    np.testing.assert_array_equal(table.state()["insert_ids"], np.arange(17, 27))
    assert (table.size, table.total_inserted, table.evicted) == (10, 27, 17)


def test_batch_larger_than_capacity_keeps_its_tail() -> None:
    table = ReplayTable(5)
    table.insert(make_batch(0, 3))
    table.insert(make_batch(3, 12))
    np.testing.assert_array_equal(held_rows(table), np.arange(10, 15))
    np.testing.assert_array_equal(table.state()["insert_ids"], np.arange(10, 15))
    assert (table.size, table.total_inserted, table.evicted) == (5, 15, 10)


@pytest.mark.parametrize(
    ("change", "column"),
    [
        (lambda b: b.pop("actions"), "actions"),
        (lambda b: b.update(extra=np.zeros(4)), "extra"),
        (lambda b: b.update(actions=b["actions"].astype(np.int32)), "actions"),
        (lambda b: b.update(observations=np.zeros((4, 3), np.float32)), "observations"),
        (lambda b: b.update(terminations=b["terminations"][:3]), "terminations"),
    ],
)
def test_schema_mismatch_names_the_column(change, column: str) -> None:
    table = ReplayTable(8)
    table.insert(make_batch(0, 4))
    batch = make_batch(4, 4)
    change(batch)
    with pytest.raises(ValueError, match=column):
        table.insert(batch)
    assert table.total_inserted == 4


def test_bad_first_batch_leaves_schema_open() -> None:
    table = ReplayTable(8)
    batch = make_batch(0, 4)
    batch["actions"] = batch["actions"][:2]
    with pytest.raises(ValueError, match="actions"):
        table.insert(batch)
    table.insert(make_batch(0, 4))
    assert table.size == 4


def test_sample_on_empty_table_raises() -> None:
    with pytest.raises(ValueError):
        ReplayTable(4).sample(2)


def test_uniform_sampling_covers_all_items_and_returns_fresh_arrays() -> None:
    table = ReplayTable(50, seed=1)
    fill(table, 70, batch=7)
    batch, info = table.sample(2000)
    assert set(batch["actions"].tolist()) == set(range(20, 70))
    np.testing.assert_array_equal(info.insert_ids, batch["actions"])
    np.testing.assert_array_equal(batch["observations"][:, 0], batch["actions"])
    assert info.weights.dtype == np.float32 and np.all(info.weights == 1.0)
    batch["actions"][:] = -1
    assert held_rows(table).min() == 20
    for column in batch.values():  # ready for a nonblocking send as one buffer each
        assert column.flags.c_contiguous and column.flags.writeable


def test_prioritized_sampling_frequencies_follow_priorities() -> None:
    table = ReplayTable(8, prioritized=True, alpha=1.0, eps=0.0, seed=2)
    fill(table, 8, batch=8)
    td = np.arange(1, 9, dtype=np.float64)
    assert table.update_priorities(np.arange(8), np.arange(8), td) == 8
    draws = 40_000
    counts = np.zeros(8)
    for _ in range(draws // 64):
        _, info = table.sample(64)
        counts += np.bincount(info.indices, minlength=8)
    expected = td / td.sum() * counts.sum()
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert chi_square < 30  # 7 degrees of freedom; p < 1e-4 above this


def test_stale_priority_updates_are_skipped() -> None:
    table = ReplayTable(4, prioritized=True, alpha=1.0, eps=0.0, seed=3)
    fill(table, 4, batch=4)
    _, info = table.sample(4)
    table.insert(make_batch(4, 2))  # overwrites slots 0 and 1
    updated = table.update_priorities(info.indices, info.insert_ids, np.full(4, 5.0))
    assert updated == int(np.sum(info.indices >= 2))
    priorities = table.state()["priorities"]  # oldest first: slots 2, 3, 0, 1
    slot_priority = dict(zip([2, 3, 0, 1], priorities, strict=True))
    for slot in range(4):
        assert slot_priority[slot] == (5.0 if slot >= 2 and slot in info.indices else 1.0)


def test_new_items_get_max_priority_seen() -> None:
    table = ReplayTable(4, prioritized=True, alpha=0.5, eps=0.0)
    table.insert(make_batch(0, 2))
    table.update_priorities(np.array([0, 1]), np.array([0, 1]), np.array([16.0, 4.0]))
    table.insert(make_batch(2, 1))
    np.testing.assert_allclose(table.state()["priorities"], [4.0, 2.0, 4.0])


def test_items_wrapping_to_slot_zero_get_max_priority() -> None:
    table = ReplayTable(4, prioritized=True, alpha=1.0, eps=0.0)
    fill(table, 3, batch=3)
    table.update_priorities(np.arange(3), np.arange(3), np.array([0.5, 3.0, 0.25]))
    table.insert(make_batch(3, 3))  # slots 3, 0, 1
    np.testing.assert_allclose(table.state()["priorities"], [0.25, 3.0, 3.0, 3.0])


def test_importance_weights_by_hand() -> None:
    table = ReplayTable(3, prioritized=True, alpha=1.0, beta=0.5, eps=0.0, seed=4)
    fill(table, 3, batch=3)
    table.update_priorities(np.arange(3), np.arange(3), np.array([1.0, 2.0, 5.0]))
    _, info = table.sample(200)
    probabilities = np.array([1.0, 2.0, 5.0]) / 8.0
    raw = (3 * probabilities) ** -0.5
    expected = raw[info.indices] / raw[info.indices].max()
    np.testing.assert_allclose(info.weights, expected, rtol=1e-6)
    assert info.weights.dtype == np.float32
    # By hand: w = (3 * p / 8)^-0.5, over the max (p = 1): sqrt(1 / p).
    by_hand = {0: 1.0, 1: 1 / np.sqrt(2), 2: 1 / np.sqrt(5)}
    for slot, weight in zip(info.indices, info.weights, strict=True):
        assert weight == pytest.approx(by_hand[slot], rel=1e-6)


def test_uniform_table_refuses_priorities() -> None:
    table = ReplayTable(4)
    fill(table, 4, batch=4)
    with pytest.raises(ValueError, match="prioritized"):
        table.update_priorities(np.arange(2), np.arange(2), np.ones(2))


def assert_states_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert np.asarray(a[key]).dtype == np.asarray(b[key]).dtype, key


@pytest.mark.parametrize("prioritized", [False, True])
def test_state_round_trip_is_exact_and_resumes_sampling(prioritized: bool) -> None:
    table = ReplayTable(16, prioritized=prioritized, seed=5)
    fill(table, 45, batch=6)
    if prioritized:
        _, info = table.sample(10)
        table.update_priorities(info.indices, info.insert_ids, np.linspace(0.1, 3.0, 10))
    table.sample(3)  # move the RNG on
    restored = ReplayTable(16, prioritized=prioritized, seed=99)
    restored.load_state(table.state())
    assert_states_equal(restored.state(), table.state())
    assert (restored.size, restored.total_inserted, restored.evicted) == (16, 45, 29)
    for source in (table, restored):
        source.insert(make_batch(45, 5))
    (batch_a, info_a), (batch_b, info_b) = table.sample(32), restored.sample(32)
    assert_states_equal(batch_a, batch_b)
    assert_states_equal(vars_of(info_a), vars_of(info_b))


def vars_of(info) -> dict[str, np.ndarray]:
    return {"indices": info.indices, "insert_ids": info.insert_ids, "weights": info.weights}


def test_state_of_empty_and_partial_tables_round_trips() -> None:
    empty = ReplayTable(4)
    restored = ReplayTable(4)
    restored.load_state(empty.state())
    assert restored.size == 0 and restored.columns == ()
    partial = ReplayTable(8)
    fill(partial, 3, batch=3)
    bigger = ReplayTable(20)
    bigger.load_state(partial.state())
    np.testing.assert_array_equal(held_rows(bigger), [0, 1, 2])
    bigger.insert(make_batch(3, 1))
    np.testing.assert_array_equal(held_rows(bigger), [0, 1, 2, 3])


def test_state_is_plain_arrays() -> None:
    table = ReplayTable(8, prioritized=True)
    fill(table, 11, batch=4)
    for key, value in table.state().items():
        assert isinstance(value, np.ndarray) and value.dtype != object, key


def test_load_state_refuses_what_does_not_fit_and_keeps_contents() -> None:
    table = ReplayTable(8, prioritized=True)
    fill(table, 8, batch=8)
    state = table.state()
    with pytest.raises(ValueError, match="capacity"):
        ReplayTable(4).load_state(state)
    target = ReplayTable(8, prioritized=True)
    fill(target, 3, batch=3)
    broken = [
        dict(state, insert_ids=state["insert_ids"][::-1]),
        dict(state, priorities=state["priorities"][:3]),
        {k: v for k, v in state.items() if k != "priorities"},
        dict(state, **{"column/actions": state["column/actions"][:5]}),
    ]
    for bad in broken:
        with pytest.raises(ValueError):
            target.load_state(bad)
    np.testing.assert_array_equal(held_rows(target), [0, 1, 2])


def test_all_zero_priorities_refuse_to_sample() -> None:
    table = ReplayTable(4, prioritized=True, eps=0.0)
    fill(table, 2, batch=2)
    table.update_priorities(np.arange(2), np.arange(2), np.zeros(2))
    with pytest.raises(ValueError, match="eps"):
        table.sample(1)


def test_mismatched_indices_and_ids_are_refused() -> None:
    table = ReplayTable(4, prioritized=True)
    fill(table, 4, batch=4)
    with pytest.raises(ValueError, match="SampleInfo"):
        table.update_priorities(np.array([0, 1]), np.array([1, 0]), np.ones(2))
