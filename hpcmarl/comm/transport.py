"""Moving messages between roles: in memory on one rank, nonblocking MPI across ranks.

This package is the only place that imports mpi4py. Every message is one frame on the frame
tag: a pickled header (kind, addresses, meta, and the layout of its arrays, if any, as bytes
pickled once per layout: packing.layout_blob). A bulk
message of up to `INLINE_LIMIT` bytes carries its arrays in the same frame, packed (see
packing.py) after the header at the frame's 64-byte-aligned end, never pickled: `pickle.loads`
stops at the header's end. The receiver matches a frame with `improbe` and receives it into a
pooled buffer of the probed size, so a message costs one MPI message and no receive waits for a
header first. A larger bulk message's arrays follow its frame as raw `Isend`s on the bulk tag:
one for a packed batch, else one per array, and a huge buffer in chunks that keep every count
below 2**31. MPI never lets two messages between the same pair of ranks on one tag overtake each
other, so frames arrive in the order they were sent, and the receiver, reading each source's
frames in that order, posts the `Irecv`s of the bulk tag in the order of their `Isend`s.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from .doorbell import Doorbell
from .failures import LostRanks, is_peer_failure, ulfm_enabled
from .packing import PackedBatch, aligned, layout_blob, layout_of, spec_of, views_of
from .progress import RequestPool
from .protocol import Message

FRAME_TAG = 11
BULK_TAG = 12
MAX_RECEIVES_PER_POLL = 64
INLINE_LIMIT = 256 << 10
"""Arrays up to this many bytes in all ride in their header's frame: one MPI message."""
SMALL_FRAME = 2048
"""A matched frame up to this size is received at once: its bytes came with its envelope."""
FRAME_ROUND = 4096
"""Frame receive buffers are rounded up to this, so frames whose headers differ by a few bytes
(a version number that grew) reuse the same pooled buffers."""
PROTOCOL = pickle.HIGHEST_PROTOCOL
RING_AGAIN_S = 1e-3
"""How often a sent frame that its receiver has not matched yet rings that receiver again."""
CLOSING = 1
"""A rank's bit in an agreement (`MpiTransport.agree`): its roles finished, it agrees to stop."""
REPLACING = 2
"""A rank's bit in an agreement: its roles still run, it heard of a lost collector and asks for
a replacement (launch/respawn_run.py)."""


def chunk_bytes() -> int:
    """Largest single MPI message in bytes; huge arrays go in several (counts stay < 2**31)."""
    return int(os.environ.get("HPCMARL_CHUNK_BYTES", str(1 << 30)))


def byte_chunks(nbytes: int, limit: int) -> list[tuple[int, int]]:
    """The (start, stop) byte ranges an array of `nbytes` is sent in; both sides agree on them."""
    if nbytes == 0:
        return []
    return [(start, min(start + limit, nbytes)) for start in range(0, nbytes, limit)]


def _forget(lent: dict[int, weakref.ref], key: int, _: weakref.ref) -> None:
    """A lent buffer was garbage collected without being given back."""
    lent.pop(key, None)


class BufferPool:
    """Receive buffers kept for reuse, so that a steady stream of equal-sized messages lands in
    memory that is already mapped instead of faulting fresh pages on every message.

    A role that has copied a received message's arrays elsewhere (a replay insert, weights
    loaded into a network) recycles them; anything not recycled is simply garbage collected.
    """

    def __init__(self, max_bytes: int = 256 << 20, per_size: int = 8) -> None:
        self.free: dict[int, list[np.ndarray]] = {}
        self.lent: dict[int, weakref.ref] = {}
        """Buffers lent and alive, by id: a weak reference whose callback forgets a buffer
        garbage collected unrecycled (a `WeakValueDictionary` does the same in Python code,
        several microseconds a message)."""
        self.held = 0
        self.max_bytes, self.per_size = max_bytes, per_size

    def take(self, nbytes: int) -> np.ndarray:
        stack = self.free.get(nbytes)
        if stack:
            buf = stack.pop()
            self.held -= nbytes
        else:
            buf = np.empty(nbytes, np.uint8)
        key, lent = id(buf), self.lent
        lent[key] = weakref.ref(buf, functools.partial(_forget, lent, key))
        return buf

    def give(self, array: np.ndarray) -> None:
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        ref = self.lent.pop(id(root), None)
        if ref is None or ref() is not root:
            return
        stack = self.free.setdefault(root.nbytes, [])
        if len(stack) < self.per_size and self.held + root.nbytes <= self.max_bytes:
            stack.append(root)
            self.held += root.nbytes


class SentFrames:
    """Frames of sent messages, filled again once their send has completed: a fresh 64 KB
    frame faults its pages in anew, which costs more than copying the message into it.

    A frame is reused only when its request is null, which mpi4py makes it once `Test` or
    `Testsome` found the send complete (FACTS: a buffer refilled while in flight corrupts
    the message). Frames are kept by their size, rounded up to `FRAME_ROUND`, at most
    `per_size` of each of the `sizes` sizes last added (about 17 MB of frames at most),
    and a caller fills and sends only the first `nbytes` of one.
    """

    def __init__(self, per_size: int = 4, sizes: int = 16) -> None:
        self.sent: dict[int, deque[tuple[np.ndarray, Any]]] = {}
        self.per_size, self.sizes = per_size, sizes

    def take(self, nbytes: int) -> np.ndarray:
        rounded = -(-nbytes // FRAME_ROUND) * FRAME_ROUND
        sent = self.sent.get(rounded)
        if sent and not sent[0][1]:  # the oldest send of this size has completed
            return sent.popleft()[0][:nbytes]
        return np.empty(rounded, np.uint8)[:nbytes]

    def keep(self, frame: np.ndarray, request: Any) -> None:
        """Keep a frame just handed to `Isend`, with its request, to reuse after it."""
        whole = frame.base if isinstance(frame.base, np.ndarray) else frame
        sent = self.sent.get(whole.nbytes)
        if sent is None:
            if len(self.sent) >= self.sizes:
                del self.sent[next(iter(self.sent))]  # the size added longest ago
            sent = self.sent[whole.nbytes] = deque(maxlen=self.per_size)
        sent.append((whole, request))


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
    """A frame from one source: the frame, then the arrays that follow it, may be arriving."""

    __slots__ = ("frame", "size", "requests", "msg")

    def __init__(
        self, frame: np.ndarray, size: int, requests: list[Any], msg: Message | None = None
    ) -> None:
        self.frame = frame
        self.size = size
        self.requests = requests
        self.msg = msg
        """Set once the frame is here and read (`MpiTransport._open`)."""

    def complete(self) -> bool:
        if self.requests:
            self.requests = [r for r in self.requests if not r.Test()]
        return not self.requests


GONE = -1
"""The rank of a role lost before a `MpiTransport.rebind`: messages to it are dropped."""


class _Retired:
    """A world a transport left for a merged one, still drained of what was sent on it."""

    __slots__ = ("comm", "incoming", "failures", "sends")

    def __init__(
        self,
        comm: Any,
        incoming: dict[int, deque[_Incoming]],
        failures: LostRanks | None,
        sends: RequestPool,
    ) -> None:
        self.comm, self.incoming, self.failures, self.sends = comm, incoming, failures, sends


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
        where a dead rank ends the job. `GONE` counts as dead (a world after a respawn)."""
        if self.failures is not None and GONE in rank_of.values():
            self.failures.known.add(GONE)
        self.sends = RequestPool(self.failures)
        self.incoming: dict[int, deque[_Incoming]] = {}
        self.chunk = chunk_bytes()
        self.buffers = BufferPool()
        self.frames = SentFrames()
        self.unmatched: list[tuple[Any, int, float]] = []
        """Sent frames above a small frame's size, each with its destination and when that was
        last rung, until they complete (with a doorbell only; see `_ring_unmatched`)."""
        self.status = MPI.Status()
        self.doorbell = doorbell
        self.retired: list[_Retired] = []
        """Worlds left by `rebind`, still read for what was sent on them before."""
        self.abandoned: list[_Incoming] = []
        """A dead source's messages that never arrived whole (`_abandon`)."""

    def send(self, msg: Message) -> None:
        dest = self.rank_of[msg.dst]
        if dest == self.rank:
            self._deliver(msg)
            return
        if self.failures is not None and dest in self.failures.known:
            self.dropped += 1
            return
        if msg.arrays is None:
            frame = pickle.dumps((msg.kind, msg.src, msg.dst, msg.meta, None), PROTOCOL)
            self.sends.add(self.comm.Isend(frame, dest, FRAME_TAG), frame, dest)
        else:
            self._send_bulk(msg, dest)
        if self.doorbell is not None:
            self.doorbell.ring(dest)

    def _send_bulk(self, msg: Message, dest: int) -> None:
        """Small arrays in their header's frame; larger ones after it, on the bulk tag."""
        assert msg.arrays is not None
        packed = msg.arrays if isinstance(msg.arrays, PackedBatch) else None
        if packed is not None:
            arrays: dict[str, np.ndarray] = packed
            nbytes = packed.buffer.nbytes
        else:
            arrays = {name: np.ascontiguousarray(a) for name, a in msg.arrays.items()}
            nbytes = sum(a.nbytes for a in arrays.values())
        if nbytes <= INLINE_LIMIT:
            self._send_inline(msg, arrays, packed, dest)
            return
        if packed is not None:
            body: tuple = ("packed", layout_blob(packed.layout), nbytes)
            parts = [packed.buffer]
        else:
            body, parts = ("columns", spec_of(arrays)), list(arrays.values())
        frame = pickle.dumps((msg.kind, msg.src, msg.dst, msg.meta, body), PROTOCOL)
        self.sends.add(self.comm.Isend(frame, dest, FRAME_TAG), frame, dest)
        for part in parts:
            raw = part.reshape(-1).view(np.uint8)
            for start, stop in byte_chunks(raw.nbytes, self.chunk):
                request = self.comm.Isend(raw[start:stop], dest, BULK_TAG)
                self.sends.add(request, part, dest, rings=False)

    def _send_inline(
        self, msg: Message, arrays: dict[str, np.ndarray], packed: PackedBatch | None, dest: int
    ) -> None:
        """One frame: the header, then the arrays packed at its end. Loose columns are copied
        once, as packing them would; a packed batch's buffer once (an MPI message less pays
        for that many times over at these sizes)."""
        if packed is not None:
            layout, nbytes = packed.layout, packed.buffer.nbytes
        else:
            layout, nbytes = layout_of(arrays)
        body = ("inline", layout_blob(layout), nbytes)
        header = pickle.dumps((msg.kind, msg.src, msg.dst, msg.meta, body), PROTOCOL)
        start = aligned(len(header))
        frame = self.frames.take(start + nbytes)
        frame.data[: len(header)] = header
        if packed is not None:
            frame[start:] = packed.buffer
        else:
            for name, _, _, offset in layout:
                column = arrays[name].reshape(-1).view(np.uint8)
                frame[start + offset : start + offset + column.nbytes] = column
        request = self.comm.Isend(frame, dest, FRAME_TAG)
        self.sends.add(request, frame, dest)
        self.frames.keep(frame, request)
        if self.doorbell is not None and frame.nbytes > SMALL_FRAME:
            self.unmatched.append((request, dest, time.monotonic()))

    def poll(self) -> bool:
        progressed = self.sends.test() > 0
        if self.sends.arrived:
            if self.doorbell is not None:
                for dest in self.sends.arrived:
                    self.doorbell.ring(dest)
            self.sends.arrived.clear()
        if self.unmatched:
            self._ring_unmatched()
        progressed = self._receive_frames(self.comm, self.incoming, self.failures) or progressed
        if self.retired:
            progressed = self._poll_retired() or progressed
        return self._deliver_completed(self.comm, self.incoming, self.failures) or progressed

    def _ring_unmatched(self) -> None:
        """Ring the receiver of a frame it has not matched again, every `RING_AGAIN_S`. A frame
        above MPI's eager size completes only once its receiver has matched it, so no ring on
        completion can tell the receiver of it, and the ring made when it was posted may come
        before its envelope does (the pair's connection still being made, a busy sender): the
        receiver, finding nothing, would go back to wait out its idle wait (once, under MPICH
        across hosts at a load of 10, a rank of the doorbell test waited out its minute)."""
        now, waiting = time.monotonic(), []
        for request, dest, rung in self.unmatched:
            if not request or (self.failures is not None and dest in self.failures.known):
                continue  # completed (mpi4py nulls a completed request), or its receiver is gone
            if now - rung >= RING_AGAIN_S:
                self.doorbell.ring(dest)  # type: ignore[union-attr]
                rung = now
            waiting.append((request, dest, rung))
        self.unmatched = waiting

    def _receive_frames(
        self, comm: Any, incoming: dict[int, deque[_Incoming]], failures: LostRanks | None
    ) -> bool:
        """Match the frames that came; a small one whose source has nothing before it pending
        is received, read and delivered at once, a larger one received into a pooled buffer."""
        received = 0
        status, any_source, byte = self.status, self.MPI.ANY_SOURCE, self.MPI.BYTE
        while received < MAX_RECEIVES_PER_POLL:
            try:
                probe = comm.improbe(any_source, FRAME_TAG, status)
            except self.MPI.Exception as err:
                self._note_failure(err, failures)  # acknowledged: receives from any source go on
                continue
            if probe is None:
                break
            received += 1
            source, size = status.Get_source(), status.Get_count(byte)
            queue = incoming.get(source)
            if queue is None:
                queue = incoming[source] = deque()
            if size <= SMALL_FRAME and not queue:
                frame = np.empty(size, np.uint8)
                probe.Recv(frame)
                self._open_now(frame, size, source, comm, queue)
                continue
            frame = self.buffers.take(-(-size // FRAME_ROUND) * FRAME_ROUND)
            request = probe.Irecv(frame)
            if not queue and request.Test():  # often so within a host: read it in this poll
                self._open_now(frame, size, source, comm, queue)
            else:
                queue.append(_Incoming(frame, size, [request]))
        return received > 0

    def _open_now(
        self, frame: np.ndarray, size: int, source: int, comm: Any, queue: deque[_Incoming]
    ) -> None:
        """Read a frame received whole from a source with nothing before it pending: deliver
        its message, or queue it while the arrays that follow it arrive."""
        msg, requests = self._open(frame, size, source, comm)
        if requests:  # its arrays follow on the bulk tag
            queue.append(_Incoming(frame, size, requests, msg))
        else:
            self._deliver(msg)

    def _open(
        self, frame: np.ndarray, size: int, source: int, comm: Any
    ) -> tuple[Message, list[Any]]:
        """Read an arrived frame's header; post the receives of the arrays that follow it."""
        kind, src, dst, meta, body = pickle.loads(frame.data)
        msg = Message(kind, src, dst, meta)
        if body is None:
            self.buffers.give(frame)
        elif body[0] == "inline":
            msg.arrays = views_of(frame[size - body[2] : size], body[1])
        else:
            self.buffers.give(frame)
            msg.arrays, requests = self._post_receives(body, source, comm)
            return msg, requests
        return msg, []

    def _post_receives(
        self, body: tuple, source: int, comm: Any
    ) -> tuple[dict[str, np.ndarray], list[Any]]:
        """The arrays of a frame whose arrays follow it, and the receives that fill them, posted
        in the order they were sent."""
        if body[0] == "packed":
            _, blob, nbytes = body
            raw = self.buffers.take(nbytes)
            return views_of(raw, blob), self._irecv(raw, source, comm)
        arrays, requests = {}, []
        for name, dtype, shape in body[1]:
            dt = np.dtype(dtype)
            raw = self.buffers.take(math.prod(shape) * dt.itemsize)
            requests += self._irecv(raw, source, comm)
            arrays[name] = raw.view(dt).reshape(shape)
        return arrays, requests

    def _irecv(self, raw: np.ndarray, source: int, comm: Any) -> list[Any]:
        chunks = byte_chunks(raw.nbytes, self.chunk)
        return [comm.Irecv(raw[start:stop], source, BULK_TAG) for start, stop in chunks]

    def recycle(self, arrays: dict[str, np.ndarray] | None) -> None:
        """Give received arrays back once their contents were copied elsewhere (see BufferPool)."""
        if isinstance(arrays, PackedBatch):  # received columns of one buffer
            self.buffers.give(arrays.buffer)
        elif arrays:
            for array in arrays.values():
                self.buffers.give(array)

    def _deliver_completed(
        self, comm: Any, incoming: dict[int, deque[_Incoming]], failures: LostRanks | None
    ) -> bool:
        """Read arrived frames and deliver finished messages, both in each source's order; a
        dead source's messages still arriving are dropped."""
        delivered = False
        for source, queue in incoming.items():
            if not queue:
                continue
            try:
                self._open_arrived(queue, source, comm)
                while queue and queue[0].msg is not None and queue[0].complete():
                    self._deliver(queue.popleft().msg)  # type: ignore[arg-type]
                    delivered = True
            except self.MPI.Exception as err:
                self._note_failure(err, failures)
                if source not in failures.known:  # type: ignore[union-attr]
                    raise
                self._abandon(queue)
        return delivered

    def _abandon(self, queue: deque[_Incoming]) -> None:
        """Drop a dead source's messages still arriving: their receives cancelled and freed,
        not left posted on the world the ranks left shrink and merge next (respawn.py; once a
        survivor segfaulted in `ompi_comm_revoke_local` there), and their buffers kept (never
        pooled again) in case MPI still holds one."""
        for incoming in queue:
            for request in incoming.requests:
                try:
                    request.Cancel()
                    request.Free()
                except self.MPI.Exception:
                    pass  # it completed in error already: nothing is left of it
            incoming.requests = []
        self.abandoned.extend(queue)
        self.dropped += len(queue)
        queue.clear()

    def forget_lost(self) -> None:
        """Before a respawn: cancel every receive still posted for a rank known dead, on this
        world and on the worlds left before (`_abandon`)."""
        worlds = [(self.incoming, self.failures)]
        worlds += [(old.incoming, old.failures) for old in self.retired]
        for incoming, failures in worlds:
            for source in failures.known if failures is not None else ():
                if incoming.get(source):
                    self._abandon(incoming[source])

    def _open_arrived(self, queue: deque[_Incoming], source: int, comm: Any) -> None:
        """Read the frames of one source that have arrived, in order: a frame still arriving
        holds back the ones after it, whose bulk receives must be posted after its own."""
        for incoming in queue:
            if incoming.msg is None:
                if not incoming.complete():
                    return
                incoming.msg, incoming.requests = self._open(
                    incoming.frame, incoming.size, source, comm
                )

    def _note_failure(self, err: Exception, failures: LostRanks | None) -> None:
        """An MPI error: a peer's death learned (under fault tolerance), or raised as ours."""
        if failures is None or not is_peer_failure(err):
            raise err
        failures.refresh()

    def take_lost_ranks(self) -> set[int]:
        """Ranks learned dead since the last call (each once), for the rank's roles."""
        return self.failures.take_unseen() if self.failures is not None else set()

    def outstanding(self) -> int:
        pending_receives = sum(len(q) for q in self.incoming.values())
        for old in self.retired:
            pending_receives += len(old.sends) + sum(len(q) for q in old.incoming.values())
        return len(self.sends) + pending_receives

    def finish(self, timeout_s: float) -> bool:
        """Complete our sends while draining receives, then agree with every rank to stop.

        A nonblocking barrier entered only after our own sends completed means that when it
        completes, nobody has a send left that waits for a receive of ours.
        """
        drained = self.sends.drain(timeout_s, on_idle=self.poll)
        for old in self.retired:
            drained = old.sends.drain(timeout_s, on_idle=self.poll) and drained
        agreed = self._agree_to_stop(timeout_s)
        self._deliver_completed(self.comm, self.incoming, self.failures)
        return drained and agreed

    def _agree_to_stop(self, timeout_s: float) -> bool:
        """The closing barrier; under fault tolerance an agreement of the ranks left (a
        barrier over a dead rank fails), begun again should another rank die meanwhile. Every
        rank agrees, whether or not it knows of a loss: a rank that had not heard of one yet, or
        a replacement that never saw it, would otherwise wait in a barrier the others never
        enter. A rank whose roles still run meets this agreement when it asks to replace a
        lost collector (`REPLACING`, respawn_run.py): without `CLOSING` from every rank the
        ranks here agree again, while that rank learns the stop has begun and goes on."""
        deadline = time.monotonic() + timeout_s
        while True:
            agreed = self.agree(CLOSING, max(deadline - time.monotonic(), 0.0))
            if agreed is None:
                return False
            if agreed & CLOSING:
                return True

    def agree(self, bits: int, timeout_s: float) -> int | None:
        """The AND of `bits` over every rank left, while receives go on; None at the timeout.
        A rank lost meanwhile fails the agreement at every rank alike (ULFM raises it
        uniformly), and each acknowledges the loss and agrees again, so the ranks that take
        part always see the same value. Without fault tolerance a barrier, where every rank
        gives the same `bits`."""
        deadline = time.monotonic() + timeout_s
        while True:
            pool, flag = RequestPool(self.failures), None
            if self.failures is None:
                pool.add(self.comm.Ibarrier(), None)
            else:
                request, flag = self.failures.agreement(bits)
                pool.add(request, flag)
            try:
                if not pool.drain(max(deadline - time.monotonic(), 0.0), on_idle=self.poll):
                    return None
            except self.MPI.Exception as err:
                self._note_failure(err, self.failures)
                continue
            return bits if flag is None else int(flag[0])

    @property
    def lost_any(self) -> bool:
        """Whether a rank of the world died: then `MPI_Finalize` would hang (failures.py).
        A rebound transport's old world had lost one."""
        return bool(self.retired) or (self.failures is not None and bool(self.failures.known))

    def rebind(self, comm: Any, rank_of: dict[str, int], new_rank: dict[int, int]) -> None:
        """Send on `comm` from now on, a world merged with replacements of lost ranks
        (respawn.py): `rank_of` places every role in it, a lost role at `GONE`, and `new_rank`
        maps each survivor's rank in the world left to its rank in `comm`. The world left is
        still read, as are the sends still in flight on it, so nothing sent before is lost;
        between a pair of ranks, what was sent before the rebind is delivered in order, and
        what is sent after in order, but the two may interleave."""
        old_sends = self.sends
        old_sends.arrived.clear()  # their rings went to the old world's numbering
        self.retired.append(_Retired(self.comm, self.incoming, self.failures, old_sends))
        self.comm, self.rank, self.rank_of = comm, comm.Get_rank(), rank_of
        self.incoming = {}
        self.failures = LostRanks(comm)
        if GONE in rank_of.values():
            self.failures.known.add(GONE)  # so sends to a lost role are dropped, as before
        self.sends = RequestPool(self.failures)
        self.unmatched = [
            (request, new_rank[dest], rung)
            for request, dest, rung in self.unmatched
            if dest in new_rank
        ]
        if self.doorbell is not None:
            self.doorbell.renumber(new_rank)

    def _poll_retired(self) -> bool:
        """Read what is still arriving on the worlds left (their sends complete meanwhile);
        their news of lost ranks is acknowledged there and heard on the current world."""
        progressed = False
        for old in self.retired:
            progressed = old.sends.test() > 0 or progressed
            old.sends.arrived.clear()
            progressed = self._receive_frames(old.comm, old.incoming, old.failures) or progressed
            progressed = self._deliver_completed(old.comm, old.incoming, old.failures) or progressed
            if old.failures is not None:
                old.failures.take_unseen()
        return progressed
