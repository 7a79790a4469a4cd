"""Replay table throughput against bare numpy baselines measured in the same run.

    python tools/bench_replay.py [--transitions N] [--capacity C] [--repeats R]
                                 [--stacked-transitions M]

Inserts CartPole-like transitions in batches of 32 rows (a collector's fragment) and samples
batches of 64 rows (a learner's batch), through `ReplayTable` and through a baseline that does
only the array work. Uniform tables are judged against a bare numpy ring (slice assignment in,
fancy indexing out); prioritized tables against the same ring plus a bare numpy sum tree:
insert at the maximum priority, a stratified proportional draw with importance weights, and a
priority update of the sampled rows, each one vectorised pass per tree level. Contenders take
turns for `--repeats` rounds and each keeps its best round, which filters out the noise of a
shared machine. Before timing, the sum tree baseline is checked against the table (same draws,
weights and rows from the same seed) and against its priorities (draw frequencies), so a fast
but wrong baseline cannot flatter the table.

Compact storage (MALib's producer options `stack_num` 4 + `save_only_last_obs` +
`ignore_obs_next`) is measured on stacks of 1 KB frames, as a frame-stacking collector sends
them: the bytes a stored transition takes against a table of full rows, and the insert and
sample throughput of the `CompactTable` (which rebuilds stacks and next observations) against
the full-row table doing the same draws, whose rows it must equal. The same for R2D2's
sequence items (`CompactItemTable`, 40 steps each, half shared with the next), against a table
of full items.

Prints a table, then as its last line one JSON object whose `*_ratio` fields are table /
baseline throughput (1.0 = no overhead). What the table does beyond its baseline: schema checks
on insert; insert ids and weights on sample; prioritized tables also validate priorities, drop
updates for rows overwritten since their sample, resolve repeated rows explicitly and guard
draws that rounding pushes past a subtree's sum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcmarl.replay.compact import CompactTable, StorageForm  # noqa: E402
from hpcmarl.replay.compact_items import CompactItemTable  # noqa: E402
from hpcmarl.replay.table import ReplayTable, SampleInfo  # noqa: E402

INSERT_ROWS = 32
SAMPLE_ROWS = 64
Batch = dict[str, np.ndarray]
BASELINE_OF = {
    "insert_uniform": "baseline_insert",
    "sample_uniform": "baseline_sample",
    "insert_prioritized": "baseline_prioritized_insert",
    "sample_prioritized": "baseline_prioritized_sample",
    "update_prioritized": "baseline_prioritized_update",
    "sample_and_update_prioritized": "baseline_prioritized_sample_and_update",
}
"""Each table figure and the baseline figure it is divided by."""
RATIOS = {
    "insert_ratio": "insert_uniform",
    "sample_uniform_ratio": "sample_uniform",
    "prioritized_insert_ratio": "insert_prioritized",
    "prioritized_sample_ratio": "sample_prioritized",
    "prioritized_update_ratio": "update_prioritized",
    "prioritized_sample_and_update_ratio": "sample_and_update_prioritized",
}
"""The names of the ratios in the JSON line (kept stable for whoever reads them)."""
FRAME, STACK, ENVS, EPISODE = 256, 4, 4, 200
"""Compact storage: 1 KB float32 frames stacked 4 deep, 4 env copies, 200-step episodes."""


class Buffer(Protocol):
    def insert(self, batch: Batch) -> None: ...
    def sample(self, n: int) -> Any: ...


def make_batches(transitions: int, seed: int = 0) -> list[Batch]:
    """Pregenerated CartPole-like batches, so generating data is not what gets timed."""
    rng = np.random.default_rng(seed)
    n = INSERT_ROWS
    return [
        {
            "observations": rng.standard_normal((n, 4), dtype=np.float32),
            "next_observations": rng.standard_normal((n, 4), dtype=np.float32),
            "actions": rng.integers(0, 2, n, dtype=np.int64),
            "rewards": np.ones(n, dtype=np.float32),
            "terminations": rng.random(n) < 0.05,
            "truncations": np.zeros(n, dtype=bool),
            "agent_id": np.zeros(n, dtype=np.int16),
            "episode_id": np.full(n, start // 200, dtype=np.int64),
            "step": np.arange(start, start + n, dtype=np.int32) % 200,
            "policy_version": np.full(n, start // 1000, dtype=np.int64),
        }
        for start in range(0, transitions, n)
    ]


class NumpyRing:
    """The uniform baseline: preallocated columns, slice assignment in, fancy indexing out.

    Capacity is a multiple of the batch size, so an insert never wraps mid-batch.
    """

    def __init__(self, capacity: int, example: Batch, seed: int = 0) -> None:
        self.capacity, self.size, self.cursor = capacity, 0, 0
        self.columns = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in example.items()}
        self.rng = np.random.default_rng(seed)

    def insert(self, batch: Batch) -> None:
        n, start = INSERT_ROWS, self.cursor
        for name, column in self.columns.items():
            column[start : start + n] = batch[name]
        self.cursor = (start + n) % self.capacity
        self.size = min(self.capacity, self.size + n)

    def sample(self, n: int) -> Batch:
        slots = self.rng.integers(0, self.size, n)
        return {name: column[slots] for name, column in self.columns.items()}


class NumpySumTree(NumpyRing):
    """The prioritized baseline: the ring plus a flat sum tree in heap order (root at 1, leaves
    from `leaves` on), with the table's formulas (Schaul et al. 2016) and nothing else.

    Every operation is one vectorised pass per tree level: an insert's leaves are a run, so
    their parents are a run at every level (slices); a draw descends all B values together; an
    update pushes all B changed leaves up together. The same seed gives the table's draws.
    """

    def __init__(
        self,
        capacity: int,
        example: Batch,
        seed: int = 0,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(capacity, example, seed)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.leaves = 1 << (capacity - 1).bit_length()
        self.depth = self.leaves.bit_length() - 1
        self.tree = np.zeros(2 * self.leaves)
        self.right = self.tree[1:]  # right[i] is tree[i + 1]: a sibling by gather, no addition
        self.max_priority = 1.0

    def insert(self, batch: Batch) -> None:
        """Columns as the ring; the new leaves at the maximum priority seen, then their parents."""
        lo = self.cursor + self.leaves
        super().insert(batch)
        hi, tree = lo + INSERT_ROWS, self.tree
        tree[lo:hi] = self.max_priority
        while lo > 1:
            lo, hi = lo >> 1, (hi + 1) >> 1
            np.add(tree[2 * lo : 2 * hi : 2], tree[2 * lo + 1 : 2 * hi : 2], out=tree[lo:hi])

    def sample(self, n: int) -> tuple[Batch, np.ndarray, np.ndarray]:
        """One uniform value in each of n equal slices of the total, descended level by level;
        weights (n * P(i))^-beta over their batch maximum, which is (p_i / p_min)^-beta."""
        tree = self.tree
        values = self.rng.random(n)
        values += np.arange(n)
        values *= float(tree[1]) / n
        nodes = np.ones(n, dtype=np.int64)
        for _ in range(self.depth):
            nodes <<= 1
            left = tree[nodes]
            go_right = values >= left
            np.subtract(values, left, out=values, where=go_right)
            nodes += go_right
        priorities = tree[nodes]
        weights = np.power(priorities / priorities.min(), -self.beta, dtype=np.float32)
        slots = nodes - self.leaves
        return {name: column[slots] for name, column in self.columns.items()}, slots, weights

    def update(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """p = (|td| + eps)^alpha at the sampled leaves, then every parent from its children."""
        priorities = (np.abs(td_errors) + self.eps) ** self.alpha
        tree, right = self.tree, self.right
        nodes = slots + self.leaves
        tree[nodes] = priorities
        for _ in range(self.depth):
            nodes >>= 1
            left = nodes << 1
            tree[nodes] = tree[left] + right[left]
        self.max_priority = max(self.max_priority, float(priorities.max()))


def check_baseline() -> None:
    """Refuse to time a wrong baseline: it must draw what the table draws from the same seed
    (after wrapping the ring and updating priorities), and draw rows in proportion to their
    priorities. A few tenths of a second; raises with what differs."""
    batches, td = make_batches(512), np.random.default_rng(2).random(256) * 3.0
    table, tree = ReplayTable(256, prioritized=True, seed=0), NumpySumTree(256, batches[0])
    for batch in batches:
        table.insert(batch)
        tree.insert(batch)
    table.update_priorities(np.arange(256), np.arange(256, 512), td)
    tree.update(np.arange(256), td)
    for _ in range(8):
        rows, info = table.sample(SAMPLE_ROWS)
        tree_rows, slots, weights = tree.sample(SAMPLE_ROWS)
        same = np.array_equal(slots, info.indices) and np.allclose(weights, info.weights)
        if not same or any(not np.array_equal(rows[k], tree_rows[k]) for k in rows):
            raise RuntimeError("the sum tree baseline draws other rows than ReplayTable")
        table.update_priorities(info.indices, info.insert_ids, td[:SAMPLE_ROWS])
        tree.update(slots, td[:SAMPLE_ROWS])
    leaves = tree.tree[tree.leaves : tree.leaves + 256]
    draws = np.concatenate([tree.sample(SAMPLE_ROWS)[1] for _ in range(2000)])
    error = np.abs(np.bincount(draws, minlength=256) / len(draws) - leaves / leaves.sum()).max()
    if not np.isclose(tree.tree[1], leaves.sum()) or error > 1e-3:
        raise RuntimeError(f"the sum tree baseline's draws stray {error:.4f} from its priorities")


def best_rates(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, float]:
    """Transitions/s of the fastest run of each contender. Contenders take turns round by round,
    so a burst of load from other processes slows all of them, not just one."""
    best = dict.fromkeys(runs, 0.0)
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            moved = run()
            best[name] = max(best[name], moved / (time.perf_counter() - start))
    return best


def insert_all(make: Callable[[], Buffer], batches: list[Batch]) -> int:
    """Fill a fresh buffer (wrapping it when there are more batches than capacity)."""
    buffer = make()
    for batch in batches:
        buffer.insert(batch)
    return len(batches) * INSERT_ROWS


def sample_many(buffer: Buffer, calls: int) -> int:
    for _ in range(calls):
        buffer.sample(SAMPLE_ROWS)
    return calls * SAMPLE_ROWS


def sample_and_update(table: ReplayTable, calls: int, td_errors: np.ndarray) -> int:
    """Sample, then send back priorities for the batch: a prioritized learner's round trip."""
    for _ in range(calls):
        _, info = table.sample(SAMPLE_ROWS)
        table.update_priorities(info.indices, info.insert_ids, td_errors)
    return calls * SAMPLE_ROWS


def baseline_sample_and_update(tree: NumpySumTree, calls: int, td_errors: np.ndarray) -> int:
    for _ in range(calls):
        _, slots, _ = tree.sample(SAMPLE_ROWS)
        tree.update(slots, td_errors)
    return calls * SAMPLE_ROWS


def update_many(table: ReplayTable, draws: list[SampleInfo], td_errors: np.ndarray) -> int:
    """Priority updates alone, for batches drawn beforehand (the same rows for both)."""
    for info in draws:
        table.update_priorities(info.indices, info.insert_ids, td_errors)
    return len(draws) * SAMPLE_ROWS


def baseline_update_many(tree: NumpySumTree, draws: list[SampleInfo], td: np.ndarray) -> int:
    for info in draws:
        tree.update(info.indices, td)
    return len(draws) * SAMPLE_ROWS


def measure(transitions: int, capacity: int, repeats: int) -> dict[str, float]:
    """All throughputs in transitions/s, baselines and tables interleaved in one process."""
    batches = make_batches(transitions)
    calls = max(1, transitions // SAMPLE_ROWS)
    makers: dict[str, Callable[[], Buffer]] = {
        "baseline_insert": partial(NumpyRing, capacity, batches[0]),
        "insert_uniform": partial(ReplayTable, capacity),
        "baseline_prioritized_insert": partial(NumpySumTree, capacity, batches[0]),
        "insert_prioritized": partial(ReplayTable, capacity, prioritized=True),
    }
    runs = {name: partial(insert_all, make, batches) for name, make in makers.items()}
    rates = best_rates(runs, repeats)
    ring, uniform, tree, prioritized = (make() for make in makers.values())
    for buffer in (ring, uniform, tree, prioritized):
        for batch in batches:
            buffer.insert(batch)
    td_errors = np.random.default_rng(1).random(SAMPLE_ROWS)
    rates |= best_rates(
        {
            "baseline_sample": partial(sample_many, ring, calls),
            "sample_uniform": partial(sample_many, uniform, calls),
            "baseline_prioritized_sample": partial(sample_many, tree, calls),
            "sample_prioritized": partial(sample_many, prioritized, calls),
            "baseline_prioritized_sample_and_update": partial(
                baseline_sample_and_update, tree, calls, td_errors
            ),
            "sample_and_update_prioritized": partial(
                sample_and_update, prioritized, calls, td_errors
            ),
        },
        repeats,
    )
    draws = [prioritized.sample(SAMPLE_ROWS)[1] for _ in range(calls)]
    rates |= best_rates(
        {
            "baseline_prioritized_update": partial(baseline_update_many, tree, draws, td_errors),
            "update_prioritized": partial(update_many, prioritized, draws, td_errors),
        },
        repeats,
    )
    return rates


def stacked_batches(transitions: int, seed: int = 0) -> list[Batch]:
    """Batches of 32 rows (8 steps of each env copy) whose observations are the run's last 4
    frames, newest last, the first frame standing in before an episode's start; episodes are
    cut (truncated) at 200 steps."""
    rng = np.random.default_rng(seed)
    steps = transitions // ENVS + 1
    frames = rng.standard_normal((ENVS, steps + 1, FRAME), dtype=np.float32)
    t = np.arange(steps)
    start = t - t % EPISODE

    def stack(e: int, at: np.ndarray) -> np.ndarray:
        back = np.maximum(at[:, None] - np.arange(STACK - 1, -1, -1), start[at][:, None])
        return frames[e][back].reshape(len(at), STACK * FRAME)

    batches, per_env = [], INSERT_ROWS // ENVS
    for first in range(0, steps - per_env, per_env):
        at = np.arange(first, first + per_env)
        last = (at + 1) % EPISODE == 0
        nxt = [stack(e, at + 1) for e in range(ENVS)]
        for e in range(ENVS):  # an episode's final frame is its own, not the next one's start
            nxt[e][last] = np.concatenate(
                [stack(e, at[last])[:, FRAME:], frames[e][at[last] + 1]], 1
            )
        batches.append(
            {
                "observations": np.concatenate([stack(e, at) for e in range(ENVS)]),
                "next_observations": np.concatenate(nxt),
                "actions": rng.integers(0, 4, INSERT_ROWS, dtype=np.int64),
                "rewards": np.ones(INSERT_ROWS, dtype=np.float32),
                "terminations": np.zeros(INSERT_ROWS, dtype=bool),
                "truncations": np.tile(last, ENVS),
                "agent_id": np.zeros(INSERT_ROWS, dtype=np.int16),
                "episode_id": np.concatenate([e + ENVS * (at // EPISODE) for e in range(ENVS)]),
                "step": np.tile(at % EPISODE, ENVS).astype(np.int32),
                "policy_version": np.zeros(INSERT_ROWS, dtype=np.int64),
            }
        )
    return batches


def race_storage(
    full: Callable[[], Any],
    compact: Callable[[], Any],
    batches: list[Batch],
    rows: int,
    calls: int,
    repeats: int,
) -> tuple[Any, Any, dict[str, float]]:
    """Insert and sample rates of a full and a compact table, each filled with `batches`,
    after checking that the compact one samples what the full one does (same seed, same
    draws); the two filled tables and the rates."""
    rates = best_rates(
        {
            "insert_full_rows": partial(insert_all, full, batches),
            "insert_compact": partial(insert_all, compact, batches),
        },
        repeats,
    )
    full_table, compact_table = full(), compact()
    for batch in batches:
        full_table.insert(batch)
        compact_table.insert(batch)
    want, got = full_table.sample(rows)[0], compact_table.sample(rows)[0]
    for name in want:
        if not np.array_equal(want[name], got[name]):
            raise SystemExit(f"compact storage: sampled {name} differ from the full items")
    rates |= best_rates(
        {
            "sample_full_rows": partial(sample_many, full_table, calls),
            "sample_compact": partial(sample_many, compact_table, calls),
        },
        repeats,
    )
    return full_table, compact_table, rates


def measure_compact(transitions: int, repeats: int) -> dict[str, float]:
    """Bytes per stored transition and throughput of compact against full-row storage, after
    checking that the compact table's samples equal the full table's (same seed, same draws)."""
    batches = stacked_batches(transitions)
    capacity = len(batches) * INSERT_ROWS // 2 // INSERT_ROWS * INSERT_ROWS
    form = StorageForm(stack_num=STACK, ignore_obs_next=True)
    full_table, compact_table, rates = race_storage(
        partial(ReplayTable, capacity, seed=3),
        lambda: CompactTable(ReplayTable(capacity, seed=3), form),
        batches,
        SAMPLE_ROWS,
        max(1, transitions // SAMPLE_ROWS // 4),
        repeats,
    )
    rates["bytes_full_rows"] = full_table.nbytes() / capacity
    rates["bytes_compact"] = compact_table.nbytes() / capacity
    return rates


def report_compact(rates: dict[str, float], items: str = "") -> dict[str, float]:
    """The compact table's figures against full storage; `items` names item kinds other than
    transition rows (in the title and the JSON keys)."""
    title = f"compact {items or 'transition rows'}"
    print(f"\n{title} (stack_num {STACK}, ignore_obs_next, {4 * FRAME} B frames)")
    print(f"{'figure':<40}{'compact':>14}  {'full rows':>12}  {'ratio':>5}")
    figures: dict[str, float] = {}
    for what, unit in (
        ("bytes", "B/transition"),
        ("insert", "transitions/s"),
        ("sample", "transitions/s"),
    ):
        ours, theirs = rates[f"{what}_compact"], rates[f"{what}_full_rows"]
        print(
            f"{what + ' (' + unit + ')':<40}{ours:>14,.0f}  {theirs:>12,.0f}  {ours / theirs:>5.2f}"
        )
        key = f"compact_{items + '_' if items else ''}{what}"
        figures[key] = round(ours)
        figures[f"{key}_ratio"] = round(ours / theirs, 3)
    return figures


SEQUENCE = 40
"""Steps per sequence item (R2D2's), consecutive sequences sharing half of them."""


def stacked_sequences(count: int, seed: int = 0) -> list[Batch]:
    """`count` sequence items `[40, 1, ...]` in batches of 8, as R2D2's collectors send them
    from an env stacking 4 frames of 1 KB: consecutive sequences of an episode share 20 steps,
    and the last of each episode of 200 steps ends early (zeros after its last step)."""
    rng = np.random.default_rng(seed)
    per_episode = EPISODE // (SEQUENCE // 2)
    frames = rng.standard_normal((count // per_episode + 1, EPISODE + STACK, FRAME), np.float32)
    items: dict[str, list[np.ndarray]] = {}
    for i in range(count):
        episode, start = divmod(i, per_episode)
        start *= SEQUENCE // 2
        steps = min(SEQUENCE, EPISODE - start)
        at = np.minimum(np.arange(start, start + SEQUENCE + 1), EPISODE)
        stacks = np.stack([frames[episode, t : t + STACK].reshape(-1) for t in at])
        real = (np.arange(SEQUENCE) < steps)[:, None]
        item = {
            "observations": np.where(real, stacks[:-1], 0)[:, None],
            "next_observations": np.where(real, stacks[1:], 0)[:, None],
            "actions": rng.integers(0, 4, (SEQUENCE, 1)) * real,
            "rewards": np.ones((SEQUENCE, 1), np.float32) * real,
            "filled": real[:, 0],
            "episode_id": np.full(SEQUENCE, episode, np.int64),
            "recurrent_state": rng.standard_normal((SEQUENCE, 1, 64), np.float32)
            * real[:, :, None],
        }
        for name, value in item.items():
            items.setdefault(name, []).append(value.astype(value.dtype))
    columns = {name: np.stack(values) for name, values in items.items()}
    return [{n: c[i : i + 8] for n, c in columns.items()} for i in range(0, count, 8)]


def measure_compact_sequences(count: int, repeats: int) -> dict[str, float]:
    """As `measure_compact`, for sequence items in a `CompactItemTable` against a table of
    full items."""
    batches = stacked_sequences(count)
    capacity = count // 2
    form = StorageForm(stack_num=STACK, ignore_obs_next=True)
    full_table, compact_table, rates = race_storage(
        partial(ReplayTable, capacity, seed=3),
        partial(CompactItemTable, capacity, form, seed=3),
        batches,
        16,
        max(1, count // 64),
        repeats,
    )
    per_item = capacity * SEQUENCE  # transitions a full table holds
    rates["bytes_full_rows"] = full_table.nbytes() / per_item
    rates["bytes_compact"] = compact_table.nbytes() / per_item
    for what in ("insert", "sample"):  # items/s -> transitions/s
        rates[f"{what}_full_rows"] *= SEQUENCE
        rates[f"{what}_compact"] *= SEQUENCE
    return rates


def report(rates: dict[str, float], transitions: int, capacity: int) -> dict[str, float]:
    """Print the table and return the figures with their ratios to the baselines."""
    figures: dict[str, float] = {"transitions": transitions, "capacity": capacity}
    figures.update({k: round(v) for k, v in rates.items()})
    ratio = {name: rates[name] / rates[base] for name, base in BASELINE_OF.items()}
    figures.update({key: round(ratio[name], 3) for key, name in RATIOS.items()})
    print(f"{'operation':<40}{'transitions/s':>14}  {'ratio':>5}  baseline")
    for name, base in BASELINE_OF.items():
        print(f"{name:<40}{rates[name]:>14,.0f}  {ratio[name]:>5.2f}  {base}")
    for base in BASELINE_OF.values():
        print(f"{base:<40}{rates[base]:>14,.0f}")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ReplayTable throughput vs bare numpy baselines.")
    parser.add_argument("--transitions", type=int, default=2**18, help="rows inserted per run")
    parser.add_argument("--capacity", type=int, default=2**16, help="table capacity in rows")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per figure; best is kept")
    parser.add_argument(
        "--stacked-transitions", type=int, default=2**14, help="rows of 4 x 1 KB frame stacks"
    )
    parser.add_argument(
        "--stacked-sequences", type=int, default=512, help="sequence items of 40 such steps"
    )
    args = parser.parse_args(argv)
    if args.capacity % INSERT_ROWS or args.capacity < INSERT_ROWS:
        parser.error(f"--capacity must be a positive multiple of {INSERT_ROWS}")
    if args.transitions < SAMPLE_ROWS:
        parser.error(f"--transitions must be at least {SAMPLE_ROWS}")
    check_baseline()
    rates = measure(args.transitions, args.capacity, args.repeats)
    figures = report(rates, args.transitions, args.capacity)
    figures |= report_compact(measure_compact(args.stacked_transitions, args.repeats))
    sequences = measure_compact_sequences(args.stacked_sequences, args.repeats)
    figures |= report_compact(sequences, "sequences")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
