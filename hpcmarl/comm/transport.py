"""Moving messages between roles: in memory on one rank, nonblocking MPI across ranks.

This package is the only place that imports mpi4py. A control message is a small pickled tuple
on the control tag. A bulk message is a control header (kind, addresses, meta and the layout of
its arrays) followed by raw `Isend`s on the bulk tag: one for a packed batch (see packing.py),
else one per array, and a huge buffer in chunks that keep every count below 2**31. MPI never
lets two messages between the same pair of ranks on one tag overtake each other, so the receiver
posts its `Irecv`s in header order and each lands on the right buffer.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from .doorbell import Doorbell
from .failures import LostRanks, is_peer_failure, ulfm_enabled
from .packing import PackedBatch, pack, spec_of, views
from .progress import RequestPool
from .protocol import Message

CONTROL_TAG = 11
BULK_TAG = 12
MAX_RECEIVES_PER_POLL = 64
PACK_LIMIT = 256 << 10
"""Unpacked batches up to this size are copied into one buffer: one message beats many."""


def chunk_bytes() -> int:
    """Largest single MPI message in bytes; huge arrays go in several (counts stay < 2**31)."""
    return int(os.environ.get("HPCMARL_CHUNK_BYTES", str(1 << 30)))


def byte_chunks(nbytes: int, limit: int) -> list[tuple[int, int]]:
    """The (start, stop) byte ranges an array of `nbytes` is sent in; both sides agree on them."""
    if nbytes == 0:
        return []
    return [(start, min(start + limit, nbytes)) for start in range(0, nbytes, limit)]


class BufferPool:
    """Receive buffers kept for reuse, so that a steady stream of equal-sized messages lands in
    memory that is already mapped instead of faulting fresh pages on every message.

    A role that has copied a received message's arrays elsewhere (a replay insert, weights
    loaded into a network) recycles them; anything not recycled is simply garbage collected.
    """

    def __init__(self, max_bytes: int = 256 << 20, per_size: int = 8) -> None:
        self.free: dict[int, list[np.ndarray]] = {}
        self.lent: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self.held = 0
        self.max_bytes, self.per_size = max_bytes, per_size

    def take(self, nbytes: int) -> np.ndarray:
        stack = self.free.get(nbytes)
        if stack:
            buf = stack.pop()
            self.held -= nbytes
        else:
            buf = np.empty(nbytes, np.uint8)
        self.lent[id(buf)] = buf
        return buf

    def give(self, array: np.ndarray) -> None:
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        if self.lent.get(id(root)) is not root:
            return
        del self.lent[id(root)]
        stack = self.free.setdefault(root.nbytes, [])
        if len(stack) < self.per_size and self.held + root.nbytes <= self.max_bytes:
            stack.append(root)
            self.held += root.nbytes


class LocalTransport:
    """Delivers messages between roles hosted by this process: no copies, no MPI."""

    def __init__(self, rank_of: dict[str, int], rank: int = 0) -> None:
        self.rank_of = rank_of
        self.rank = rank
        self.doorbell: Doorbell | None = None
        """Rung at the destination after every send to another rank, so an idle peer wakes
        (doorbell.py); one process has no peers to ring."""
        self.inboxes: dict[str, deque[Message]] = {}
        self.dropped = 0

    def register(self, role_name: str) -> deque[Message]:
        self.inboxes[role_name] = deque()
        return self.inboxes[role_name]

    def unregister(self, role_name: str) -> None:
        """A finished role receives nothing more; later messages to it are dropped and counted."""
        self.inboxes.pop(role_name, None)

    def send(self, msg: Message) -> None:
        self._deliver(msg)

    def _deliver(self, msg: Message) -> None:
        inbox = self.inboxes.get(msg.dst)
        if inbox is None:
            self.dropped += 1
        else:
            inbox.append(msg)

    def poll(self) -> bool:
        return False

    def recycle(self, arrays: dict[str, np.ndarray] | None) -> None:
        """Nothing to reuse in memory: local messages hand over the sender's own arrays."""

    def outstanding(self) -> int:
        return 0

    def finish(self, timeout_s: float) -> bool:
        return True


class _Incoming:
    """A message received from one source whose arrays may still be arriving."""

    def __init__(self, msg: Message, requests: list[Any]) -> None:
        self.msg = msg
        self.requests = requests

    def complete(self) -> bool:
        if self.requests:
            self.requests = [r for r in self.requests if not r.Test()]
        return not self.requests


class MpiTransport(LocalTransport):
    """Nonblocking MPI between ranks, in-memory delivery within a rank."""

    def __init__(
        self, rank_of: dict[str, int], comm: Any, doorbell: Doorbell | None = None
    ) -> None:
        super().__init__(rank_of, comm.Get_rank())
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.failures = LostRanks(comm) if ulfm_enabled() else None
        """Ranks known dead, under Open MPI's fault tolerance (failures.py); None without it,
        where a dead rank ends the job."""
        self.sends = RequestPool(self.failures)
        self.incoming: dict[int, deque[_Incoming]] = {}
        self.chunk = chunk_bytes()
        self.buffers = BufferPool()
        self.status = MPI.Status()
        self.doorbell = doorbell

    def send(self, msg: Message) -> None:
        dest = self.rank_of[msg.dst]
        if dest == self.rank:
            self._deliver(msg)
            return
        if self.failures is not None and dest in self.failures.known:
            self.dropped += 1
            return
        if msg.arrays is None:
            header = (msg.kind, msg.src, msg.dst, msg.meta, None)
            self.sends.add(self.comm.isend(header, dest, CONTROL_TAG), None, dest)
        else:
            self._send_bulk(msg, dest)
        if self.doorbell is not None:
            self.doorbell.ring(dest)

    def _send_bulk(self, msg: Message, dest: int) -> None:
        """One raw message when the columns are (or are cheaply made) one packed buffer."""
        assert msg.arrays is not None
        arrays = msg.arrays
        if not isinstance(arrays, PackedBatch):
            arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
        packed = msg.arrays if isinstance(msg.arrays, PackedBatch) else None
        if packed is None and sum(a.nbytes for a in arrays.values()) <= PACK_LIMIT:
            packed = pack(arrays)
        if packed is not None:
            body: tuple = ("packed", packed.layout, packed.buffer.nbytes)
            parts = [packed.buffer]
        else:
            body, parts = ("columns", spec_of(arrays)), list(arrays.values())
        header = (msg.kind, msg.src, msg.dst, msg.meta, body)
        self.sends.add(self.comm.isend(header, dest, CONTROL_TAG), None, dest)
        for part in parts:
            raw = part.reshape(-1).view(np.uint8)
            for start, stop in byte_chunks(raw.nbytes, self.chunk):
                request = self.comm.Isend(raw[start:stop], dest, BULK_TAG)
                self.sends.add(request, part, dest, rings=False)

    def poll(self) -> bool:
        progressed = self.sends.test() > 0
        if self.sends.arrived:
            if self.doorbell is not None:
                for dest in self.sends.arrived:
                    self.doorbell.ring(dest)
            self.sends.arrived.clear()
        progressed = self._receive_headers() or progressed
        return self._deliver_completed() or progressed

    def _receive_headers(self) -> bool:
        received = 0
        while received < MAX_RECEIVES_PER_POLL:
            try:
                probe = self.comm.improbe(self.MPI.ANY_SOURCE, CONTROL_TAG, self.status)
            except self.MPI.Exception as err:
                self._note_failure(err)  # acknowledged: receives from any source go on
                continue
            if probe is None:
                break
            source = self.status.Get_source()
            kind, src, dst, meta, body = probe.recv()
            msg = Message(kind, src, dst, meta)
            requests = self._post_receives(msg, body, source) if body is not None else []
            self.incoming.setdefault(source, deque()).append(_Incoming(msg, requests))
            received += 1
        return received > 0

    def _post_receives(self, msg: Message, body: tuple, source: int) -> list[Any]:
        """Post the receives of a bulk message's buffers, in the order they were sent."""
        if body[0] == "packed":
            _, layout, nbytes = body
            raw = self.buffers.take(nbytes)
            msg.arrays = views(raw, layout)
            return self._irecv(raw, source)
        msg.arrays, requests = {}, []
        for name, dtype, shape in body[1]:
            dt = np.dtype(dtype)
            raw = self.buffers.take(math.prod(shape) * dt.itemsize)
            requests += self._irecv(raw, source)
            msg.arrays[name] = raw.view(dt).reshape(shape)
        return requests

    def _irecv(self, raw: np.ndarray, source: int) -> list[Any]:
        chunks = byte_chunks(raw.nbytes, self.chunk)
        return [self.comm.Irecv(raw[start:stop], source, BULK_TAG) for start, stop in chunks]

    def recycle(self, arrays: dict[str, np.ndarray] | None) -> None:
        """Give received arrays back once their contents were copied elsewhere (see BufferPool)."""
        if arrays:
            for array in arrays.values():
                self.buffers.give(array)

    def _deliver_completed(self) -> bool:
        """Deliver finished messages, keeping each source's order; a dead source's messages
        still arriving are dropped."""
        delivered = False
        for source, queue in self.incoming.items():
            try:
                while queue and queue[0].complete():
                    self._deliver(queue.popleft().msg)
                    delivered = True
            except self.MPI.Exception as err:
                self._note_failure(err)
                if source not in self.failures.known:  # type: ignore[union-attr]
                    raise
                self.dropped += len(queue)
                queue.clear()
        return delivered

    def _note_failure(self, err: Exception) -> None:
        """An MPI error: a peer's death learned (under fault tolerance), or raised as ours."""
        if self.failures is None or not is_peer_failure(err):
            raise err
        self.failures.refresh()

    def take_lost_ranks(self) -> set[int]:
        """Ranks learned dead since the last call (each once), for the rank's roles."""
        return self.failures.take_unseen() if self.failures is not None else set()

    def outstanding(self) -> int:
        pending_receives = sum(len(q) for q in self.incoming.values())
        return len(self.sends) + pending_receives

    def finish(self, timeout_s: float) -> bool:
        """Complete our sends while draining receives, then agree with every rank to stop.

        A nonblocking barrier entered only after our own sends completed means that when it
        completes, nobody has a send left that waits for a receive of ours.
        """
        drained = self.sends.drain(timeout_s, on_idle=self.poll)
        agreed = self._agree_to_stop(timeout_s)
        self._deliver_completed()
        return drained and agreed

    def _agree_to_stop(self, timeout_s: float) -> bool:
        """The closing barrier; with ranks lost, an agreement of the ranks left (a barrier
        over a dead rank fails), begun again should another rank die meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            lost = self.failures is not None and self.failures.known
            assert self.failures is not None or not lost
            request = self.failures.agreement() if lost else self.comm.Ibarrier()  # type: ignore[union-attr]
            self.sends.add(request, None)
            try:
                return self.sends.drain(max(deadline - time.monotonic(), 0.0), on_idle=self.poll)
            except self.MPI.Exception as err:
                self._note_failure(err)
                self.sends = RequestPool(self.failures)  # the failed collective is over

    @property
    def lost_any(self) -> bool:
        """Whether a rank of the world died: then `MPI_Finalize` would hang (failures.py)."""
        return self.failures is not None and bool(self.failures.known)
