"""A world that loses a rank and spawns its replacement (comm/respawn.py), for the fault tests
and for timing a respawn: `tools/mpirun.sh -n N --with-ft ulfm python -m
hpcmarl.testing.respawn_world [--lose R]`.

Rank R kills itself once every rank's transport is up. The survivors, having heard of it
through their transports, each send every other survivor a small and a large message (the
large one cannot complete until it is received), then shrink, spawn one replacement of R
and merge with it, and rebind their transports to the merged world. The replacement hosts R's
role under its old name. Then each survivor sends every other peer, the replacement included,
messages on the new world, and every rank checks that it received exactly what it should:
the messages sent before the respawn (on the old world) and after it. Each survivor prints
what the respawn took; the first survivor also prints the time from the loss being heard to
the replacement's first message, and one JSON line of both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from hpcmarl.comm.doorbell import make_doorbell
from hpcmarl.comm.failures import die_seen, exit_now
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.respawn import Respawned, join_parents, release, respawn
from hpcmarl.comm.transport import GONE, INLINE_LIMIT, MpiTransport

LARGE = INLINE_LIMIT + 4096
"""Bytes of the large messages: above a frame's inline limit, so they follow it on the bulk tag."""
WAIT_S = 60.0


def role(rank: int) -> str:
    return f"r{rank}"


def payload(sender: str, size: int) -> dict[str, np.ndarray]:
    """Bytes that say who sent them, so a message misrouted by a wrong rank map shows."""
    return {"x": np.full(size, int(sender[1:]) + 1, np.uint8)}


def send_all(transport: MpiTransport, me: str, peers: list[str], when: str) -> None:
    for peer in peers:
        transport.send(Message(f"{when}-small", me, peer, {}, payload(me, 16)))
        transport.send(Message(f"{when}-large", me, peer, {}, payload(me, LARGE)))


def receive(
    transport: MpiTransport, inbox: Any, expected: set[tuple[str, str]]
) -> dict[str, float]:
    """Poll until the (kind, sender) pairs of `expected` came, checking each; when each
    sender's first message came."""
    first: dict[str, float] = {}
    deadline = time.monotonic() + WAIT_S
    while expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"{transport.rank}: still waiting for {sorted(expected)}")
        transport.poll()
        while inbox:
            msg = inbox.popleft()
            key = (msg.kind, msg.src)
            if key not in expected:
                raise SystemExit(f"{transport.rank}: unexpected {key}")
            size = LARGE if msg.kind.endswith("large") else 16
            if not np.array_equal(msg.arrays["x"], payload(msg.src, size)["x"]):
                raise SystemExit(f"{transport.rank}: wrong bytes in {key}")
            expected.discard(key)
            first.setdefault(msg.src, time.monotonic())
        time.sleep(1e-4)
    return first


def expected_from(peers: list[str], when: str) -> set[tuple[str, str]]:
    return {(f"{when}-{size}", peer) for peer in peers for size in ("small", "large")}


def replacement() -> None:
    """The spawned rank: merge, learn the roles' ranks, greet every survivor, hear back."""
    world = join_parents()
    assert world is not None
    rank_of: dict[str, int] = world.comm.bcast(None, root=0)
    me = next(name for name, rank in rank_of.items() if rank == world.comm.Get_rank())
    transport = MpiTransport(rank_of, world.comm)
    inbox = transport.register(me)
    survivors = [name for name, rank in rank_of.items() if rank not in (GONE, *world.spawned)]
    send_all(transport, me, survivors, "after")
    receive(transport, inbox, expected_from(survivors, "after"))
    finish(transport, world, 0, finalize=True)


def finish(transport: MpiTransport, world: Respawned, code: int, finalize: bool = False) -> None:
    if not transport.finish(WAIT_S):
        print(f"{transport.rank}: the closing agreement timed out", file=sys.stderr)
        code = 1
    release(world)
    if finalize:
        sys.exit(code)
    exit_now(code)  # MPI_Finalize hangs once a rank of the world is gone


def survivor(lose: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    rank_of = {role(r): r for r in range(size)}
    transport = MpiTransport(rank_of, comm, make_doorbell(comm, 0.05))
    me = role(rank)
    inbox = transport.register(me)
    comm.Barrier()
    if rank == lose:
        die_seen()
    heard_by = time.monotonic() + WAIT_S
    while lose not in transport.failures.known:  # type: ignore[union-attr]
        if time.monotonic() > heard_by:
            raise SystemExit(f"{rank}: never heard of rank {lose}'s loss")
        transport.poll()
        time.sleep(1e-3)
    heard = time.monotonic()
    others = [role(r) for r in range(size) if r not in (rank, lose)]
    send_all(transport, me, others, "before")  # on the old world, not yet received
    args = ["-m", "hpcmarl.testing.respawn_world", "--replacement"]
    world = respawn(comm, 1, args)
    new_rank_of = {name: world.new_rank.get(r, GONE) for name, r in rank_of.items()}
    new_rank_of[role(lose)] = world.spawned[0]
    world.comm.bcast(new_rank_of, root=0)
    transport.rebind(world.comm, new_rank_of, world.new_rank)
    send_all(transport, me, [*others, role(lose)], "after")
    expected = expected_from(others, "before") | expected_from([*others, role(lose)], "after")
    first = receive(transport, inbox, expected)
    print(f"rank {rank} -> {transport.rank}: shrink, spawn and merge took {world.seconds:.2f} s")
    if rank == (1 if lose == 0 else 0):  # the first survivor
        to_first = first[role(lose)] - heard
        print(f"replacement's first message {to_first:.2f} s after the loss was heard")
        print(json.dumps({"respawn_s": round(world.seconds, 3), "to_first_s": round(to_first, 3)}))
    finish(transport, world, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lose", type=int, default=2, help="the rank that kills itself")
    parser.add_argument("--replacement", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replacement:
        replacement()
    else:
        survivor(args.lose)


if __name__ == "__main__":
    main()
