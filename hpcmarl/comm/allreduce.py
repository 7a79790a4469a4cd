"""Collectives among the learners of one policy, without blocking the rank loop.

Every operation starts, returns a `Handle`, and is finished by polling: `ready(handle)` tests
it, `result(handle)` gives its output. `start(flat)` averages a gradient, `start_broadcast`
copies the group root's weights to every member (at learner start, so a group never begins
apart), `start_gather` collects one small row per member (the weight digests of the drift check).
Beside each sits a blocking wrapper (`average`, `broadcast`, `gather`) for tests and benchmarks.

Backends share this interface: `SoloAverager` (a group of one: nothing to do), `MpiAverager`
(one fused flat float32 buffer, `Iallreduce` over the learner sub-communicator, never the whole
world), `HorovodAverager` in `horovod.py` and `TorchAverager` in `torch_dist.py` (NCCL on the
GPU, gloo on the CPU). `make_averager` picks one per `learner.allreduce`.

A started buffer belongs to the collective: the caller hands it over (it may be scaled or
overwritten) and reads only the result. That saves a copy of every gradient: Horovod reduces it
in place; the MPI backend scales it by 1/size while it is still in cache (exact for groups of a
power of two), sums it into a separate buffer (Open MPI's nonblocking allreduce is twice as slow
in place for large messages) and recycles it as the receive buffer of the next average (a fresh
40 MB buffer costs page faults). mpi4py does not keep the buffers of a nonblocking collective
alive, so each `Handle` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ConfigError


def _same(handle: Handle) -> np.ndarray:
    return handle.buffer


class Handle:
    """A collective in flight: the buffer it fills, its request, and how to read its output."""

    def __init__(
        self,
        buffer: np.ndarray,
        request: Any,
        size: int,
        finish: Callable[[Handle], np.ndarray] = _same,
        keep: Any = None,
    ) -> None:
        self.buffer = buffer
        self.request = request
        self.size = size
        self.finish = finish
        self.keep = keep
        """What must stay alive until the collective completes (a send buffer)."""


def owned_float32(flat: np.ndarray) -> np.ndarray:
    """`flat` itself when it already is a contiguous float32 vector, else a converted copy."""
    return np.ascontiguousarray(flat, dtype=np.float32).reshape(-1)


class SoloAverager:
    """The group of one: the average of one gradient is itself, the root is oneself."""

    backend = "none"
    size = 1
    rank = 0

    def start(self, flat: np.ndarray) -> Handle:
        return Handle(flat, None, 1)

    def start_broadcast(self, flat: np.ndarray) -> Handle:
        return Handle(flat, None, 1)

    def start_gather(self, row: np.ndarray) -> Handle:
        return Handle(np.asarray(row, dtype=np.int64).reshape(1, -1), None, 1)

    def ready(self, handle: Handle) -> bool:
        return True

    def result(self, handle: Handle) -> np.ndarray:
        """The output of a finished collective (call once, after `ready` said True)."""
        return handle.finish(handle)

    def wait(self, handle: Handle) -> np.ndarray:
        """Block until `handle` completes; for tests, benchmarks and start-up only."""
        return self.result(handle)

    def average(self, flat: np.ndarray) -> np.ndarray:
        """Blocking wrapper of `start`."""
        return self.wait(self.start(flat))

    def broadcast(self, flat: np.ndarray) -> np.ndarray:
        """Blocking wrapper of `start_broadcast`."""
        return self.wait(self.start_broadcast(flat))

    def gather(self, row: np.ndarray) -> np.ndarray:
        """Blocking wrapper of `start_gather`: a (size, len(row)) int64 array, in rank order."""
        return self.wait(self.start_gather(row))

    def close(self) -> None:
        """Release what the backend holds (torch's process group); nothing to do here."""


class MpiAverager(SoloAverager):
    """Averages over an MPI communicator of learner ranks with one fused `Iallreduce`."""

    backend = "mpi"

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.spare: np.ndarray | None = None
        """A gradient handed over by an earlier `start`, now free to receive an average into."""

    def start(self, flat: np.ndarray) -> Handle:
        sent = owned_float32(flat)
        # Scaled before the sum, while a fresh gradient is still in cache: the sum is the mean.
        np.multiply(sent, np.float32(1.0 / self.size), out=sent)
        out, self.spare = self.spare, None
        if out is None or out.size != sent.size or np.may_share_memory(out, sent):
            out = np.empty_like(sent)  # first time, or a caller that reused its buffer
        request = self.comm.Iallreduce(sent, out, op=self.MPI.SUM)
        return Handle(out, request, self.size, self._recycle, keep=sent)

    def _recycle(self, handle: Handle) -> np.ndarray:
        self.spare = handle.keep  # the gradient sent is ours again once the sum is complete
        return handle.buffer

    def start_broadcast(self, flat: np.ndarray) -> Handle:
        buffer = owned_float32(flat)
        return Handle(buffer, self.comm.Ibcast(buffer, root=0), self.size)

    def start_gather(self, row: np.ndarray) -> Handle:
        row = np.ascontiguousarray(row, dtype=np.int64).reshape(-1)
        out = np.empty((self.size, row.size), dtype=np.int64)
        return Handle(out, self.comm.Iallgather(row, out), self.size, keep=row)

    def ready(self, handle: Handle) -> bool:
        return bool(handle.request.Test())

    def wait(self, handle: Handle) -> np.ndarray:
        handle.request.Wait()
        return self.result(handle)


BACKENDS = ("auto", "mpi", "horovod", "torch")


def make_averager(
    kind: str, comm: Any, policy: str, device: str = "cpu", store: str = ""
) -> tuple[SoloAverager, str]:
    """The averager for the learners of `policy` on `comm`, and one line saying which and why.

    Every member must pick the same backend or the group would hang, so what each member can
    run is agreed on (one small allgather at start-up): Horovod is used only if every member
    has it, NCCL only if every member trains on a GPU and has it. `auto` takes NCCL, then
    Horovod, then MPI. `store` is the file torch.distributed meets at (in the run directory).
    A group of one needs neither a backend nor a line.
    """
    if kind not in BACKENDS:
        raise ConfigError(f"learner.allreduce={kind!r} is unknown", f"use one of {BACKENDS}")
    if comm is None or comm.Get_size() == 1:
        return SoloAverager(), ""
    peers = Peers(comm.allgather(Peers.local(kind, device)))
    group = f"hpcmarl: learners of policy {policy}"
    size = comm.Get_size()
    if kind == "torch" or (kind == "auto" and peers.nccl_reason is None):
        line = f"{group} average gradients with torch"
        return torch_averager(kind, comm, store, device, peers, line)
    if kind == "mpi":
        return MpiAverager(comm), f"{group} average gradients with mpi ({size} ranks)"
    if peers.horovod_reason is None:
        from .horovod import HorovodAverager

        averager = HorovodAverager(comm, policy)
        return averager, f"{group} average gradients with horovod ({size} ranks)"
    if kind == "auto":
        return MpiAverager(comm), f"{group}: {peers.horovod_reason}, using mpi ({size} ranks)"
    raise ConfigError(
        f"learner.allreduce=horovod but {peers.horovod_reason}",
        "run `bash tools/install_horovod.sh`, or set learner.allreduce=auto or mpi",
    )


class Peers:
    """What every member of a group can run, from one allgather of `Peers.local` rows."""

    def __init__(self, rows: list[tuple[bool, str | None, str | None, str | None]]) -> None:
        self.nccl_reason = first([r[1] for r in rows], "a peer learner")
        """Why NCCL cannot average for the whole group, or None."""
        self.gloo_reason = first([r[2] for r in rows], "a peer learner")
        self.horovod_reason = first([r[3] for r in rows], "a peer learner")

    @staticmethod
    def local(kind: str, device: str) -> tuple[bool, str | None, str | None, str | None]:
        """This member's row: on a GPU, and why NCCL, gloo, Horovod cannot run here (or None,
        also where `kind` does not need to know)."""
        from . import horovod, torch_dist

        cuda = device.startswith("cuda")
        nccl = torch_dist.unavailable_reason(True) if cuda else f"learners train on {device}"
        gloo = torch_dist.unavailable_reason(False) if kind == "torch" else None
        hvd = horovod.unavailable_reason() if kind in ("auto", "horovod") else None
        return cuda, nccl if kind in ("auto", "torch") else None, gloo, hvd


def first(reasons: list[str | None], whose: str) -> str | None:
    """The first reason given, said of `whose` when it is not the first member's own."""
    for i, reason in enumerate(reasons):
        if reason is not None:
            return reason if i == 0 else f"{reason} on {whose}"
    return None


def torch_averager(
    kind: str, comm: Any, store: str, device: str, peers: Peers, line: str
) -> tuple[SoloAverager, str]:
    """NCCL on `device` where every member trains on a GPU that has it, else gloo on the host."""
    from .torch_dist import TorchAverager

    if peers.nccl_reason is not None and peers.gloo_reason is None:
        device = "cpu"
    elif peers.nccl_reason is not None:
        raise ConfigError(
            f"learner.allreduce={kind} but {peers.gloo_reason}",
            "install a torch with torch.distributed, or set learner.allreduce=auto or mpi",
        )
    averager = TorchAverager(comm, store, device)
    return averager, f"{line} ({averager.library}, {comm.Get_size()} ranks)"


def digest(*arrays: np.ndarray) -> int:
    """A 63-bit hash of the bytes of `arrays`: equal weights give equal digests, bit for bit."""
    h = hashlib.blake2b(digest_size=8)
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def drift_report(rows: np.ndarray, members: list[str]) -> str | None:
    """None when every member's (updates, digest) row is the same; else who differs, for a user.

    The reference is the row most members share, the group root's on a tie, so that one learner
    gone astray is the one named.
    """
    keys = [tuple(int(v) for v in row) for row in rows]
    if len(set(keys)) == 1:
        return None
    reference = max(keys, key=lambda k: (keys.count(k), k == keys[0]))
    differ = [m for m, k in zip(members, keys, strict=True) if k != reference]
    agree = [m for m, k in zip(members, keys, strict=True) if k == reference]
    detail = ", ".join(
        f"{m}: update {k[0]} digest {k[1]:016x}" for m, k in zip(members, keys, strict=True)
    )
    return f"{', '.join(differ)} differ from {', '.join(agree)} ({detail})"
