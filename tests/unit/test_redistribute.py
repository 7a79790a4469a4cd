"""Dealing saved replay tables over another number of shards keeps rows and priorities."""

from __future__ import annotations

import numpy as np

from hpcmarl.replay.redistribute import deal_tables
from hpcmarl.replay.table import ReplayTable


def table_with(values: np.ndarray, seed: int) -> ReplayTable:
    table = ReplayTable(100, prioritized=True, seed=seed)
    table.insert({"x": values.astype(np.float32)})
    ids = np.arange(len(values))
    table.update_priorities(ids, ids, values.astype(np.float32))
    return table


def test_rows_and_priorities_travel_together_and_fit_new_tables() -> None:
    saved = [table_with(np.arange(10.0), 0).state(), table_with(np.arange(10.0, 16.0), 1).state()]
    for n_out in (1, 3):
        dealt = deal_tables(saved, n_out, capacity=100)
        rows = np.concatenate([d["column/x"] for d in dealt])
        assert sorted(rows.tolist()) == list(range(16))
        for state in dealt:
            table = ReplayTable(100, prioritized=True)
            table.load_state(state)  # a consistent state: the table accepts it
            expected = (np.abs(state["column/x"]) + table.eps) ** table.alpha
            assert np.allclose(state["priorities"], expected)


def test_a_smaller_capacity_keeps_the_newest_rows_and_counts_the_rest() -> None:
    saved = [table_with(np.arange(10.0), 0).state()]
    (state,) = deal_tables(saved, 1, capacity=4)
    assert state["column/x"].tolist() == [6.0, 7.0, 8.0, 9.0]
    assert state["counters"].tolist() == [10, 6]


def episode_table(episodes: int, seed: int) -> ReplayTable:
    """A table of episode items, [T, agents, obs] and [T] columns, or an empty one."""
    table = ReplayTable(50, prioritized=False, seed=seed)
    if episodes:
        obs = np.arange(episodes * 4 * 3 * 2, dtype=np.float32).reshape(episodes, 4, 3, 2) + seed
        table.insert({"observations": obs, "filled": np.ones((episodes, 4), bool)})
    return table


def test_episode_tables_and_empty_tables_are_dealt_to_any_number_of_shards() -> None:
    """A saved shard that never received an item of a group holds an empty table without a
    schema; dealing it with full ones used to fail with a KeyError or a ValueError."""
    for saved_counts in ([0, 3], [3, 0], [0, 0], [2, 0, 5]):
        saved = [episode_table(n, seed=100 * i).state() for i, n in enumerate(saved_counts)]
        for n_out in (1, 2, 4):
            dealt = deal_tables(saved, n_out, capacity=50)
            held = sum(len(d["insert_ids"]) for d in dealt)
            assert held == sum(saved_counts)
            for state in dealt:
                table = ReplayTable(50, prioritized=False)
                table.load_state(state)
                assert table.size == len(state["insert_ids"])
                if table.size:
                    assert state["column/observations"].shape[1:] == (4, 3, 2)


def uniform_table(values: np.ndarray, seed: int) -> ReplayTable:
    table = ReplayTable(100, prioritized=False, seed=seed)
    table.insert({"x": values.astype(np.float32)})
    return table


def test_a_shard_added_by_a_redeal_draws_its_own_samples() -> None:
    """Dealing two saved tables over four shards copied saved generators to the new shards,
    so shard 2 drew the very samples of shard 0. Each table below is seeded as its shard
    would be at start; the first two continue their saved generators."""
    saved = [
        uniform_table(np.arange(40.0), 0).state(),
        uniform_table(np.arange(40.0, 80.0), 1).state(),
    ]
    dealt = deal_tables(saved, 4, capacity=100)
    drawn = []
    for j, state in enumerate(dealt):
        table = ReplayTable(100, prioritized=False, seed=1_000 + j)
        table.load_state(state)
        drawn.append(table.sample(16)[1].insert_ids.tolist())
    assert len({tuple(d) for d in drawn}) == 4, drawn
    for j in (0, 1):  # a surviving shard draws on as its saved table would have
        assert np.array_equal(dealt[j]["rng"], saved[j]["rng"])
