"""Rank 0 streams 100 messages of 16 B and 100 of 8 MiB to rank 1, refilling its staging area
right after each send, the way collectors build fragments; rank 1 checks every digest.

A buffer handed to Isend must not change before the send completes (FACTS: an 8 MiB message
arrived modified when its buffer was refilled early). Producers get a fresh packed buffer per
message, so refilling the staging area never touches a buffer still in flight.
"""

from __future__ import annotations

import hashlib
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.packing import allocate_packed
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport

COUNT = 100
SIZES = (16, 8 << 20)


def staging(nbytes: int):
    return allocate_packed([("payload", "|u1", (nbytes,))])


def main() -> int:
    comm = MPI.COMM_WORLD
    transport = MpiTransport({"a": 0, "b": 1}, comm)
    inbox = transport.register("a" if comm.rank == 0 else "b")
    rng = np.random.default_rng(comm.rank)
    ok = True
    if comm.rank == 0:
        for nbytes in SIZES:
            area = staging(nbytes)
            for i in range(COUNT):
                area["payload"][...] = rng.integers(0, 256, nbytes, dtype=np.uint8)
                digest = hashlib.sha256(area["payload"].tobytes()).hexdigest()
                transport.send(Message("batch", "a", "b", {"i": i, "sha": digest}, area))
                area = staging(nbytes)  # refill at once: the next message's staging area
                area["payload"][...] = 0
                transport.poll()
    else:
        received, deadline = 0, time.monotonic() + 120
        while received < COUNT * len(SIZES) and time.monotonic() < deadline:
            transport.poll()
            while inbox:
                msg = inbox.popleft()
                digest = hashlib.sha256(msg.arrays["payload"].tobytes()).hexdigest()
                ok &= digest == msg.meta["sha"]
                received += 1
        ok &= received == COUNT * len(SIZES)
    ok &= transport.finish(60) and transport.outstanding() == 0
    print(f"rank {comm.rank}: {'ok' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
