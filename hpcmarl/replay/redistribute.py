"""Dealing saved replay tables over a different number of replay shards on resume.

A job resumed with more or fewer shards must keep every stored item, of any kind (transitions,
or a team's episodes `[T, agents, ...]`), also where a saved shard's table is empty. The saved
tables' rows are merged in approximate age order (each table's rows are oldest first; rows of
different tables are interleaved by their relative position) and dealt round robin, so every
new shard holds a similar mix of old and new data. Priorities travel with their rows; a new
table that would overflow its capacity keeps its newest rows, counted as evicted. New shard j
continues the sampling generator of saved shard j; a shard beyond the saved count gets none
(`ReplayTable.load_state` then keeps the one its table was seeded with at start, from the run
seed and the shard's name): a copy would make two shards draw the same samples.

Compact transition tables (`replay.compact`) are dealt by run instead: each run (one agent's
episode) goes whole to one new shard, since a stack or a next observation is rebuilt from the
run's other rows. Their rows are rebuilt in full, dealt, and stored compactly again. Compact
episodes and sequences (`replay.compact_items`) are dealt as they are: each item holds what
rebuilds it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compact import CompactTable, StorageForm, run_keys
from .compact_items import FORM_KEY as ITEM_FORM
from .table import ReplayTable

COLUMN = "column/"


def deal_tables(states: list[dict[str, Any]], n_out: int, capacity: int) -> list[dict[str, Any]]:
    """Flat `ReplayTable.state()` dicts of the saved shards -> `n_out` states for new shards."""
    sizes = [len(s["insert_ids"]) for s in states]
    age = np.concatenate([(np.arange(n) + 0.5) / max(n, 1) for n in sizes])
    source = np.concatenate([np.full(n, i) for i, n in enumerate(sizes)])
    row = np.concatenate([np.arange(n) for n in sizes])
    order = np.argsort(age, kind="stable")
    source, row = source[order], row[order]
    evicted = sum(int(s["counters"][1]) for s in states)
    return [
        _table_of(states, source[j::n_out], row[j::n_out], capacity, j, evicted // n_out)
        for j in range(n_out)
    ]


def _table_of(
    states: list[dict[str, Any]],
    source: np.ndarray,
    row: np.ndarray,
    capacity: int,
    j: int,
    evicted: int,
) -> dict[str, Any]:
    dropped = max(0, len(row) - capacity)  # the oldest rows that no longer fit
    source, row, evicted = source[dropped:], row[dropped:], evicted + dropped
    out: dict[str, Any] = {}
    for key in _row_keys(states):
        out[key] = _gather(_parts(states, key), source, row)
    n = len(row)
    total = n + evicted
    out["insert_ids"] = np.arange(total - n, total, dtype=np.int64)
    out["counters"] = np.array([total, evicted], dtype=np.int64)
    if j < len(states):
        out["rng"] = states[j]["rng"]
    if "max_priority" in states[0]:
        out["max_priority"] = np.array(max(float(s["max_priority"]) for s in states))
    if ITEM_FORM in states[0]:  # compact episodes or sequences: each rebuilds itself
        out[ITEM_FORM] = states[0][ITEM_FORM]
    return out


def _row_keys(states: list[dict[str, Any]]) -> list[str]:
    """The per-row arrays of any saved table: its columns (a table that never received an item
    has none; its schema is fixed by the first insert) and its priorities."""
    keys = {k for s in states for k in s if k.startswith(COLUMN) or k == "priorities"}
    return sorted(keys)


def _parts(states: list[dict[str, Any]], key: str) -> list[np.ndarray]:
    """Each saved table's `key` array; a table without it holds no rows, so an empty array of
    the same item shape stands in."""
    like = next(np.asarray(s[key]) for s in states if key in s)
    empty = np.empty((0, *like.shape[1:]), like.dtype)
    parts = []
    for state in states:
        if key in state:
            parts.append(np.asarray(state[key]))
        elif len(state["insert_ids"]):
            raise ValueError(f"a saved replay table holds rows but no {key!r}")
        else:
            parts.append(empty)
    return parts


def _gather(parts: list[np.ndarray], source: np.ndarray, row: np.ndarray) -> np.ndarray:
    offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
    return np.concatenate(parts)[offsets[source] + row]


def deal_limiters(states: list[dict[str, Any]], n_out: int) -> list[dict[str, int]]:
    """Insert and sample counts shared out evenly, so the ratio each shard sees is unchanged."""
    inserts = sum(int(s["inserts"]) for s in states)
    samples = sum(int(s["samples"]) for s in states)
    return [{"inserts": inserts // n_out, "samples": samples // n_out} for _ in range(n_out)]


def deal_queues(states: list[dict[str, Any]], n_out: int) -> list[dict[str, Any]]:
    """On-policy queue states of the saved shards, items in shard order, dealt item i to new
    shard i mod `n_out`; each new queue numbers its items from 0, as the commander's books
    renumber them (`schedules.ledger`). Counters of drops and takes stay with the first shard,
    so their sums are unchanged."""
    columns = sorted({k for s in states for k in s if k.startswith(COLUMN)})
    merged = {k: np.concatenate([s[k] for s in states if k in s]) for k in columns}
    total = len(next(iter(merged.values()))) if merged else 0
    summed = np.sum([s["queue_counters"] for s in states], axis=0).astype(np.int64)
    out = []
    for j in range(n_out):
        mine = np.arange(j, total, n_out)
        state: dict[str, Any] = {k: v[mine] for k, v in merged.items()} if len(mine) else {}
        if len(mine):
            state["insert_ids"] = np.arange(len(mine), dtype=np.int64)
        counters = summed.copy() if j == 0 else np.zeros_like(summed)
        counters[0] = len(mine)  # total_inserted: the next id
        state["queue_counters"] = counters
        out.append(state)
    return out


def deal_compact_tables(
    states: list[dict[str, Any]], n_out: int, capacity: int
) -> list[dict[str, Any]]:
    """`CompactTable.state()` dicts of the saved shards -> `n_out` states, each run whole on
    one new shard (runs dealt round robin in the age order of their first rows)."""
    form = StorageForm.of_words(states[0]["storage_form"])
    prioritized = "priorities" in states[0]
    rows, ages, priorities = [], [], []
    for state in states:
        held = len(state["insert_ids"])
        if held == 0:
            continue
        saved = CompactTable(ReplayTable(held, prioritized=prioritized), form)
        saved.load_state(state)
        ids = np.asarray(state["insert_ids"], np.int64)
        columns = {
            k[len(COLUMN) :]: np.asarray(v) for k, v in state.items() if k.startswith(COLUMN)
        }
        rows.append(saved.rebuild(columns, ids))
        ages.append((np.arange(held) + 0.5) / held)
        if prioritized:
            priorities.append(np.asarray(state["priorities"]))
    evicted = sum(int(s["counters"][1]) for s in states)
    merged = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]} if rows else {}
    order = np.argsort(np.concatenate(ages), kind="stable") if rows else np.zeros(0, np.int64)
    shard = np.zeros(0, np.int64)
    if rows:
        key = run_keys(merged["episode_id"], merged["agent_id"])[order]
        runs, first_row, run_of_row = np.unique(key, return_index=True, return_inverse=True)
        rank = np.empty(len(runs), np.int64)  # runs numbered by the age of their first row
        rank[np.argsort(first_row, kind="stable")] = np.arange(len(runs))
        shard = rank[run_of_row.reshape(-1)] % n_out
    out = []
    for j in range(n_out):
        mine = order[shard == j]
        table = CompactTable(ReplayTable(capacity, prioritized=prioritized), form)
        table.table.skip(evicted // n_out)
        if len(mine):
            table.insert({name: column[mine] for name, column in merged.items()})
        state = table.state()
        if prioritized and len(mine):
            state["priorities"] = np.concatenate(priorities)[mine[len(mine) - table.size :]]
            state["max_priority"] = np.array(max(float(s["max_priority"]) for s in states))
        if j < len(states):
            state["rng"] = states[j]["rng"]
        else:
            del state["rng"]  # a new shard keeps its own generator (the module docstring)
        out.append(state)
    return out
