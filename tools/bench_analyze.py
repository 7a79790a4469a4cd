"""Replay analysis throughput against a raw h5py read, and its peak memory at two file sizes.

    .venv/bin/python tools/bench_analyze.py [--rows 1000000] [--small 250000] [--dir /tmp/x]

Replay logs are written with the real `ReplayLogWriter` (CartPole-shaped rows: 4 observation
floats, 2 actions, a collector with 8 env copies and 128-step fragments, episodes of 10-200
steps). Then, in the same run:

- raw: h5py reads the columns the analysis reads (every column but the observations), whole;
- analyze: `hpcmarl.analysis.analyze` on the same file, 64k rows at a time per table;
- memory: each of the two files is analysed in a fresh process; its peak of traced Python/numpy
  allocations (tracemalloc) and its peak resident set size are reported. The analysis keeps
  running summaries only, so the peaks should not grow with the file.

Prints a table, then one JSON line with `throughput_ratio` (analyze / raw, target >= 0.5) and
`memory_ratio` (traced peak of the large file / the small one, ~1.0 when independent of size).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np

from hpcmarl.analysis import analyze
from hpcmarl.analysis.reader import STATS_COLUMNS
from hpcmarl.storage.replay_log import ReplayLogWriter

NUM_ENVS, FRAGMENT = 8, 128


def write_log(path: Path, rows: int, seed: int = 0) -> None:
    """A replay log of `rows` transitions of one agent, fragment by fragment."""
    steps = -(-rows // NUM_ENVS)
    fragments = -(-steps // FRAGMENT)
    per_env = [_episodes(fragments * FRAGMENT, e, seed) for e in range(NUM_ENVS)]
    rng = np.random.default_rng(seed)
    writer = ReplayLogWriter(
        path,
        agents=["agent_0"],
        policy_of={"agent_0": "shared"},
        obs_dims={"agent_0": 4},
        n_actions={"agent_0": 2},
        env_id="CartPole-v1",
        flush_every=10,
        meta={"bench": True},
    )
    for f in range(fragments):
        window = slice(f * FRAGMENT, (f + 1) * FRAGMENT)
        cols = {k: np.concatenate([env[k][window] for env in per_env]) for k in per_env[0]}
        n = len(cols["step"])
        cols["observations"] = rng.standard_normal((n, 4)).astype("<f4")
        cols["next_observations"] = rng.standard_normal((n, 4)).astype("<f4")
        cols["actions"] = rng.integers(0, 2, n)
        cols["rewards"] = np.ones(n, "<f4")
        cols["agent_id"] = np.zeros(n, "<i2")
        cols["policy_version"] = np.full(n, f // 4, "<i8")
        writer.append("shared", cols)
    writer.close()


def _episodes(steps: int, env: int, seed: int) -> dict[str, np.ndarray]:
    """Episode id, step and end flags of one env copy for `steps` steps."""
    rng = np.random.default_rng(seed * 1000 + env)
    lengths = rng.integers(10, 201, steps // 10 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), steps) + 1]
    ids = env * 10**9 + np.repeat(np.arange(len(lengths)), lengths)[:steps]
    step = (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))[:steps]
    last = step == np.repeat(lengths - 1, lengths)[:steps]
    truncated = last & (np.repeat(lengths, lengths)[:steps] == 200)
    return {
        "episode_id": ids.astype("<i8"),
        "step": step.astype("<i4"),
        "terminations": last & ~truncated,
        "truncations": truncated,
    }


def raw_read(path: Path) -> float:
    start = time.perf_counter()
    with h5py.File(path, "r") as f:
        group = f["agents/agent_0"]
        for name in STATS_COLUMNS:
            group[name][()]
    return time.perf_counter() - start


def analyze_time(path: Path) -> float:
    start = time.perf_counter()
    analyze([path])
    return time.perf_counter() - start


def memory_child(path: str) -> None:
    """Run in a fresh process: print the traced peak and the resident peak, in MiB."""
    tracemalloc.start()
    analyze([path])
    _, peak = tracemalloc.get_traced_memory()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"traced_mib": peak / 2**20, "rss_mib": rss}))


def memory(path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def best_of_alternating(path: Path, repeats: int) -> tuple[float, float]:
    """Best raw and analyze times, measured in turns so that load from other processes on a
    shared node hits both alike."""
    raw_read(path), analyze_time(path)  # warm the page cache and the imports
    times = [(raw_read(path), analyze_time(path)) for _ in range(repeats)]
    return min(t[0] for t in times), min(t[1] for t in times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--small", type=int, default=250_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=None)
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return
    folder = Path(args.dir or tempfile.mkdtemp(prefix="bench_analyze_"))
    folder.mkdir(parents=True, exist_ok=True)
    big, small = folder / f"log_{args.rows}.h5", folder / f"log_{args.small}.h5"
    for path, rows in ((big, args.rows), (small, args.small)):
        if not path.exists():
            t = time.perf_counter()
            write_log(path, rows)
            print(f"wrote {rows:,} rows to {path} in {time.perf_counter() - t:.1f} s", flush=True)
    raw, ana = best_of_alternating(big, args.repeats)
    mem_small, mem_big = memory(small), memory(big)
    rows = args.rows
    print(f"{'':28}{'seconds':>10}{'rows/s':>14}")
    print(f"{'raw h5py read (8 columns)':28}{raw:10.3f}{rows / raw:14,.0f}")
    print(f"{'analyze':28}{ana:10.3f}{rows / ana:14,.0f}")
    print(f"{'peak memory':28}{'traced MiB':>12}{'RSS MiB':>12}")
    for label, m in ((f"{args.small:,} rows", mem_small), (f"{rows:,} rows", mem_big)):
        print(f"{label:28}{m['traced_mib']:12.1f}{m['rss_mib']:12.1f}")
    result = {
        "rows": rows,
        "raw_rows_per_s": round(rows / raw),
        "analyze_rows_per_s": round(rows / ana),
        "throughput_ratio": round(raw / ana, 3),
        "traced_peak_mib_small": round(mem_small["traced_mib"], 2),
        "traced_peak_mib_large": round(mem_big["traced_mib"], 2),
        "memory_ratio": round(mem_big["traced_mib"] / mem_small["traced_mib"], 3),
        "rss_ratio": round(mem_big["rss_mib"] / mem_small["rss_mib"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
