"""Ranks 1.. idle in the rank loop's backoff, allowed to wait a minute for a ring; rank 0 sends
each a control and a bulk message after a moment. Each must wake on the ring (not the minute's
timeout), receive both, and echo them back. Prints "rank R: ok" per rank. Runs on one host and
across hosts (tests/multihost/test_cluster_tools.py), where the bells are UDP sockets."""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.doorbell import make_doorbell
from hpcmarl.comm.progress import Backoff
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport

WAIT_S = 60.0


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    doorbell = make_doorbell(comm, WAIT_S)
    assert doorbell is not None, "Linux, one host or hosts that resolve: every rank has a bell"
    transport = MpiTransport({f"r{i}": i for i in range(size)}, comm, doorbell)
    inbox = transport.register(f"r{rank}")
    backoff = Backoff(doorbell=doorbell, wait_s=WAIT_S)
    expected = 2 * (size - 1) if rank == 0 else 2
    if rank == 0:
        time.sleep(0.5)  # the others are waiting by now
        for dst in range(1, size):
            transport.send(Message("credit", "r0", f"r{dst}", {"n": 1}))
            weights = np.arange(50_000, dtype=np.float32)
            transport.send(Message("weights", "r0", f"r{dst}", {}, {"w": weights}))
    got, start = [], time.monotonic()
    while len(got) < expected and time.monotonic() - start < 3 * WAIT_S:
        progressed = transport.poll()
        while inbox:
            msg = inbox.popleft()
            got.append(msg)
            if rank != 0:
                transport.send(Message(msg.kind, msg.dst, msg.src, msg.meta, msg.arrays))
            progressed = True
        if progressed:
            backoff.reset()
        else:
            backoff.sleep(may_wait=transport.outstanding() == 0)
    elapsed = time.monotonic() - start
    # Rank 0 sends first and may find every echo while it still polls closely, never waiting:
    # only the ranks that wait for its messages must have been woken.
    ok = len(got) == expected and elapsed < WAIT_S / 2 and (rank == 0 or doorbell.wakeups >= 1)
    ok &= transport.finish(30)
    print(
        f"rank {rank}: {'ok' if ok else 'FAILED'} ({len(got)} messages, {elapsed:.2f} s, "
        f"{doorbell.wakeups} wake-ups)",
        flush=True,
    )
    doorbell.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
