"""Rank 0 is a slow consumer; every other rank streams COUNT 64 KiB messages to it with at most
WINDOW unacknowledged, and rank 0 returns their credits in batches (comm/credits.py).

Rank 0 takes one message only every SLOW-th pass of its loop (a count of passes, not a time),
so producers outrun it. Batched credits must still hold each producer to WINDOW messages in
flight: rank 0 checks on every pass that no credit went back before its message was taken,
and that no producer ever had more than WINDOW of its messages waiting here, untaken or
uncredited (nothing buffers without bound). Every message must arrive whole and in order, and
every credit must come back. Prints "rank R: ok".
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.credits import CreditReturn
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import MpiTransport

COUNT = 60
WINDOW = 4
SLOW = 25
DEADLINE_S = 120.0


def produce(transport: MpiTransport, inbox, me: str) -> bool:
    """Stream COUNT messages as fast as the credits allow; True when every credit came back."""
    sent, returned = 0, 0
    deadline = time.monotonic() + DEADLINE_S
    while (sent < COUNT or returned < sent) and time.monotonic() < deadline:
        while sent - returned < WINDOW and sent < COUNT:
            payload = np.full(16_384, sent, np.float32)  # 64 KiB, fresh per message
            transport.send(Message("batch", me, "r0", {"i": sent}, {"x": payload}))
            sent += 1
        if not transport.poll() and not inbox:
            time.sleep(2e-4)  # out of credit: leave the cores to the consumer
        while inbox:
            returned += inbox.popleft().meta["n"]
    return sent == returned == COUNT


def consume(transport: MpiTransport, inbox, producers: list[str]) -> bool:
    """Take one message every SLOW passes; True when no producer ever had more than WINDOW
    messages here without their credit, and every message arrived whole and in order."""
    arrived, credited, taken = (dict.fromkeys(producers, 0) for _ in range(3))

    def send_credit(peer: str, meta: dict) -> None:
        credited[peer] += meta["n"]
        transport.send(Message("credit", "r0", peer, meta))

    returns = CreditReturn(send_credit, WINDOW // 2)
    ok, passes = True, 0
    deadline = time.monotonic() + DEADLINE_S
    while sum(taken.values()) < COUNT * len(producers) and time.monotonic() < deadline:
        passes += 1
        waiting = len(inbox)
        transport.poll()
        for msg in list(inbox)[waiting:]:
            arrived[msg.src] += 1
        for p in producers:  # no credit before its message; never more than WINDOW here
            ok &= credited[p] <= taken[p] and arrived[p] - credited[p] <= WINDOW
        if passes % SLOW or not inbox:
            returns.flush()  # a pass that took nothing
            continue
        msg = inbox.popleft()
        assert msg.arrays is not None
        i = taken[msg.src]
        ok &= msg.meta["i"] == i and bool(np.all(msg.arrays["x"] == i))
        taken[msg.src] += 1
        returns.owe(msg.src)
    returns.flush()
    return ok and all(n == COUNT for n in taken.values()) and credited == taken


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    transport = MpiTransport({f"r{i}": i for i in range(size)}, comm)
    inbox = transport.register(f"r{rank}")
    comm.Barrier()
    if rank == 0:
        ok = consume(transport, inbox, [f"r{i}" for i in range(1, size)])
    else:
        ok = produce(transport, inbox, f"r{rank}")
    ok &= transport.finish(30)
    print(f"rank {rank}: {'ok' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
