"""Offline dataset loading: a replay shard filling its tables from a replay log, against a raw
h5py read of the same columns into preallocated numpy arrays, in the same run.

    .venv/bin/python tools/bench_offline.py [--rows 1000000] [--shards 1 2] [--dir /tmp/x]

The log is `bench_analyze`'s CartPole-shaped file (written with the real `ReplayLogWriter`).
For each shard count, every shard's share is loaded the way a shard does at start-up
(`load_share` into a `ReplayTable`, prioritized), one shard after another, so the figure is the
per-rank cost a job pays before its first sample. The limit is h5py reading every batch column
of the whole file in the same 64k-row chunks and copying them into arrays of the table's size.

Prints a table, then one JSON line with `load_ratio_<n>shards` (load / raw throughput).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from hpcmarl.launch.build import EnvSpec
from hpcmarl.replay.columns import BATCH_COLUMNS
from hpcmarl.replay.offline import CHUNK_ROWS, load_share
from hpcmarl.replay.table import ReplayTable

sys.path.insert(0, str(Path(__file__).parent))
from bench_analyze import write_log  # noqa: E402 - the same file as the analysis benchmark

SPEC = EnvSpec(["agent_0"], {"agent_0": 4}, {"agent_0": 2}, {"agent_0": "shared"})


def raw_read(path: Path) -> tuple[float, int]:
    """Seconds to read every batch column in chunks into preallocated arrays; rows read."""
    start = time.perf_counter()
    with h5py.File(path, "r", locking=False) as f:
        group = f["agents/agent_0"]
        rows = len(group["rewards"])
        out = {c: np.empty(group[c].shape, group[c].dtype) for c in BATCH_COLUMNS}
        for first in range(0, rows, CHUNK_ROWS):
            stop = min(first + CHUNK_ROWS, rows)
            for c in BATCH_COLUMNS:
                group[c].read_direct(out[c], np.s_[first:stop], np.s_[first:stop])
    return time.perf_counter() - start, rows


def shard_load(path: Path, shards: int, rows: int) -> float:
    """Seconds for every shard in turn to load its share into a prioritized table."""
    start = time.perf_counter()
    loaded = 0
    for index in range(shards):
        table = ReplayTable(-(-rows // shards), prioritized=True)
        for _, batch in load_share(str(path), SPEC, index, shards):
            table.insert(batch)
        loaded += table.size
    assert loaded == rows, (loaded, rows)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "collector0.h5"
        write_log(path, args.rows)
        raw_s, rows = min(raw_read(path) for _ in range(args.repeats))
        figures: dict[str, float] = {"rows": rows, "raw_rows_per_s": round(rows / raw_s)}
        print(f"{'reader':<22} {'seconds':>8} {'rows/s':>12} {'ratio':>6}")
        print(f"{'raw h5py read':<22} {raw_s:8.3f} {rows / raw_s:12,.0f} {1.0:6.2f}")
        for shards in args.shards:
            load_s = min(shard_load(path, shards, rows) for _ in range(args.repeats))
            ratio = raw_s / load_s
            label = f"load, {shards} shard(s)"
            print(f"{label:<22} {load_s:8.3f} {rows / load_s:12,.0f} {ratio:6.2f}")
            figures[f"load_rows_per_s_{shards}shards"] = round(rows / load_s)
            figures[f"load_ratio_{shards}shards"] = round(ratio, 3)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
