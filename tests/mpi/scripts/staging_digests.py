"""Rank 0 streams 100 messages each of 16 B, 64 KiB and 8 MiB to rank 1, refilling its staging
area right after each send, the way collectors build fragments; rank 1, which starts late,
checks every message's bytes against its own copy of what was sent.

A buffer handed to Isend must not change before the send completes (FACTS: an 8 MiB message
arrived modified when its buffer was refilled early). Producers get a fresh packed buffer per
message, so refilling the staging area never touches a buffer still in flight; the transport
copies a 64 KiB message into a frame of its own, which it fills again only after that frame's
send completed.
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
SIZES = (16, 64 << 10, 8 << 20)


def staging(nbytes: int):
    return allocate_packed([("payload", "|u1", (nbytes,))])


def payload(nbytes: int, i: int) -> np.ndarray:
    """Message i's bytes, which the receiver makes again to check what came: a digest sent
    inside the message would travel in the same frame and go stale with it."""
    return np.random.default_rng([nbytes, i]).integers(0, 256, nbytes, dtype=np.uint8)


def main() -> int:
    comm = MPI.COMM_WORLD
    transport = MpiTransport({"a": 0, "b": 1}, comm)
    inbox = transport.register("a" if comm.rank == 0 else "b")
    ok = True
    if comm.rank == 0:
        for nbytes in SIZES:
            area = staging(nbytes)
            for i in range(COUNT):
                area["payload"][...] = payload(nbytes, i)
                transport.send(Message("batch", "a", "b", {"i": i, "nbytes": nbytes}, area))
                area = staging(nbytes)  # refill at once: the next message's staging area
                area["payload"][...] = 0
                transport.poll()
    else:
        time.sleep(0.5)  # let rank 0 run ahead: its sends stay in flight for a while
        received, deadline = 0, time.monotonic() + 120
        while received < COUNT * len(SIZES) and time.monotonic() < deadline:
            transport.poll()
            while inbox:
                msg = inbox.popleft()
                nbytes, i = SIZES[received // COUNT], received % COUNT
                ok &= (msg.meta["nbytes"], msg.meta["i"]) == (nbytes, i)
                expected = hashlib.sha256(payload(nbytes, i).tobytes()).digest()
                ok &= hashlib.sha256(msg.arrays["payload"].tobytes()).digest() == expected
                received += 1
        ok &= received == COUNT * len(SIZES)
    ok &= transport.finish(60) and transport.outstanding() == 0
    print(f"rank {comm.rank}: {'ok' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
