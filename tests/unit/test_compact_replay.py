"""Compact transition storage (MALib's producer options): whatever a table keeps, a sampled row
equals the full row the collector sent — stacks rebuilt from single frames (never across an
episode's start), next observations from the next row of the run — also after the ring has
evicted a run's older rows and after a checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.replay import compact
from hpcmarl.replay.compact import (
    CompactTable,
    StorageForm,
    chain_runs,
    run_blocks,
    run_keys,
    stored_bytes_per_row,
)
from hpcmarl.replay.redistribute import deal_compact_tables
from hpcmarl.replay.table import ReplayTable

FRAME = 3


def stacked(frames: list[np.ndarray], t: int, k: int, padding: str) -> np.ndarray:
    """The stack an env (or the frame stacker) shows at step t: frames t-k+1..t, newest last;
    before the first frame, the first frame again ("reset") or zeros ("zeros")."""
    out = []
    for tau in range(t - k + 1, t + 1):
        if tau >= 0:
            out.append(frames[tau])
        else:
            out.append(frames[0] if padding == "reset" else np.zeros(FRAME, np.float32))
    return np.concatenate(out)


def collect(
    k: int,
    padding: str,
    seed: int,
    envs: int = 3,
    agents: int = 2,
    ticks: int = 90,
    by_run: bool = False,
):
    """Batches as a collector sends them (every env copy and agent, a fragment of ticks at a
    time, episodes of random length, some truncated, some left running), rows shuffled; or
    `by_run`, each run's rows as one block in step order (the blocks shuffled)."""
    rng = np.random.default_rng(seed)
    batches, rows = [], []
    episode = np.arange(envs)
    next_episode = envs
    t = np.zeros(envs, int)
    length = rng.integers(3, 15, envs)
    frames = {
        (e, a): [rng.normal(size=FRAME).astype(np.float32)]
        for e in range(envs)
        for a in range(agents)
    }
    fragment: list[dict] = []
    for tick in range(ticks):
        for e in range(envs):
            for a in range(agents):
                run = frames[(e, a)]
                run.append(rng.normal(size=FRAME).astype(np.float32))
                end = t[e] + 1 == length[e]
                fragment.append(
                    {
                        "observations": stacked(run, t[e], k, padding),
                        "next_observations": stacked(run, t[e] + 1, k, padding),
                        "actions": np.int64(rng.integers(2)),
                        "rewards": np.float32(rng.normal()),
                        "terminations": bool(end and e != 1),
                        "truncations": bool(end and e == 1),
                        "agent_id": np.int16(a),
                        "episode_id": np.int64(episode[e]),
                        "step": np.int32(t[e]),
                    }
                )
        t += 1
        for e in np.flatnonzero(t == length):
            episode[e], next_episode, t[e] = next_episode, next_episode + 1, 0
            length[e] = rng.integers(3, 15)
            for a in range(agents):
                frames[(e, a)] = [rng.normal(size=FRAME).astype(np.float32)]
        if tick % 4 == 3 or tick == ticks - 1:
            rng.shuffle(fragment)  # the table must not rely on the order rows arrive in
            if by_run:  # a stable sort keeps each block's shuffled place among the others
                first = {}
                for i, row in enumerate(fragment):
                    first.setdefault(key(row)[:2], i)
                fragment.sort(key=lambda row: (first[key(row)[:2]], key(row)[2]))
            batches.append({n: np.stack([r[n] for r in fragment]) for n in fragment[0]})
            rows.extend(fragment)
            fragment = []
    return batches, {key(r): r for r in rows}


def key(row: dict) -> tuple[int, int, int]:
    return int(row["episode_id"]), int(row["agent_id"]), int(row["step"])


def assert_rows_sent(columns: dict[str, np.ndarray], rows: dict) -> None:
    """Each sampled row equals the row the collector sent with its run and step."""
    for j in range(len(columns["rewards"])):
        sent = rows[key({name: column[j] for name, column in columns.items()})]
        for name, value in sent.items():
            np.testing.assert_array_equal(columns[name][j], value, err_msg=name)


FORMS = [
    StorageForm(stack_num=1, ignore_obs_next=True),
    StorageForm(stack_num=4),
    StorageForm(stack_num=4, ignore_obs_next=True),
]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.describe().replace(" ", ""))
@pytest.mark.parametrize("padding", ["reset", "zeros"])
@pytest.mark.parametrize("capacity", [10_000, 100])
@pytest.mark.parametrize("by_run", [False, True], ids=["shuffled", "by_run"])
def test_sampled_rows_equal_the_rows_sent(
    form: StorageForm, padding: str, capacity: int, by_run: bool
) -> None:
    batches, rows = collect(form.stack_num, padding, seed=capacity, by_run=by_run)
    table = CompactTable(ReplayTable(capacity, prioritized=capacity < 1000, seed=1), form)
    for batch in batches:
        table.insert(batch)
        assert_rows_sent(table.sample(64)[0], rows)
    assert table.evicted == (len(rows) - capacity if capacity < len(rows) else 0)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.describe().replace(" ", ""))
def test_a_restored_table_samples_what_the_saved_one_would(form: StorageForm) -> None:
    batches, rows = collect(form.stack_num, "reset", seed=3)
    saved = CompactTable(ReplayTable(150, prioritized=True, seed=5), form)
    for batch in batches[:-3]:
        saved.insert(batch)
    restored = CompactTable(ReplayTable(150, prioritized=True, seed=99), form)
    restored.load_state(saved.state())
    for batch in batches[-3:]:  # the open runs go on where they stopped
        saved.insert(batch)
        restored.insert(batch)
    want, want_info = saved.sample(128)
    got, got_info = restored.sample(128)
    np.testing.assert_array_equal(got_info.insert_ids, want_info.insert_ids)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert_rows_sent(got, rows)


def test_another_storage_form_is_refused_on_load() -> None:
    batches, _ = collect(4, "reset", seed=0)
    saved = CompactTable(ReplayTable(500), StorageForm(stack_num=4))
    saved.insert(batches[0])
    other = CompactTable(ReplayTable(500), StorageForm(stack_num=2))
    with pytest.raises(ValueError, match="stack_num 4"):
        other.load_state(saved.state())


def test_stack_4_without_next_observations_stores_under_a_third() -> None:
    """The issue's memory target, for 1 KB frames: stack_num 4 + ignore_obs_next (+ the
    env's own stacks stored as their newest frame) against full stacks and next stacks."""
    columns = {
        "observations": ("<f4", (4 * 256,)),
        "next_observations": ("<f4", (4 * 256,)),
        "actions": ("<i8", ()),
        "rewards": ("<f4", ()),
        "terminations": ("|b1", ()),
        "truncations": ("|b1", ()),
        "agent_id": ("<i2", ()),
        "episode_id": ("<i8", ()),
        "step": ("<i4", ()),
        "policy_version": ("<i8", ()),
    }
    full = stored_bytes_per_row(columns, StorageForm())
    compact = stored_bytes_per_row(columns, StorageForm(stack_num=4, ignore_obs_next=True))
    assert full == 2 * 4096 + 36 and compact == 1024 + 36
    assert compact <= 0.3 * full


@pytest.mark.parametrize("n_out", [1, 3])
def test_resharded_tables_keep_each_run_whole_and_every_row_exact(n_out: int) -> None:
    """Two saved shards (each fed by its own collector) dealt over `n_out` new ones."""
    form = StorageForm(stack_num=4, ignore_obs_next=True)
    states, sent = [], {}
    for source in range(2):
        batches, rows = collect(4, "zeros", seed=10 + source)
        for batch in batches:
            batch["episode_id"] = batch["episode_id"] + 1_000_000 * source
        sent.update({(e + 1_000_000 * source, a, t): r for (e, a, t), r in rows.items()})
        for row in rows.values():
            row["episode_id"] = row["episode_id"] + 1_000_000 * source
        table = CompactTable(ReplayTable(400, prioritized=True, seed=source), form)
        for batch in batches[:-1]:  # the last batch's runs stay open
            table.insert(batch)
        states.append(table.state())
    held = sum(len(s["insert_ids"]) for s in states)
    dealt = deal_compact_tables(states, n_out, capacity=1_000)
    runs_seen: dict[int, int] = {}
    for j, state in enumerate(dealt):
        table = CompactTable(ReplayTable(1_000, prioritized=True), form)
        table.load_state(state)
        assert len(state["priorities"]) == table.size
        ids = np.arange(table.total_inserted - table.size, table.total_inserted)
        stored = {name: table.table.column(name)[ids % 1_000] for name in table.table.columns}
        columns = table.rebuild(stored, ids)
        assert_rows_sent(columns, sent)
        for key in set(run_keys(columns["episode_id"], columns["agent_id"]).tolist()):
            assert runs_seen.setdefault(key, j) == j  # a run lives on one new shard
    assert sum(len(s["insert_ids"]) for s in dealt) == held


def test_runs_in_blocks_chain_as_a_sort_would() -> None:
    """`run_blocks` (no sort) accepts exactly the batches whose runs are blocks in step order,
    and links their rows as `chain_runs` does."""
    rng = np.random.default_rng(0)
    for _ in range(2_000):
        n = int(rng.integers(1, 12))
        runs = rng.integers(0, 3, n)
        keys, steps = runs * 7 + 100, rng.integers(0, 4, n)
        if rng.random() < 0.6:  # most batches in blocks: sort by a shuffled run order, step
            rank = rng.permutation(3)
            by = np.lexsort((steps, rank[runs]))
            keys, steps = keys[by], steps[by]
        ids = 1_000 + np.arange(n)
        ends = run_blocks(keys, steps)
        _, _, prev, nxt = chain_runs(keys, steps, ids)
        blocks = [keys[0], *keys[1:][keys[1:] != keys[:-1]]]
        ordered = all((np.diff(steps[keys == k]) >= 0).all() for k in set(keys.tolist()))
        assert (ends is not None) == (len(set(blocks)) == len(blocks) and ordered)
        if ends is not None:  # each row follows the row before it, but after the ends
            before, after = ids - 1, ids + 1
            before[0], before[ends + 1], after[ends], after[-1] = -1, -1, -1, -1
            np.testing.assert_array_equal(prev, before)
            np.testing.assert_array_equal(nxt, after)
    assert run_blocks(np.zeros(0, np.int64), np.zeros(0, np.int64)) is None


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.describe().replace(" ", ""))
def test_batches_in_run_blocks_store_what_the_sorting_path_stores(
    form: StorageForm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows sent run by run take the path without a sort; a table fed the same batches
    through the general path (run_blocks refused) ends with the same state, links and draws."""
    batches, rows = collect(form.stack_num, "zeros", seed=7, by_run=True)
    fast = CompactTable(ReplayTable(100, prioritized=True, seed=2), form)
    for batch in batches:
        fast.insert(batch)
    monkeypatch.setattr(compact, "run_blocks", lambda keys, steps: None)
    general = CompactTable(ReplayTable(100, prioritized=True, seed=2), form)
    for batch in batches:
        general.insert(batch)
    want, got = general.state(), fast.state()
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_array_equal(fast._next, general._next)
    if form.stack_num > 1:
        np.testing.assert_array_equal(fast._back, general._back)
    sampled, expected = fast.sample(256)[0], general.sample(256)[0]
    for name in expected:
        np.testing.assert_array_equal(sampled[name], expected[name], err_msg=name)
    assert_rows_sent(sampled, rows)


def test_few_and_many_rows_before_a_runs_start_are_filled_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stacks that reach back past their run's first held row, filled one row at a time (a
    few) and in one vectorised pass (many), from episodes of 3 to 14 steps."""
    form = StorageForm(stack_num=4, ignore_obs_next=True)
    batches, rows = collect(4, "reset", seed=5)
    table = CompactTable(ReplayTable(100, seed=0), form)
    for batch in batches:
        table.insert(batch)
    ids = np.arange(table.total_inserted - table.size, table.total_inserted)
    stored = {name: table.table.column(name)[ids % 100] for name in table.table.columns}
    drawn = {}
    for few in (0, 10**9):
        monkeypatch.setattr(compact, "FEW_STARTS", few)
        drawn[few] = table.rebuild(dict(stored), ids)
        assert_rows_sent(drawn[few], rows)
    for name in drawn[0]:
        np.testing.assert_array_equal(drawn[0][name], drawn[10**9][name], err_msg=name)
