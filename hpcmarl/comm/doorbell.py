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

Only a world on one host gets doorbells (a peer on another host cannot ring), and only Linux
has the abstract namespace; elsewhere every rank polls as before. A ring is a hint, never a
message: whatever it misses (a message whose data arrives after its ring, a peer not yet
listening) the next poll finds, at most one wait later.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import sys
from typing import Any

RING = b"\x01"


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


def make_doorbell(comm: Any, idle_wait_s: float) -> Doorbell | None:
    """This rank's bell when every rank can ring every other, else None on every rank
    (collective: every rank calls it, with the same `idle_wait_s`). The caller passes 0, which
    turns doorbells off, for a world that spans several hosts. Ranks that share a host but not
    a network namespace (containers) cannot reach each other's abstract sockets: a test ring
    to every peer finds that out, and the world polls instead of waiting for rings that never
    come."""
    token = comm.bcast(secrets.token_hex(8) if comm.Get_rank() == 0 else None, root=0)
    bell: Doorbell | None = None
    if idle_wait_s > 0 and supported():
        with contextlib.suppress(OSError):
            bell = Doorbell(token, comm.Get_rank(), list(range(comm.Get_size())))
    every_bell = comm.allreduce(int(bell is not None), op=_min())
    reached = bell is not None and every_bell and bell.reaches_every_peer()
    if bell is None or not comm.allreduce(int(reached), op=_min()):
        if bell is not None:
            bell.close()
        return None
    bell.drain()
    return bell


def _min() -> Any:
    from mpi4py import MPI

    return MPI.MIN
