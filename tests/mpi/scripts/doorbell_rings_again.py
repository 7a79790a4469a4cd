"""Rank 0 sends rank 1 a frame above MPI's eager size while rank 1 stays idle for 0.5 s without
matching it; rank 0 keeps polling. Rank 1 must hear more than the one ring made when the frame
was posted: a frame like that completes only once matched, so nothing else would tell a rank
that woke before the frame's envelope came and went back to wait. Then rank 1 receives it.
Prints "rank R: ok" per rank."""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.doorbell import make_doorbell
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport

IDLE_S = 0.5


def pending_rings(sock: object) -> int:
    """Consume and count the rings waiting on a bell's socket."""
    count = 0
    with contextlib.suppress(BlockingIOError):
        while sock.recv(64):  # type: ignore[attr-defined]
            count += 1
    return count


def main() -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    doorbell = make_doorbell(comm, 60.0)
    assert doorbell is not None, "Linux, one host: every rank has a bell"
    transport = MpiTransport({"r0": 0, "r1": 1}, comm, doorbell)
    inbox = transport.register(f"r{rank}")
    weights = np.arange(50_000, dtype=np.float32)
    comm.Barrier()
    doorbell.drain()
    ok, rings = True, 0
    if rank == 0:
        transport.send(Message("weights", "r0", "r1", {}, {"w": weights}))
        deadline = time.monotonic() + IDLE_S
        while time.monotonic() < deadline:
            transport.poll()
            time.sleep(1e-4)
    else:
        time.sleep(IDLE_S)  # idle: neither polling MPI nor reading its bell
        rings = pending_rings(doorbell.sock)
        ok &= rings >= 3
        deadline = time.monotonic() + 30
        while not inbox and time.monotonic() < deadline:
            transport.poll()
        ok &= bool(inbox) and np.array_equal(inbox.popleft().arrays["w"], weights)
    ok &= transport.finish(30)
    print(f"rank {rank}: {'ok' if ok else 'FAILED'} ({rings} rings)", flush=True)
    doorbell.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
