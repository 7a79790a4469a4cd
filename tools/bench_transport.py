"""Weights and batch transfer through hpcmarl's transport vs a raw MPI Send of the same bytes.

Run under two ranks: `tools/mpirun.sh -n 2 .venv/bin/python tools/bench_transport.py`, or
across the hosts of tools/local_cluster.sh with `.venv/bin/python tools/bench_transport.py
--hosts 2`, which runs the two ranks on one host and then one rank on each of two hosts, in the
same invocation, and prints both (`one_host_*`, `hosts_*`). Rank 0 streams N messages to rank 1,
N chosen so that one raw stream takes about `--seconds` (a first probe of the link times a few
messages; `--megabytes` caps it): a slow link gets fewer messages, not minutes per size.
The transport runs the flow the roles use: at most WINDOW
messages unacknowledged, their credits returned in batches (`comm/credits.py`: WINDOW // 2 at
a time, or whatever is owed when a poll finds nothing), received buffers recycled. It carries
(a) one weight vector, (b) a transition batch packed as collectors build it. `credits_per_message`
counts the credit messages the receiver sent per data message (one before batching;
`--credit-batch 1` runs that flow again). The raw, hot and transport streams take turns, each
repeat in the same order, and each keeps its fastest: a shared machine's load weighs on all.

The raw baseline is a blocking `Send`/`Recv` of the same bytes cycling through WINDOW + 1
distinct buffers on each side, as the transport's stream does (a pipelined stream cannot land
every message in one buffer). `*_ratio` = raw time / hpcmarl time. For reference the table also
shows a raw stream through one cache-hot buffer (`raw_hot_*`, `*_vs_hot_buffer`), a rate real
runs never see, since every weight push and every fragment is fresh memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hpcmarl.comm.credits import CreditReturn
from hpcmarl.comm.packing import allocate_packed
from hpcmarl.comm.protocol import Message
from hpcmarl.launch.run import launched_by_mpi

ROOT = Path(__file__).resolve().parent.parent

WINDOW = 8
CREDIT_BATCH = 0
"""Credits per credit message; 0: WINDOW // 2 (1 is the flow before batching)."""
SIZES = {"64KB": 64 << 10, "1MB": 1 << 20, "16MB": 16 << 20}


def batch_of(nbytes: int) -> dict[str, np.ndarray]:
    """A transition batch as collectors build it: columns packed in one buffer, filled in place."""
    rows = max(1, nbytes // (2 * 64 * 4 + 8 + 4 + 2 + 8 + 8))
    specs = [
        ("observations", "<f4", (rows, 64)),
        ("next_observations", "<f4", (rows, 64)),
        ("actions", "<i8", (rows,)),
        ("rewards", "<f4", (rows,)),
        ("terminations", "|b1", (rows,)),
        ("truncations", "|b1", (rows,)),
        ("policy_version", "<i8", (rows,)),
        ("episode_id", "<i8", (rows,)),
    ]
    columns = allocate_packed(specs)
    for array in columns.values():
        array[...] = 1
    return columns


def raw_stream(comm: Any, nbytes: int, count: int, nbuf: int) -> float:
    """Blocking Send/Recv of `count` messages cycling through `nbuf` distinct buffers."""
    buffers = [np.ones(nbytes, np.uint8) for _ in range(nbuf)]
    ack = np.zeros(1, np.int64)
    comm.Barrier()
    start = time.perf_counter()
    if comm.rank == 0:
        for i in range(count):
            comm.Send(buffers[i % nbuf], 1, 5)
        comm.Recv(ack, 1, 6)
    else:
        for i in range(count):
            comm.Recv(buffers[i % nbuf], 0, 5)
        comm.Send(ack, 0, 6)
    return time.perf_counter() - start


def transport_stream(comm: Any, arrays: dict[str, np.ndarray], count: int) -> tuple[float, int]:
    """Stream with the credit flow the roles use: at most WINDOW messages unacknowledged.
    Returns the time and the credit messages the receiver sent."""
    from hpcmarl.comm.transport import MpiTransport

    transport = MpiTransport({"a": 0, "b": 1}, comm)
    inbox = transport.register("a" if comm.rank == 0 else "b")
    comm.Barrier()
    start = time.perf_counter()
    if comm.rank == 0:
        sent, credits = 0, WINDOW
        while sent < count or credits < WINDOW:
            while credits and sent < count:
                transport.send(Message("batch", "a", "b", {"policy": "p"}, arrays))
                sent, credits = sent + 1, credits - 1
            transport.poll()
            while inbox:
                credits += inbox.popleft().meta["n"]
    else:
        ledger = CreditReturn(
            lambda peer, meta: transport.send(Message("credit", "b", peer, meta)),
            CREDIT_BATCH or WINDOW // 2,
        )
        received = 0
        while received < count:
            progressed = transport.poll()
            while inbox:
                transport.recycle(inbox.popleft().arrays)
                ledger.owe("a")
                received += 1
            if not progressed:
                ledger.flush()
        ledger.flush()
    elapsed = time.perf_counter() - start
    transport.finish(30)
    return elapsed, int(comm.bcast(ledger.messages if comm.rank == 1 else 0, root=1))


def raw_run(comm: Any, nbytes: int, count: int, nbuf: int) -> tuple[float, int]:
    """`raw_stream`'s time, and its credit messages: none."""
    return raw_stream(comm, nbytes, count, nbuf), 0


def best_interleaved(repeats: int, runs: list[Callable[[], tuple[float, int]]]) -> list:
    """Each run's fastest of `repeats`, the runs taken in turn (raw, transport, raw, ...), so
    that a load that comes and goes on a shared machine weighs on all of them alike."""
    results = [[run() for run in runs] for _ in range(repeats)]
    return [min(result[i] for result in results) for i in range(len(runs))]


def message_count(comm: Any, nbytes: int, seconds: float, megabytes: float) -> int:
    """Messages of `nbytes` for one raw stream of about `seconds`: 8 raw messages time the link
    first. Rank 0 decides, so both ranks stream the same count."""
    probe = raw_stream(comm, nbytes, 8, WINDOW + 1) / 8
    count = min(seconds / max(probe, 1e-9), megabytes * (1 << 20) / nbytes)
    return int(comm.bcast(max(8, int(count)), root=0))


def measure(args: argparse.Namespace) -> None:
    """The two ranks' part: each size through the raw stream and through the transport."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert comm.size == 2, "run with exactly 2 ranks"
    hosts = comm.gather(MPI.Get_processor_name(), root=0)
    figures: dict[str, Any] = {}
    rows = []
    for label, nbytes in SIZES.items():
        count = message_count(comm, nbytes, args.seconds, args.megabytes)
        weights, batch = {"weights": np.ones(nbytes // 4, np.float32)}, batch_of(nbytes)
        (raw, _), (hot, _), (w, w_credits), (b, b_credits) = best_interleaved(
            args.repeats,
            [
                partial(raw_run, comm, nbytes, count, WINDOW + 1),
                partial(raw_run, comm, nbytes, count, 1),
                partial(transport_stream, comm, weights, count),
                partial(transport_stream, comm, batch, count),
            ],
        )
        gb = nbytes * count / 1e9
        rows.append((label, count, gb / hot, gb / raw, gb / w, gb / b, raw / w, raw / b))
        figures[f"weights_{label}_ratio"] = round(raw / w, 3)
        figures[f"batch_{label}_ratio"] = round(raw / b, 3)
        figures[f"weights_{label}_vs_hot_buffer"] = round(hot / w, 3)
        figures[f"raw_{label}_GBps"] = round(gb / raw, 3)
        figures[f"raw_hot_{label}_GBps"] = round(gb / hot, 3)
        figures[f"raw_{label}_us_per_message"] = round(raw / count * 1e6, 1)
        figures[f"credits_per_message_{label}"] = round((w_credits + b_credits) / (2 * count), 3)
    if comm.rank == 0:
        assert hosts is not None
        figures["ran_on"] = sorted(set(hosts))
        print(f"ranks on {', '.join(hosts)}")
        print(
            f"{'size':>6} {'msgs':>6} {'hot GB/s':>9} {'raw GB/s':>9} {'weights':>8} "
            f"{'batch':>8} {'w ratio':>8} {'b ratio':>8}"
        )
        for label, count, h, r, w, b, wr, br in rows:
            print(f"{label:>6} {count:>6} {h:9.2f} {r:9.2f} {w:8.2f} {b:8.2f} {wr:8.3f} {br:8.3f}")
        print(json.dumps(figures), flush=True)


def across_hosts(args: argparse.Namespace) -> None:
    """Drive the measurement twice through tools/mpirun.sh: both ranks on the first host, then
    one rank on each of `--hosts` hosts (only the first two take part), and print both."""
    runs: dict[str, dict[str, Any]] = {}
    for name, hosts in (("one_host", 1), ("hosts", args.hosts)):
        command = [
            "bash", str(ROOT / "tools" / "mpirun.sh"), "--hosts", str(hosts), "-n", "2",
            "--map-by", "node" if hosts > 1 else "slot",
            sys.executable, __file__, "--seconds", str(args.seconds),
            "--megabytes", str(args.megabytes), "--repeats", str(args.repeats),
            "--window", str(args.window), "--credit-batch", str(args.credit_batch),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        print(f"== {name}: {' '.join(command[2:6])}\n{done.stdout}{done.stderr}", flush=True)
        if done.returncode != 0:
            sys.exit(f"bench_transport: the {name} run failed (exit {done.returncode})")
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    figures: dict[str, Any] = {}
    print(f"{'figure':<22} {'one host':>9} {f'{args.hosts} hosts':>9}")
    for key in runs["one_host"]:
        if key.endswith(("_ratio", "_GBps", "_message")) or key.startswith("credits_"):
            print(f"{key:<22} {runs['one_host'][key]:>9} {runs['hosts'][key]:>9}")
        figures[f"one_host_{key}"] = runs["one_host"][key]
        figures[f"hosts_{key}"] = runs["hosts"][key]
    overhead = 1 / runs["hosts"]["weights_64KB_ratio"]
    print(f"hpcmarl's time per 64 KB weight message across hosts: {overhead:.2f}x raw MPI's")
    figures["hosts_64KB_overhead_vs_raw"] = round(overhead, 3)
    print(json.dumps(figures), flush=True)


def main() -> None:
    global WINDOW, CREDIT_BATCH
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--seconds", type=float, default=0.5, help="about how long one raw stream takes, per size"
    )
    parser.add_argument(
        "--megabytes", type=float, default=256.0, help="at most this many MB per stream"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--window", type=int, default=WINDOW, help="messages unacknowledged (raw: buffers - 1)"
    )
    parser.add_argument(
        "--credit-batch",
        type=int,
        default=CREDIT_BATCH,
        help="credits per credit message (0: window // 2; 1: one per message, as before)",
    )
    parser.add_argument(
        "--hosts", type=int, default=0, help="run on one host and across this many local hosts"
    )
    args = parser.parse_args()
    WINDOW, CREDIT_BATCH = max(1, args.window), max(0, args.credit_batch)
    if args.hosts and not launched_by_mpi():
        across_hosts(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
