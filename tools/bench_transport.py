"""Weights and batch transfer through hpcmarl's transport vs a raw MPI Send of the same bytes.

Run under two ranks: `tools/mpirun.sh -n 2 .venv/bin/python tools/bench_transport.py`.
Rank 0 streams N messages to rank 1. The raw baseline is a blocking `Send`/`Recv` of one
buffer per message and one acknowledgement after the last. The transport runs the flow the
roles use: at most WINDOW messages unacknowledged, each acknowledged by a credit message, received
buffers recycled; it carries (a) one weight vector, (b) a batch dict of several columns of the
same total size. Prints a table and, last, one JSON line with `*_ratio` = raw time / hpcmarl time.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport

WINDOW = 4
SIZES = {"64KB": 64 << 10, "1MB": 1 << 20, "16MB": 16 << 20}


def batch_of(nbytes: int) -> dict[str, np.ndarray]:
    """A batch shaped like a transition batch: two big observation columns, small extras."""
    rows = max(1, nbytes // (2 * 64 * 4 + 8 + 4 + 2 + 8))
    return {
        "observations": np.ones((rows, 64), np.float32),
        "next_observations": np.ones((rows, 64), np.float32),
        "actions": np.zeros(rows, np.int64),
        "rewards": np.zeros(rows, np.float32),
        "terminations": np.zeros(rows, np.bool_),
        "truncations": np.zeros(rows, np.bool_),
        "policy_version": np.zeros(rows, np.int64),
    }


def raw_stream(comm: MPI.Comm, nbytes: int, count: int) -> float:
    buf = np.ones(nbytes, np.uint8)
    ack = np.zeros(1, np.int64)
    comm.Barrier()
    start = time.perf_counter()
    if comm.rank == 0:
        for _ in range(count):
            comm.Send(buf, 1, 5)
        comm.Recv(ack, 1, 6)
    else:
        for _ in range(count):
            comm.Recv(buf, 0, 5)
        comm.Send(ack, 0, 6)
    return time.perf_counter() - start


def transport_stream(comm: MPI.Comm, arrays: dict[str, np.ndarray], count: int) -> float:
    """Stream with the credit flow the roles use: at most WINDOW messages unacknowledged."""
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
        received = 0
        while received < count:
            transport.poll()
            while inbox:
                transport.recycle(inbox.popleft().arrays)
                transport.send(Message("credit", "b", "a", {"n": 1}))
                received += 1
    elapsed = time.perf_counter() - start
    transport.finish(30)
    return elapsed


def best_of(repeats: int, fn, *args) -> float:
    return min(fn(*args) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--megabytes", type=float, default=256.0, help="bytes streamed per measurement, in MB"
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    assert comm.size == 2, "run with exactly 2 ranks"
    figures: dict[str, float] = {}
    rows = []
    for label, nbytes in SIZES.items():
        count = max(4, int(args.megabytes * (1 << 20) / nbytes))
        raw = best_of(args.repeats, raw_stream, comm, nbytes, count)
        weights = {"weights": np.ones(nbytes // 4, np.float32)}
        w = best_of(args.repeats, transport_stream, comm, weights, count)
        b = best_of(args.repeats, transport_stream, comm, batch_of(nbytes), count)
        gbps = nbytes * count / 1e9
        rows.append((label, count, gbps / raw, gbps / w, gbps / b, raw / w, raw / b))
        figures[f"weights_{label}_ratio"] = round(raw / w, 3)
        figures[f"batch_{label}_ratio"] = round(raw / b, 3)
        figures[f"raw_{label}_GBps"] = round(gbps / raw, 3)
    if comm.rank == 0:
        print(
            f"{'size':>6} {'msgs':>6} {'raw GB/s':>9} {'weights':>8} {'batch':>8} "
            f"{'w ratio':>8} {'b ratio':>8}"
        )
        for label, count, r, w, b, wr, br in rows:
            print(f"{label:>6} {count:>6} {r:9.2f} {w:8.2f} {b:8.2f} {wr:8.3f} {br:8.3f}")
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
