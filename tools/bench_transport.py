"""Weights and batch transfer through hpcmarl's transport vs a raw MPI Send of the same bytes.

Run under two ranks: `tools/mpirun.sh -n 2 .venv/bin/python tools/bench_transport.py`.
Rank 0 streams N messages to rank 1. The transport runs the flow the roles use: at most WINDOW
messages unacknowledged, each acknowledged by a credit message, received buffers recycled. It
carries (a) one weight vector, (b) a transition batch packed as collectors build it.

The raw baseline is a blocking `Send`/`Recv` of the same bytes cycling through WINDOW + 1
distinct buffers on each side, as the transport's stream does (a pipelined stream cannot land
every message in one buffer). `*_ratio` = raw time / hpcmarl time. For reference the table also
shows a raw stream through one cache-hot buffer (`raw_hot_*`, `*_vs_hot_buffer`), a rate real
runs never see, since every weight push and every fragment is fresh memory.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.packing import allocate_packed
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport

WINDOW = 4
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


def raw_stream(comm: MPI.Comm, nbytes: int, count: int, nbuf: int) -> float:
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
        raw = best_of(args.repeats, raw_stream, comm, nbytes, count, WINDOW + 1)
        hot = best_of(args.repeats, raw_stream, comm, nbytes, count, 1)
        weights = {"weights": np.ones(nbytes // 4, np.float32)}
        w = best_of(args.repeats, transport_stream, comm, weights, count)
        b = best_of(args.repeats, transport_stream, comm, batch_of(nbytes), count)
        gb = nbytes * count / 1e9
        rows.append((label, count, gb / hot, gb / raw, gb / w, gb / b, raw / w, raw / b))
        figures[f"weights_{label}_ratio"] = round(raw / w, 3)
        figures[f"batch_{label}_ratio"] = round(raw / b, 3)
        figures[f"weights_{label}_vs_hot_buffer"] = round(hot / w, 3)
        figures[f"raw_{label}_GBps"] = round(gb / raw, 3)
        figures[f"raw_hot_{label}_GBps"] = round(gb / hot, 3)
    if comm.rank == 0:
        print(
            f"{'size':>6} {'msgs':>6} {'hot GB/s':>9} {'raw GB/s':>9} {'weights':>8} "
            f"{'batch':>8} {'w ratio':>8} {'b ratio':>8}"
        )
        for label, count, h, r, w, b, wr, br in rows:
            print(f"{label:>6} {count:>6} {h:9.2f} {r:9.2f} {w:8.2f} {b:8.2f} {wr:8.3f} {br:8.3f}")
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
