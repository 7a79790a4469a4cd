"""Checkpoint writes of a big replay table against a raw h5py write of the same arrays, and the
work a run loses while it checkpoints.

    python tools/bench_checkpoint.py [--rows N] [--obs-bytes B] [--repeats R]
                                     [--e2e-seconds S] [--ranks K]

Part 1, one replay shard in this process (the real `ReplayShard` role, its real checkpoint
path): a table of `--rows` transitions with observations and next observations of
`--obs-bytes` each (default 2M rows x 1 KB x 2 = 4.1 GB) is checkpointed the way a run does it
(a `checkpoint` request, the snapshot, the writer thread, the `checkpointed` report) while the
shard's loop keeps polling and a collector keeps sending it batches. The baseline writes the
same column arrays with bare h5py (contiguous datasets, no filters) and fsyncs the file, so
both sides pay for the disk. Turns alternate for `--repeats` rounds; each side keeps its best.
Reported: the two write times and their ratio (`write_ratio`, raw / hpcmarl: 1.0 = no
overhead), the longest gap between two polls of the shard during its write (its stall), and the
batches the collector got credit for during the write (collectors are not held back).

Part 2, a real run (`--e2e-seconds`, `mpirun -n --ranks`): DQN on CartPole with observations
padded to 1 KB (`hpcmarl.testing.bulky:BulkyCartPole-v1`), collectors not held back by a
samples-per-insert ratio, a checkpoint every 10 s with the default timeouts. From
`metrics.jsonl`, per checkpoint: its bytes, the collectors' stall (from its start to the cut,
when no task is granted: running tasks finish, then every role snapshots) against the write
(`stall_over_write_ratio`), and the env steps per second while the files are written against
the run's rate outside checkpoints (`collect_while_writing_ratio`; with the stall:
`collect_during_checkpoint_ratio`). The final checkpoint, which ends the run, is left out.

Prints a table, then as its last line one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher import hpcmarl_command, hpcmarl_env  # noqa: E402

from hpcmarl.comm.protocol import Message  # noqa: E402
from hpcmarl.comm.transport import LocalTransport  # noqa: E402
from hpcmarl.config.schema import ReplayConfig  # noqa: E402
from hpcmarl.items.spec import ReplaySpec  # noqa: E402
from hpcmarl.replay.table import ReplayTable  # noqa: E402
from hpcmarl.roles.replay_shard import ReplayShard  # noqa: E402
from hpcmarl.storage.hdf5 import fsync_dir  # noqa: E402

GROUP = "shared"
BATCH_ROWS = 32


class ShardBench:
    """One shard whose one table holds `rows` transitions, with a commander's and a
    collector's inbox on the same in-process transport."""

    def __init__(self, rows: int, obs_bytes: int) -> None:
        rank_of = {"replay0": 0, "collector0": 0, "commander": 0}
        self.transport = LocalTransport(rank_of, 0)
        self.commander = self.transport.register("commander")
        self.collector = self.transport.register("collector0")
        cfg = ReplayConfig(table_capacity=rows, learning_starts=1, samples_per_insert=0.0)
        spec = {GROUP: ReplaySpec("uniform")}
        self.shard = ReplayShard("replay0", self.transport, cfg, spec, ["collector0"], seed=0)
        self.obs_floats = obs_bytes // 4
        table = self.shard.tables[GROUP]
        step = 1 << 16
        block = np.random.default_rng(0).standard_normal((step, self.obs_floats), np.float32)
        for start in range(0, rows, step):
            table.insert(batch(block[: min(step, rows - start)]))
        del block

    def columns(self) -> dict[str, np.ndarray]:
        table = self.shard.tables[GROUP]
        assert isinstance(table, ReplayTable)
        return {name: table.column(name) for name in table.columns}

    def checkpoint(self, folder: Path, ckpt_id: str) -> dict[str, float]:
        """One checkpoint as a run takes it (request, snapshot, writer thread, report) while a
        collector sends a batch every poll of the write: the time from request to report, the
        longest gap between two polls, the batches sent and the credits they got back."""
        self.commander.clear()
        self.collector.clear()
        obs = np.zeros((BATCH_ROWS, self.obs_floats), np.float32)
        shard, transport = self.shard, self.transport
        meta = {"id": ckpt_id, "run_dir": str(folder), "expect": {}}
        start = last = time.perf_counter()
        transport.send(Message("checkpoint", "commander", "replay0", meta))
        longest, sent = 0.0, 0
        while not any(m.kind == "checkpointed" for m in self.commander):
            if shard.writing:
                meta = {"group": GROUP, "items": BATCH_ROWS}
                transport.send(Message("batch", "collector0", "replay0", meta, batch(obs.copy())))
                sent += 1
            shard.poll()
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
            time.sleep(0.002)
        seconds = time.perf_counter() - start
        credits = sum(m.meta["n"] for m in self.collector if m.kind == "credit")
        while shard.pending_inserts:
            shard.poll()
        shutil.rmtree(folder / "checkpoints" / ckpt_id)
        return {"seconds": seconds, "longest_poll_gap_s": longest, "sent": sent, "credits": credits}


def batch(obs: np.ndarray) -> dict[str, np.ndarray]:
    n = len(obs)
    return {
        "observations": obs,
        "next_observations": obs,
        "actions": np.arange(n, dtype=np.int64) % 2,
        "rewards": np.ones(n, np.float32),
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
    }


def raw_write(columns: dict[str, np.ndarray], folder: Path) -> float:
    """Bare h5py: one contiguous dataset per column, no filters, then fsync."""
    path = folder / "raw.h5"
    start = time.perf_counter()
    with h5py.File(path, "w") as f:
        for name, column in columns.items():
            f.create_dataset(name, data=column)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    fsync_dir(folder)
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def part_one(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    built = time.perf_counter()
    bench = ShardBench(args.rows, args.obs_bytes)
    columns = bench.columns()
    nbytes = sum(c.nbytes for c in columns.values())
    print(
        f"table: {args.rows:,} rows, {nbytes / 1e9:.2f} GB, filled in "
        f"{time.perf_counter() - built:.1f} s",
        flush=True,
    )
    raw, ours = [], []
    for i in range(args.repeats):
        raw.append(raw_write(columns, folder))
        ours.append(bench.checkpoint(folder, f"{i + 1:06d}"))
        print(
            f"  round {i + 1}: raw h5py {raw[-1]:.2f} s, hpcmarl {ours[-1]['seconds']:.2f} s "
            f"(longest poll gap {ours[-1]['longest_poll_gap_s'] * 1e3:.0f} ms, "
            f"{ours[-1]['credits']} of {ours[-1]['sent']} batches credited)",
            flush=True,
        )
    best = min(ours, key=lambda r: r["seconds"])
    return {
        "table_bytes": nbytes,
        "raw_write_s": round(min(raw), 3),
        "hpcmarl_write_s": round(best["seconds"], 3),
        "write_ratio": round(min(raw) / best["seconds"], 3),
        "raw_write_gb_per_s": round(nbytes / min(raw) / 1e9, 3),
        "hpcmarl_write_gb_per_s": round(nbytes / best["seconds"] / 1e9, 3),
        "longest_poll_gap_s": round(max(r["longest_poll_gap_s"] for r in ours), 4),
        "credited_during_write_ratio": round(
            sum(r["credits"] for r in ours) / max(1, sum(r["sent"] for r in ours)), 3
        ),
    }


def part_two(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    run_dir = folder / "e2e"
    job = [
        "env.id=hpcmarl.testing.bulky:BulkyCartPole-v1",
        "commander.stop_value=null",
        "commander.max_env_steps=100000000",
        f"commander.max_wall_time_s={args.e2e_seconds}",
        "checkpoint.interval_s=10",
        f"replay.table_capacity={args.e2e_capacity}",
        "replay.samples_per_insert=0",  # collectors run free: what they lose is the figure
        f"runtime.run_dir={run_dir}",
    ]
    done = subprocess.run(
        hpcmarl_command(args.ranks, job),
        capture_output=True,
        text=True,
        env=hpcmarl_env(),
        cwd=ROOT,
        timeout=args.e2e_seconds + 600,
    )
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"the run failed with exit code {done.returncode}")
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    checkpoints = [r for r in rows if r["kind"] == "checkpoint"]
    finished = rows[-1]
    total_s, total_steps = finished["time_s"], finished["env_steps"]
    # The final checkpoint ends the run and keeps everything still by design: left out.
    periodic = [r for r in checkpoints if "resume_time_s" in r]
    in_ckpt_s = sum(r["commit_time_s"] - r["begin_time_s"] for r in checkpoints)
    in_ckpt_steps = sum(r["commit_env_steps"] - r["begin_env_steps"] for r in checkpoints)
    outside = (total_steps - in_ckpt_steps) / max(1e-9, total_s - in_ckpt_s)
    write_s = sum(r["commit_time_s"] - r["resume_time_s"] for r in periodic)
    write_steps = sum(r["commit_env_steps"] - r["resume_env_steps"] for r in periodic)
    whole_s = sum(r["commit_time_s"] - r["begin_time_s"] for r in periodic)
    whole_steps = sum(r["commit_env_steps"] - r["begin_env_steps"] for r in periodic)
    stall = max((r["resume_time_s"] - r["begin_time_s"] for r in periodic), default=0.0)
    longest_write = max((r["write_s"] for r in periodic), default=0.0)
    print(f"run: {total_steps:,} env steps in {total_s:.0f} s, {len(checkpoints)} checkpoints")
    print(f"  {'id':<8} {'MB':>8} {'stall s':>8} {'write s':>8} {'steps/s in write':>17}")
    for r in checkpoints:
        if "resume_time_s" not in r:
            print(
                f"  {r['id']:<8} {r['bytes'] / 1e6:8.1f} {r['total_s']:8.2f} "
                f"{r['write_s']:8.2f} {'(final: the run stops)':>17}"
            )
            continue
        dt = max(1e-9, r["commit_time_s"] - r["resume_time_s"])
        rate = (r["commit_env_steps"] - r["resume_env_steps"]) / dt
        print(
            f"  {r['id']:<8} {r['bytes'] / 1e6:8.1f} {r['resume_time_s'] - r['begin_time_s']:8.2f} "
            f"{r['write_s']:8.2f} {rate:17.0f}"
        )
    return {
        "e2e_env_steps": total_steps,
        "e2e_checkpoints": len(checkpoints),
        "e2e_largest_checkpoint_bytes": max((r["bytes"] for r in checkpoints), default=0),
        "e2e_steps_per_s_outside": round(outside, 1),
        "e2e_steps_per_s_while_writing": round(write_steps / max(write_s, 1e-9), 1),
        "collect_while_writing_ratio": round(write_steps / max(write_s, 1e-9) / outside, 3),
        "collect_during_checkpoint_ratio": round(whole_steps / max(whole_s, 1e-9) / outside, 3),
        "e2e_longest_collector_stall_s": round(stall, 3),
        "e2e_longest_write_s": round(longest_write, 3),
        "stall_over_write_ratio": round(stall / max(longest_write, 1e-9), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--obs-bytes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--e2e-seconds", type=float, default=60.0)
    parser.add_argument("--e2e-capacity", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir=args.dir))
    try:
        figures = part_one(args, folder)
        if args.e2e_seconds > 0:
            figures |= part_two(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"{'figure':<36} value")
    for key, value in figures.items():
        print(f"{key:<36} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
