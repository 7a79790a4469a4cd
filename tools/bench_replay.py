"""Replay table throughput against a bare numpy ring buffer measured in the same run.

    python tools/bench_replay.py [--transitions N] [--capacity C] [--repeats R]

Inserts CartPole-like transitions in batches of 32 rows and samples batches of 64 rows, through
`ReplayTable` (uniform and prioritized) and through a baseline that does only the array work
(slice assignment in, fancy indexing out). Contenders take turns for `--repeats` rounds and each
keeps its best round, which filters out the noise of a shared machine. Prints a table, then as
its last line one JSON object whose `*_ratio` fields are table / baseline throughput (1.0 = no
overhead). What the table does beyond the baseline: schema checks on insert, insert ids and
weights on sample; prioritized tables also keep a sum tree.
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

from hpcmarl.replay.table import ReplayTable  # noqa: E402

INSERT_ROWS = 32
SAMPLE_ROWS = 64
Batch = dict[str, np.ndarray]


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
    """The baseline: preallocated columns, slice assignment in, fancy indexing out, nothing else.

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


def measure(transitions: int, capacity: int, repeats: int) -> dict[str, float]:
    """All throughputs in transitions/s, baseline and table interleaved in one process."""
    batches = make_batches(transitions)
    calls = max(1, transitions // SAMPLE_ROWS)
    make_ring = partial(NumpyRing, capacity, batches[0])
    make_uniform = partial(ReplayTable, capacity)
    make_prioritized = partial(ReplayTable, capacity, prioritized=True)
    rates = best_rates(
        {
            "baseline_insert": partial(insert_all, make_ring, batches),
            "insert_uniform": partial(insert_all, make_uniform, batches),
            "insert_prioritized": partial(insert_all, make_prioritized, batches),
        },
        repeats,
    )
    ring, uniform, prioritized = make_ring(), make_uniform(), make_prioritized()
    filled: tuple[Buffer, ...] = (ring, uniform, prioritized)
    for buffer in filled:
        for batch in batches:
            buffer.insert(batch)
    td_errors = np.random.default_rng(1).random(SAMPLE_ROWS)
    rates |= best_rates(
        {
            "baseline_sample": partial(sample_many, ring, calls),
            "sample_uniform": partial(sample_many, uniform, calls),
            "sample_prioritized": partial(sample_many, prioritized, calls),
            "sample_and_update_prioritized": partial(
                sample_and_update, prioritized, calls, td_errors
            ),
        },
        repeats,
    )
    return rates


def report(rates: dict[str, float], transitions: int, capacity: int) -> dict[str, float]:
    """Print the table and return the figures with their ratios to the baseline."""
    figures: dict[str, float] = {"transitions": transitions, "capacity": capacity}
    figures.update({k: round(v) for k, v in rates.items()})
    figures["insert_ratio"] = rates["insert_uniform"] / rates["baseline_insert"]
    figures["insert_prioritized_ratio"] = rates["insert_prioritized"] / rates["baseline_insert"]
    figures["sample_uniform_ratio"] = rates["sample_uniform"] / rates["baseline_sample"]
    figures["sample_prioritized_ratio"] = rates["sample_prioritized"] / rates["baseline_sample"]
    print(f"{'operation':<32}{'transitions/s':>16}{'vs baseline':>14}")
    baseline = {"insert": rates["baseline_insert"], "sample": rates["baseline_sample"]}
    for name, rate in rates.items():
        kind = "sample" if "sample" in name else "insert"
        print(f"{name:<32}{rate:>16,.0f}{rate / baseline[kind]:>14.2f}")
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ReplayTable throughput vs a bare numpy ring.")
    parser.add_argument("--transitions", type=int, default=2**18, help="rows inserted per run")
    parser.add_argument("--capacity", type=int, default=2**16, help="table capacity in rows")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per figure; best is kept")
    args = parser.parse_args(argv)
    if args.capacity % INSERT_ROWS or args.capacity < INSERT_ROWS:
        parser.error(f"--capacity must be a positive multiple of {INSERT_ROWS}")
    if args.transitions < SAMPLE_ROWS:
        parser.error(f"--transitions must be at least {SAMPLE_ROWS}")
    rates = measure(args.transitions, args.capacity, args.repeats)
    print(json.dumps(report(rates, args.transitions, args.capacity)))


if __name__ == "__main__":
    main()
