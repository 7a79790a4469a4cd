"""A world that loses ranks and spawns their replacements (comm/respawn.py), for the fault
tests and for timing a respawn: `tools/mpirun.sh -n N --with-ft ulfm python -m
hpcmarl.testing.respawn_world [--lose R[,R...][/R...]] [--replace K]`.

Roles r0, r1, ... start on ranks 0, 1, .... In each round (split by /) the ranks hosting the
roles named kill themselves. The others, having heard of every loss through their transports,
each send every other live rank a small and a large message (the large one cannot complete
until it is received), then shrink, spawn a replacement for each rank lost (at most K a round)
and merge with them, and rebind their transports to the merged world. Each replacement hosts a
lost role under its old name (messages to a role not replaced are dropped) and takes part in
the later rounds like any survivor. Then every rank sends every other one messages on the new
world, and each checks that it received exactly what it should: the messages sent before the
respawn (on the old world) and after it. Each survivor prints what the respawn took; rank 0 of
the merged world also prints the time from the losses being heard to the last replacement's
first message, and one JSON line of the round's figures.
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
    sender's first message came. A message of a later round (a peer already there) is put
    back for that round; one of an earlier round is an error."""
    first: dict[str, float] = {}
    later: list[Message] = []
    deadline = time.monotonic() + WAIT_S
    while expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"{transport.rank}: still waiting for {sorted(expected)}")
        transport.poll()
        while inbox:
            msg = inbox.popleft()
            key = (msg.kind, msg.src)
            if key not in expected:
                if round_of(msg.kind) <= max(round_of(kind) for kind, _ in expected):
                    raise SystemExit(f"{transport.rank}: unexpected {key}")
                later.append(msg)
                continue
            size = LARGE if msg.kind.endswith("large") else 16
            if not np.array_equal(msg.arrays["x"], payload(msg.src, size)["x"]):
                raise SystemExit(f"{transport.rank}: wrong bytes in {key}")
            expected.discard(key)
            first.setdefault(msg.src, time.monotonic())
        time.sleep(1e-4)
    inbox.extendleft(reversed(later))
    return first


def round_of(kind: str) -> int:
    """The round a message kind belongs to: `before1-large` -> 1."""
    return int(kind.split("-")[0].lstrip("abefort"))


def expected_from(peers: list[str], when: str) -> set[tuple[str, str]]:
    return {(f"{when}-{size}", peer) for peer in peers for size in ("small", "large")}


class Member:
    """One process of the world: its role, transport, the worlds it merged into, the rounds."""

    def __init__(
        self,
        transport: MpiTransport,
        me: str,
        rank_of: dict[str, int],
        rounds: list[list[str]],
        most: int,
    ) -> None:
        self.transport, self.me, self.rank_of, self.rounds = transport, me, rank_of, rounds
        self.most = most
        """At most this many of a round's lost roles are replaced."""
        self.inbox = transport.register(me)
        self.worlds: list[Respawned] = []

    def live_peers(self, but: list[str]) -> list[str]:
        return [n for n, r in self.rank_of.items() if r != GONE and n != self.me and n not in but]

    def lose(self, k: int) -> None:
        """Round k: its roles' ranks die; the others respawn (at most `most` of) them and
        rebind."""
        lost = self.rounds[k]
        replace = min(self.most, len(lost))
        if self.me in lost:
            die_seen()
        transport, comm = self.transport, self.transport.comm
        ranks, heard_by = {self.rank_of[n] for n in lost}, time.monotonic() + WAIT_S
        while not ranks <= transport.failures.known:  # type: ignore[union-attr]
            if time.monotonic() > heard_by:
                raise SystemExit(f"{self.me}: never heard of the loss of {lost}")
            transport.poll()
            time.sleep(1e-3)
        heard = time.monotonic()
        others = self.live_peers(but=lost)
        send_all(transport, self.me, others, f"before{k}")  # on the old world, not yet received
        transport.forget_lost()  # as launch/respawn_run.py does before its respawn
        world = respawn(comm, replace, [*ARGS, "--replacement", "--round", str(k), *self.argv])
        rank_of = {
            n: GONE if r == GONE else world.new_rank.get(r, GONE) for n, r in self.rank_of.items()
        }
        rank_of.update(dict(zip(lost, world.spawned, strict=False)))
        world.comm.bcast(rank_of, root=0)
        self.rebound(world, rank_of)
        reborn, gone = lost[:replace], lost[replace:]
        dropped = transport.dropped
        send_all(transport, self.me, [*others, *reborn, *gone], f"after{k}")
        if transport.dropped != dropped + 2 * len(gone):
            raise SystemExit(f"{self.me}: messages to {gone}, not replaced, were not dropped")
        expected = expected_from(others, f"before{k}") | expected_from(
            [*others, *reborn], f"after{k}"
        )
        first = receive(transport, self.inbox, expected)
        print(
            f"round {k}: {self.me} at rank {transport.rank}: shrink, spawn and merge took "
            f"{world.seconds:.2f} s"
        )
        if transport.rank == 0 and reborn:  # the first survivor
            to_first = max(first[name] for name in reborn) - heard
            print(f"round {k}: every replacement's first message {to_first:.2f} s after the loss")
            figures = {"round": k, "respawn_s": round(world.seconds, 3)}
            print(json.dumps({**figures, "to_first_s": round(to_first, 3)}))
        self.settle()

    def settle(self) -> None:
        """Wait for every rank to have received the round's messages, so that the next
        round's ranks die with none in flight: a rank that died while a peer was receiving
        its large message left that peer waiting for good, and once a survivor segfaulted
        inside the next `Merge` (Open MPI processing the death there, in
        `ompi_comm_revoke_local`). No rank has died since the world was merged, so a
        barrier tells the truth here."""
        self.transport.comm.Barrier()

    def rebound(self, world: Respawned, rank_of: dict[str, int]) -> None:
        self.transport.rebind(world.comm, rank_of, world.new_rank)
        self.rank_of = rank_of
        self.worlds.append(world)

    @property
    def argv(self) -> list[str]:
        rounds = "/".join(",".join(lost) for lost in self.rounds)
        return ["--rounds", rounds, "--replace", str(self.most)]

    def finish(self, replacement: bool) -> None:
        """Agree to stop; free the worlds merged into (the last one disconnected, collectively:
        none of its members has died). A replacement then ends through `MPI_Finalize` (its
        own world lost no rank), the others with `exit_now`."""
        code = 0
        if not self.transport.finish(WAIT_S):
            print(f"{self.me}: the closing agreement timed out", file=sys.stderr)
            code = 1
        for world in self.worlds[:-1]:
            world.comm.Free()
        if self.worlds:
            release(self.worlds[-1])
        if replacement and code == 0:
            return
        exit_now(code)  # MPI_Finalize hangs once a rank of the world is gone


ARGS = ["-m", "hpcmarl.testing.respawn_world"]


def replacement(joined: int, rounds: list[list[str]], replace: int) -> None:
    """A spawned rank: merge, learn the roles' ranks, greet every peer, hear back from each;
    then take part in the rounds after the one that spawned it."""
    world = join_parents()
    assert world is not None
    rank_of: dict[str, int] = world.comm.bcast(None, root=0)
    me = next(name for name, rank in rank_of.items() if rank == world.comm.Get_rank())
    member = Member(MpiTransport(rank_of, world.comm), me, rank_of, rounds, replace)
    member.worlds.append(world)
    peers = [name for name in rank_of if name != me]
    send_all(member.transport, me, peers, f"after{joined}")  # those to a lost role are dropped
    receive(member.transport, member.inbox, expected_from(member.live_peers([]), f"after{joined}"))
    member.settle()
    for k in range(joined + 1, len(rounds)):
        member.lose(k)
    member.finish(replacement=True)


def survivor(rounds: list[list[str]], replace: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank_of = {role(r): r for r in range(comm.Get_size())}
    transport = MpiTransport(rank_of, comm, make_doorbell(comm, 0.05))
    member = Member(transport, role(comm.Get_rank()), rank_of, rounds, replace)
    comm.Barrier()
    for k in range(len(rounds)):
        member.lose(k)
    member.finish(replacement=False)


def main() -> None:
    try:
        run()
    except BaseException:  # noqa: BLE001 - MPI_Finalize would hang: say why, then leave
        traceback.print_exc()
        exit_now(1)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lose", default="2", help="ranks that kill themselves, rounds split by /: 2,5/1"
    )
    parser.add_argument("--replace", type=int, default=1 << 20, help="at most this many a round")
    parser.add_argument("--replacement", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replacement:
        rounds = [lost.split(",") for lost in args.rounds.split("/")]
        replacement(args.round, rounds, args.replace)
    else:
        rounds = [[role(int(r)) for r in lost.split(",")] for lost in args.lose.split("/")]
        survivor(rounds, args.replace)


if __name__ == "__main__":
    main()
