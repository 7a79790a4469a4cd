"""A world that loses a rank and spawns its replacement (comm/respawn.py), for the fault tests
and for timing a respawn: `tools/mpirun.sh -n N --with-ft ulfm python -m
hpcmarl.testing.respawn_world [--lose R[,R...]]`.

Each rank R named kills itself once every rank's transport is up. The survivors, having heard
of every loss through their transports, each send every other survivor a small and a large
message (the large one cannot complete until it is received), then shrink, spawn one
replacement for each rank lost and merge with them, and rebind their transports to the merged
world. Each replacement hosts a lost rank's role under its old name (with `--replace K`, only
the first K lost are replaced, and messages to the others' roles are dropped). Then every rank sends
every other one messages on the new world, and each checks that it received exactly what it
should: the messages sent before the respawn (on the old world) and after it. Each survivor
prints what the respawn took; the first survivor also prints the time from the losses being
heard to the last replacement's first message, and one JSON line of both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any

import numpy as np

from hpcmarl.comm.doorbell import make_doorbell
from hpcmarl.comm.failures import die_seen, exit_now
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.respawn import Respawned, join_parents, release, respawn
from hpcmarl.comm.transport import GONE, INLINE_LIMIT, MpiTransport

LARGE = INLINE_LIMIT + 4096
"""Bytes of the large messages: above a frame's inline limit, so they follow it on the bulk tag."""
WAIT_S = 30.0


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
    peers = [name for name in rank_of if name != me]
    send_all(transport, me, peers, "after")  # those to a role not replaced are dropped
    live = [name for name in peers if rank_of[name] != GONE]
    receive(transport, inbox, expected_from(live, "after"))
    finish(transport, world, 0, finalize=True)


def finish(transport: MpiTransport, world: Respawned, code: int, finalize: bool = False) -> None:
    if not transport.finish(WAIT_S):
        print(f"{transport.rank}: the closing agreement timed out", file=sys.stderr)
        code = 1
    release(world)
    if finalize and code == 0:
        return  # through MPI_Finalize: a replacement never shared a world with the dead rank
    exit_now(code)  # MPI_Finalize hangs once a rank of the world is gone


def survivor(lose: list[int], replace: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    rank_of = {role(r): r for r in range(size)}
    transport = MpiTransport(rank_of, comm, make_doorbell(comm, 0.05))
    me = role(rank)
    inbox = transport.register(me)
    comm.Barrier()
    if rank in lose:
        die_seen()
    heard_by = time.monotonic() + WAIT_S
    while not set(lose) <= transport.failures.known:  # type: ignore[union-attr]
        if time.monotonic() > heard_by:
            raise SystemExit(f"{rank}: never heard of the loss of ranks {lose}")
        transport.poll()
        time.sleep(1e-3)
    heard = time.monotonic()
    others = [role(r) for r in range(size) if r != rank and r not in lose]
    send_all(transport, me, others, "before")  # on the old world, not yet received
    args = ["-m", "hpcmarl.testing.respawn_world", "--replacement"]
    world = respawn(comm, replace, args)
    new_rank_of = {name: world.new_rank.get(r, GONE) for name, r in rank_of.items()}
    new_rank_of.update({role(r): new for r, new in zip(lose, world.spawned, strict=False)})
    world.comm.bcast(new_rank_of, root=0)
    transport.rebind(world.comm, new_rank_of, world.new_rank)
    reborn, gone = [role(r) for r in lose[:replace]], [role(r) for r in lose[replace:]]
    dropped = transport.dropped
    send_all(transport, me, [*others, *reborn, *gone], "after")
    if transport.dropped != dropped + 2 * len(gone):
        raise SystemExit(f"{rank}: messages to {gone}, not replaced, were not dropped")
    expected = expected_from(others, "before") | expected_from([*others, *reborn], "after")
    first = receive(transport, inbox, expected)
    print(f"rank {rank} -> {transport.rank}: shrink, spawn and merge took {world.seconds:.2f} s")
    if rank == min(set(range(size)) - set(lose)):  # the first survivor
        to_first = max(first[name] for name in reborn) - heard
        print(f"every replacement's first message {to_first:.2f} s after the loss was heard")
        print(json.dumps({"respawn_s": round(world.seconds, 3), "to_first_s": round(to_first, 3)}))
    finish(transport, world, 0)


def main() -> None:
    try:
        run()
    except BaseException:  # noqa: BLE001 - MPI_Finalize would hang: say why, then leave
        traceback.print_exc()
        exit_now(1)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lose", default="2", help="the ranks that kill themselves: R[,R...]")
    parser.add_argument("--replace", type=int, help="how many to replace (default: every one)")
    parser.add_argument("--replacement", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replacement:
        replacement()
    else:
        lose = sorted({int(r) for r in args.lose.split(",")})
        survivor(lose, len(lose) if args.replace is None else args.replace)


if __name__ == "__main__":
    main()
