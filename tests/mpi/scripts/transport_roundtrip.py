"""Rank 0 sends bulk and control messages to every other rank, which echo them back.

Checks byte equality for many dtypes and shapes (empty, scalar-like, chunked), arrays inside
their frame and after it, headers short and long, per-source order, and that no request is
outstanding at the end. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.packing import allocate_packed
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport


def payloads(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return [
        {"weights": rng.standard_normal(100_000).astype(np.float32)},
        {
            "observations": rng.standard_normal((64, 4)).astype(np.float32),
            "actions": rng.integers(0, 5, 64),
            "terminations": rng.random(64) > 0.5,
            "agent_id": np.arange(64, dtype=np.int16),
        },
        {"empty": np.zeros((0, 3), np.float64), "one": np.array([7], np.uint8)},
        {"big": rng.integers(0, 255, 3_000_001, dtype=np.uint8)},
        packed_batch(rng),
    ]


PADS = (0, 5_000, 0, 5_000, 3_000)
"""Bytes of padding in each payload's meta: headers past a small frame take the transport's
other receive path, and must keep their place in the order."""


def packed_batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Columns filled in place in one packed buffer, as collectors build fragments."""
    columns = allocate_packed([("observations", "<f4", (3, 50_000)), ("step", "<i4", (3,))])
    columns["observations"][...] = rng.standard_normal((3, 50_000))
    columns["step"][...] = [1, 2, 3]
    return columns


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    names = {f"r{i}": i for i in range(size)}
    transport = MpiTransport(names, comm)
    inbox = transport.register(f"r{rank}")
    rng = np.random.default_rng(0)
    sent = payloads(rng)
    expected = (size - 1) * len(sent) if rank == 0 else len(sent)
    if rank == 0:
        for dst in range(1, size):
            for i, arrays in enumerate(sent):
                pad = "x" * PADS[i]  # a header longer than a small frame, for some
                transport.send(Message("batch", "r0", f"r{dst}", {"i": i, "pad": pad}, arrays))
                transport.send(Message("credit", "r0", f"r{dst}", {"n": i, "pad": pad}))
    got, deadline = [], time.monotonic() + 60
    while len(got) < 2 * expected and time.monotonic() < deadline:
        transport.poll()
        while inbox:
            msg = inbox.popleft()
            got.append(msg)
            if rank != 0 and msg.arrays is not None:
                transport.send(Message("sample", msg.dst, msg.src, msg.meta, msg.arrays))
            elif rank != 0:
                transport.send(Message("not_newer", msg.dst, msg.src, msg.meta))
    ok = len(got) == 2 * expected
    position: dict[str, int] = {}
    for msg in got:
        j = position[msg.src] = position.get(msg.src, -1) + 1
        i = msg.meta["i"] if "i" in msg.meta else msg.meta["n"]
        ok &= i == j // 2  # per-source order: bulk i, then control i
        if msg.arrays is not None:
            for name, array in sent[i].items():
                ok &= array.dtype == msg.arrays[name].dtype
                ok &= array.shape == msg.arrays[name].shape
                ok &= array.tobytes() == msg.arrays[name].tobytes()
    finished = transport.finish(30)
    ok &= finished and transport.outstanding() == 0
    print(f"rank {rank}: {'ok' if ok else 'MISMATCH'} ({len(got)} messages)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
