"""Gradient averaging through hpcmarl's averagers against a raw `MPI.COMM_WORLD.Allreduce`.

Run under mpirun, e.g. `bash tools/mpirun.sh -n 2 .venv/bin/python tools/bench_allreduce.py`.
For each backend (mpi; torch, with gloo on the CPU or NCCL with `--device cuda`; horovod where it
imports) and each size (the default job's DQN gradient,
4 inputs, [256, 256], 2 outputs; and a 10M-parameter buffer), times `averager.average(grad)`
and a raw `Allreduce` of the same bytes, interleaved in the same run, each op started together
after a barrier and timed by its slowest rank. Prints a table, then as its last line one JSON
object whose `*_ratio` fields are raw time / hpcmarl time (1.0 = no overhead; target >= 0.9).
Horovod rows also get a `*_quiet_ratio` against the raw time measured before Horovod started,
because Horovod's background thread slows the raw baseline measured beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from mpi4py import MPI

from hpcmarl.algos.networks import mlp, num_params
from hpcmarl.comm.allreduce import SoloAverager, make_averager
from hpcmarl.comm.horovod import unavailable_reason


def sizes() -> dict[str, int]:
    return {"dqn": num_params(mlp(4, [256, 256], 2)), "10m": 10_000_000}


def timed(comm: MPI.Comm, op: Callable[[], object]) -> float:
    """Seconds `op` took on this rank, all ranks starting together."""
    comm.Barrier()
    start = time.perf_counter()
    op()
    return time.perf_counter() - start


def measure(averager: SoloAverager, n: int, reps: int) -> tuple[float, float]:
    """Median seconds of (hpcmarl average, raw Allreduce) for `n` float32 values on the slowest
    rank, interleaved op by op so that both see the same load."""
    world = MPI.COMM_WORLD
    grad = np.random.default_rng(world.rank).standard_normal(n).astype(np.float32)
    out = np.empty_like(grad)
    ours, raw = [], []
    for _ in range(reps + 2):  # the first two warm up (connections, Horovod's cache)
        fresh = grad.copy()  # the averager owns what it is given, as it owns a fresh gradient
        ours.append(timed(world, partial(averager.average, fresh)))
        raw.append(timed(world, partial(world.Allreduce, grad, out, op=MPI.SUM)))
    local = np.array([ours[2:], raw[2:]])
    slowest = np.empty_like(local)
    world.Allreduce(local, slowest, op=MPI.MAX)
    return float(np.median(slowest[0])), float(np.median(slowest[1]))


def run(backends: list[str], reps_small: int, reps_large: int, device: str) -> list[tuple]:
    """Rows of (backend, buffer, floats, hpcmarl s, raw s), Horovod last: it cannot be stopped
    and restarted, and its background thread slows every MPI call of the process once started.
    torch's file store goes in a folder of rank 0's, on this host (one host only)."""
    group = MPI.COMM_WORLD.Split(0, MPI.COMM_WORLD.rank)  # a learner group spanning every rank
    folder = group.bcast(tempfile.mkdtemp(prefix="bench_allreduce") if group.rank == 0 else None)
    rows = []
    for backend in backends:
        store = os.path.join(folder, f"{backend}.store")
        averager, line = make_averager(backend, group, f"bench{backend}", device, store)
        for label, n in sizes().items():
            ours, raw = measure(averager, n, reps_small if n < 1_000_000 else reps_large)
            rows.append((backend + library(line), label, n, ours, raw))
        averager.close()
    group.Barrier()
    if group.rank == 0:
        os.rmdir(folder)
    return rows


def library(line: str) -> str:
    """`/gloo` or `/nccl` for the torch backend, from its announcement; else nothing."""
    return "/" + line.split("(")[-1].split(",")[0] if "with torch (" in line else ""


def report(rows: list[tuple]) -> dict[str, float]:
    """Print the table; return the ratios. A Horovod row gets two: against the raw time measured
    beside it (Horovod running) and against the quiet raw time of the MPI row before it."""
    quiet = {label: raw for backend, label, _, _, raw in rows if backend == "mpi"}
    summary: dict[str, float] = {"ranks": MPI.COMM_WORLD.size}
    print(f"allreduce benchmark, {MPI.COMM_WORLD.size} ranks (median of timed ops, slowest rank)")
    print(f"{'backend':<10} {'buffer':<6} {'floats':>10} {'hpcmarl ms':>11} {'raw ms':>9}  ratio")
    for backend, label, n, ours, raw in rows:
        summary[f"{backend.replace('/', '_')}_{label}_ratio"] = round(raw / ours, 3)
        times = f"{ours * 1e3:>11.3f} {raw * 1e3:>9.3f}"
        line = f"{backend:<10} {label:<6} {n:>10,} {times}  {raw / ours:.2f}"
        if backend == "horovod":
            summary[f"horovod_{label}_quiet_ratio"] = round(quiet[label] / ours, 3)
            line += f"  (vs raw before horovod started: {quiet[label] / ours:.2f})"
        print(line)
    if all(backend != "horovod" for backend, *_ in rows):
        print(f"horovod not measured: {unavailable_reason()}")
    else:
        cycle = os.environ.get("HOROVOD_CYCLE_TIME", "1 (default)")
        print(f"horovod cycle time {cycle} ms: a small average waits for the next cycle")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps-small", type=int, default=300, help="timed ops, DQN buffer")
    parser.add_argument("--reps-large", type=int, default=15, help="timed ops, 10M buffer")
    parser.add_argument(
        "--device", default="cpu", help="cuda: torch's rows average with NCCL, a GPU per rank"
    )
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        args.device = f"cuda:{MPI.COMM_WORLD.rank % torch.cuda.device_count()}"
    backends = ["mpi", "torch"] + (["horovod"] if unavailable_reason() is None else [])
    rows = run(backends, args.reps_small, args.reps_large, args.device)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(report(rows)), flush=True)


if __name__ == "__main__":
    main()
