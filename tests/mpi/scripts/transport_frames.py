"""Rank 0 sends through the transport; rank 1 reads the wire with plain MPI.

A control message and a bulk message of up to `INLINE_LIMIT` bytes must each be one MPI message
on the frame tag (a pickled header, then the arrays packed at the frame's end), with nothing on
the bulk tag: a header followed by a separate body costs a second message and makes the
receiver wait for the header before it can post the body's receive. A larger message's arrays
still follow its frame on the bulk tag.
"""

from __future__ import annotations

import pickle
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcmarl.comm.packing import allocate_packed, views_of
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import BULK_TAG, FRAME_TAG, INLINE_LIMIT, MpiTransport


def sent_messages() -> list[Message]:
    weights = {"weights": np.arange(16_384, dtype=np.float32)}
    batch = allocate_packed([("observations", "<f4", (100, 8)), ("actions", "<i8", (100,))])
    batch["observations"][...] = 1.5
    batch["actions"][...] = np.arange(100)
    large = {"weights": np.ones(INLINE_LIMIT // 4 + 1, np.float32)}
    return [
        Message("credit", "a", "b", {"n": 1}),
        Message("weights", "a", "b", {"version": 3}, weights),
        Message("batch", "a", "b", {"items": 100}, batch),
        Message("weights", "a", "b", {"version": 4}, large),
    ]


def frames(comm: object, count: int, timeout_s: float = 30.0) -> list[np.ndarray]:
    """The next `count` messages from rank 0 on the frame tag, as raw bytes."""
    got: list[np.ndarray] = []
    status, deadline = MPI.Status(), time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        probe = comm.improbe(0, FRAME_TAG, status)  # type: ignore[attr-defined]
        if probe is None:
            time.sleep(1e-3)
            continue
        frame = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        probe.Recv(frame)
        got.append(frame)
    return got


def check(comm: object, expected: list[Message]) -> bool:
    ok = True
    got = frames(comm, len(expected))
    ok &= len(got) == len(expected)
    for frame, msg in zip(got, expected, strict=False):
        kind, src, dst, meta, body = pickle.loads(frame.data)
        ok &= (kind, src, dst, meta) == (msg.kind, msg.src, msg.dst, msg.meta)
        if msg.arrays is None:
            ok &= body is None
            continue
        nbytes = sum(a.nbytes for a in msg.arrays.values())
        if nbytes > INLINE_LIMIT:
            ok &= body[0] != "inline" and frame.nbytes < 4096  # the arrays follow
            continue
        ok &= body[0] == "inline"
        arrays = views_of(frame[frame.nbytes - body[2] :], body[1])
        for name, array in msg.arrays.items():
            ok &= array.tobytes() == arrays[name].tobytes()
    # Only the large message's array came on the bulk tag.
    bulk = [comm.improbe(0, BULK_TAG) for _ in range(2)]  # type: ignore[attr-defined]
    ok &= bulk[0] is not None and bulk[1] is None
    if bulk[0] is not None:
        bulk[0].Recv(np.empty(INLINE_LIMIT + 4, np.uint8))
    return ok


def main() -> int:
    comm = MPI.COMM_WORLD
    expected = sent_messages()
    ok = True
    if comm.rank == 0:
        transport = MpiTransport({"a": 0, "b": 1}, comm)
        for msg in expected:
            transport.send(msg)
        ok &= transport.sends.drain(30)
    else:
        ok &= check(comm, expected)
    comm.Barrier()
    print(f"rank {comm.rank}: {'ok' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
