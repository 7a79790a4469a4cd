"""Waking an idle rank when a peer on the same node sends it a message, instead of polling.

An idle rank used to sleep at most `runtime.idle_sleep_max_s` (2 ms) between polls, because
MPI offers no way to sleep until a message arrives. On a node with more ranks than cores every
such wake-up is a context switch that evicts a busy rank's caches: MAPPO at `-n 16` on 2 cores
made about 8,000 context switches a second, with 15 of its 16 ranks runnable at any moment.

A doorbell is one datagram socket per rank in Linux's abstract namespace (no file, gone with
the process), named by a token the ranks share. Every MPI send rings the receiver's bell when
it is posted and again when it completes (a one-byte datagram, dropped when the queue is full:
one pending ring is enough); the second ring covers a send that only reaches its peer later,
as the first one to a peer not yet connected does. An idle rank waits in `select` on its own
bell for up to `runtime.idle_wait_s`, so a message wakes it at once and a quiet rank costs
nothing. Rings that arrive while the rank is busy stay queued and make its next wait return at
once, so no wake-up is lost between a poll and the wait. A rank with anything in flight that
only polling completes (its own sends and receives, a collective, a checkpoint being written)
keeps polling every `idle_sleep_max_s` at most.

A world over several hosts rings over the network instead: one UDP socket per rank, at the
address its host name resolves to (as the batch system and mpirun reach the host). Without
bells there, every idle rank polled: the default job at `-n 16` on 2 hosts of one machine ran
at 0.48 of its rate on one host, and at one host with bells off at 0.62. Each rank hears a
hello from every peer at start-up or the world polls instead (a firewall between nodes, a host
name that resolves to a loopback address). Only Linux has the abstract namespace; elsewhere a
one-host world polls as before. A ring is a hint, never a message: whatever it misses (a
message whose data arrives after its ring, a peer not yet listening, a datagram lost) the next
poll finds, at most one wait later.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import sys
import time
from typing import Any

RING = b"\x01"
HELLO_WAIT_S = 5.0
"""How long a rank of a world over several hosts waits to hear every peer's hello."""
MAX_NETWORK_PEERS = 1024
"""Larger worlds poll: the start-up hellos grow with the square of the ranks."""


def address(token: str, rank: int) -> bytes:
    """The abstract socket name of `rank`'s bell in the world that shares `token`."""
    return b"\0hpcmarl-" + token.encode() + b"-" + str(rank).encode()


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


class Doorbell:
    """This rank's bell (to wait on) and the addresses of its peers' bells (to ring)."""

    def __init__(self, token: str, rank: int, peers: list[int]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address(token, rank))
        self.sock.setblocking(False)
        self.peers = {peer: address(token, peer) for peer in peers if peer != rank}
        self.rings_sent = 0
        self.wakeups = 0

    def ring(self, rank: int) -> None:
        """Wake `rank` if it waits; a full queue or a peer not (or no longer) listening is fine:
        a ring is already pending there, or the peer polls anyway."""
        peer = self.peers.get(rank)
        if peer is None:
            return
        with contextlib.suppress(OSError):
            self.sock.sendto(RING, peer)
            self.rings_sent += 1

    def renumber(self, new_rank: dict[int, int]) -> None:
        """Address the peers by their ranks in a world merged after a respawn (respawn.py);
        a replacement, which has no bell, is polled for instead."""
        self.peers = {new_rank[old]: peer for old, peer in self.peers.items() if old in new_rank}

    def wait(self, timeout_s: float) -> bool:
        """Sleep until a ring or `timeout_s`; True when rung (every pending ring is consumed)."""
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        if not readable:
            return False
        self.drain()
        self.wakeups += 1
        return True

    def drain(self) -> None:
        """Consume every pending ring."""
        with contextlib.suppress(BlockingIOError):
            while self.sock.recv(64):
                pass

    def reaches_every_peer(self) -> bool:
        """Ring each peer once (at start-up, every bell bound): can every one be reached?"""
        for peer in self.peers.values():
            try:
                self.sock.sendto(RING, peer)
            except BlockingIOError:
                continue  # its queue is full of rings: it is there
            except OSError:
                return False
        return True

    def close(self) -> None:
        self.sock.close()


class NetworkDoorbell(Doorbell):
    """A bell on a UDP socket, for a world over several hosts: peers ring its host's address."""

    def __init__(self, rank: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.setblocking(False)
        self.rank = rank
        self.port = int(self.sock.getsockname()[1])
        self.peers: dict[int, Any] = {}
        self.rings_sent = 0
        self.wakeups = 0

    def connect(self, addresses: list[tuple[str, int] | None]) -> None:
        """Every rank's (host address, port), indexed by rank."""
        self.peers = {r: a for r, a in enumerate(addresses) if a is not None and r != self.rank}

    def say_hello(self) -> None:
        """One datagram naming this rank to every peer (see `heard_every_peer`)."""
        hello = b"hello " + str(self.rank).encode()
        for peer in self.peers.values():
            with contextlib.suppress(OSError):
                self.sock.sendto(hello, peer)

    def heard_every_peer(self, timeout_s: float = HELLO_WAIT_S) -> bool:
        """Whether every peer's hello arrived within `timeout_s`: UDP reports no unreachable
        peer to the sender, so each rank checks what it received instead."""
        missing, deadline = set(self.peers), time.monotonic() + timeout_s
        while missing and time.monotonic() < deadline:
            select.select([self.sock], [], [], 0.05)
            with contextlib.suppress(BlockingIOError):
                while True:
                    data = self.sock.recv(64)
                    if data.startswith(b"hello "):
                        missing.discard(int(data[6:]))
        return not missing


def host_address(name: str) -> str | None:
    """The IPv4 address `name` resolves to, or None when it does not or it is a loopback one
    (no peer on another host could ring it)."""
    try:
        found = socket.gethostbyname(name)
    except OSError:
        return None
    return None if found.startswith("127.") else found


def make_doorbell(comm: Any, idle_wait_s: float) -> Doorbell | None:
    """This rank's bell when every rank can ring every other, else None on every rank
    (collective: every rank calls it, with the same `idle_wait_s`; 0 turns doorbells off).
    Ranks on one host ring each other's abstract sockets; ranks that share a host but not a
    network namespace (containers) cannot, and a test ring to every peer finds that out. A
    world over several hosts rings over UDP (`NetworkDoorbell`). Where a bell cannot reach
    every peer the world polls instead of waiting for rings that never come."""
    from mpi4py import MPI

    names = comm.allgather(MPI.Get_processor_name())
    if len(set(names)) > 1:
        return _network_doorbell(comm, idle_wait_s, names[comm.Get_rank()])
    token = comm.bcast(secrets.token_hex(8) if comm.Get_rank() == 0 else None, root=0)
    bell: Doorbell | None = None
    if idle_wait_s > 0 and supported():
        with contextlib.suppress(OSError):
            bell = Doorbell(token, comm.Get_rank(), list(range(comm.Get_size())))
    every_bell = comm.allreduce(int(bell is not None), op=_min())
    reached = bell is not None and every_bell and bell.reaches_every_peer()
    return _agreed(comm, bell, bool(reached))


def _network_doorbell(comm: Any, idle_wait_s: float, name: str) -> Doorbell | None:
    """UDP bells for a world over several hosts, when every rank hears every other's hello."""
    bell: NetworkDoorbell | None = None
    address = host_address(name)
    if idle_wait_s > 0 and address is not None and comm.Get_size() <= MAX_NETWORK_PEERS:
        with contextlib.suppress(OSError):
            bell = NetworkDoorbell(comm.Get_rank())
    addresses = comm.allgather(None if bell is None else (address, bell.port))
    if bell is None or any(a is None for a in addresses):
        return _agreed(comm, bell, False)
    bell.connect(addresses)
    bell.say_hello()
    return _agreed(comm, bell, bell.heard_every_peer())


def _agreed(comm: Any, bell: Doorbell | None, reached: bool) -> Doorbell | None:
    """The bell when every rank has one and its `reached` is true, else None everywhere
    (collective: every rank takes part, also one without a bell)."""
    if not comm.allreduce(int(bell is not None and reached), op=_min()):
        if bell is not None:
            bell.close()
        return None
    assert bell is not None
    bell.drain()
    return bell


def _min() -> Any:
    from mpi4py import MPI

    return MPI.MIN
