"""The PSRO payoff table: growth keeps every entry, its statistics match numpy, checkpoints are
exact."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcmarl.psro.payoff import PayoffTable
from hpcmarl.storage.hdf5 import StorageError


def grown(sizes: tuple[int, int]) -> PayoffTable:
    table = PayoffTable()
    for player, size in enumerate(sizes):
        for _ in range(size):
            table.add_policy(player)
    return table


def filled(seed: int = 0) -> tuple[PayoffTable, dict[tuple[int, int], np.ndarray]]:
    """A 2 x 3 table with a different number of zero-sum episodes in each entry."""
    rng = np.random.default_rng(seed)
    table, episodes = grown((2, 3)), {}
    for k, entry in enumerate(np.ndindex(2, 3)):
        first = rng.normal(size=k + 2)
        episodes[entry] = np.stack([first, -first], axis=1)
        table.record(entry, episodes[entry])
    return table, episodes


def test_a_new_table_is_empty_and_grows_one_axis_per_call() -> None:
    table = PayoffTable()
    assert table.sizes == (0, 0) and table.missing(1) == []
    assert table.add_policy(0) == 0 and table.add_policy(1) == 0 and table.add_policy(1) == 1
    assert table.sizes == (1, 2)
    assert table.mean().shape == (2, 1, 2) and np.isnan(table.mean()).all()
    assert table.missing(1) == [(0, 0), (0, 1)]


def test_growth_keeps_every_earlier_entry_and_opens_only_new_ones() -> None:
    table, _ = filled()
    before = table.state_dict()
    assert table.add_policy(0) == 2 and table.add_policy(1) == 3
    assert table.sizes == (3, 4)
    np.testing.assert_array_equal(table.sums[:, :2, :3], before["sums"])
    np.testing.assert_array_equal(table.sums_sq[:, :2, :3], before["sums_sq"])
    np.testing.assert_array_equal(table.counts[:2, :3], before["counts"])
    new_row_and_column = [(0, 3), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert table.missing(1) == new_row_and_column
    assert (0, 3) in table.missing(2) and (0, 0) in table.missing(3)  # entry (0, 0) has 2 episodes


def test_mean_and_standard_error_match_numpy_on_the_same_samples() -> None:
    table, episodes = filled()
    for entry, returns in episodes.items():
        assert table.counts[entry] == len(returns)
        np.testing.assert_allclose(table.mean()[(slice(None), *entry)], returns.mean(axis=0))
        expected = returns.std(axis=0, ddof=1) / np.sqrt(len(returns))
        np.testing.assert_allclose(table.standard_error()[(slice(None), *entry)], expected)
    np.testing.assert_allclose(table.mean()[0] + table.mean()[1], 0.0, atol=1e-12)


def test_episodes_add_up_in_any_grouping() -> None:
    returns = np.array([[1.0, -1.0], [2.0, -2.0], [-1.0, 1.0]])
    batched, single = grown((1, 1)), grown((1, 1))
    batched.record((0, 0), returns)
    for episode in returns[::-1]:
        single.record((0, 0), episode)
    for name, array in batched.state_dict().items():
        np.testing.assert_allclose(array, single.state_dict()[name])
    one = grown((1, 1))
    one.record((0, 0), returns[0])
    assert np.isnan(one.standard_error()).all()  # one episode says nothing of the spread


def test_state_dict_round_trip_is_exact_and_independent() -> None:
    table, _ = filled()
    copy = PayoffTable.from_state(table.state_dict())
    for name, array in table.state_dict().items():
        np.testing.assert_array_equal(copy.state_dict()[name], array)
    copy.record((0, 0), np.array([5.0, -5.0]))
    assert table.counts[0, 0] == copy.counts[0, 0] - 1


def test_hdf5_round_trip_through_a_real_file_then_more_growth(tmp_path: Path) -> None:
    table, _ = filled()
    path = tmp_path / "payoff.h5"
    with h5py.File(path, "w") as f:
        table.save(f.create_group("psro/payoff"))
    with h5py.File(path, "r") as f:
        assert sorted(f["psro/payoff"]) == ["counts", "sums", "sums_sq"]  # plain datasets
        loaded = PayoffTable.load(f["psro/payoff"])
    assert loaded.sizes == table.sizes
    for name, array in table.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[name], array)
    loaded.add_policy(1)
    loaded.record((1, 3), np.array([[1.0, -1.0], [0.0, 0.0]]))
    with h5py.File(path, "a") as f:
        loaded.save(f["psro/payoff"])  # overwrite in place with the grown table
    with h5py.File(path, "r") as f:
        again = PayoffTable.load(f["psro/payoff"])
    np.testing.assert_array_equal(again.sums[:, :, :3], table.sums)
    assert again.counts[1, 3] == 2 and again.missing(1) == [(0, 3)]


def test_an_empty_table_round_trips(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        PayoffTable(n_players=3).save(f)
        loaded = PayoffTable.load(f)
    assert loaded.n_players == 3 and loaded.sizes == (0, 0, 0)


def test_wrong_input_is_refused_with_its_cause(tmp_path: Path) -> None:
    table = grown((2, 2))
    with pytest.raises(IndexError, match=r"entry \(2, 0\) is outside a payoff table of sizes"):
        table.record((2, 0), np.zeros(2))
    with pytest.raises(ValueError, match="do not fit a 2-player table"):
        table.record((0, 0), np.zeros(3))
    with pytest.raises(IndexError, match="player 2 is not one of"):
        table.add_policy(2)
    with pytest.raises(ValueError, match="must be \\[n_players, \\*counts.shape\\]"):
        PayoffTable.from_state({**table.state_dict(), "counts": np.zeros((2, 3), np.int64)})
    with pytest.raises(ValueError, match=r"lacks \['sums_sq'\]"):
        PayoffTable.from_state({"sums": table.sums, "counts": table.counts})
    with pytest.raises(ValueError, match="read-only"):
        table.counts[0, 0] = 7
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f.create_dataset("sums", data=np.zeros((2, 1, 1)))
        with pytest.raises(StorageError, match="not written by hpcmarl"):
            PayoffTable.load(f)
    with h5py.File(tmp_path / "damaged.h5", "w") as f:
        table.save(f)
        del f["counts"]
        with pytest.raises(StorageError, match=r"lacks \['counts'\]; .*fix: the file is damaged"):
            PayoffTable.load(f)
