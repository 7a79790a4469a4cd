"""The torch.distributed backend of the learner collectives (see `allreduce.py` for the interface).

On GPU nodes a group's gradients are averaged on the device with NCCL; on the CPU, or where a
member has no GPU, with gloo. The rendezvous is a `FileStore` in the run directory, which every
host sees (checked at start-up), so there is no address or port to configure (DESIGN §8). The
process group is torch's default one, started on the learner sub-communicator only, so its
ranks are the group's: a rank hosts the learners of one data-parallel group at most
(`Topology.group_color`), and groups trained by the same learners share one process group, as
they share one MPI communicator, posting their collectives in the same order on every member.

The average is the MPI backend's, bit for bit up to the summation order: each member scales its
vector by 1/size on the host, then the vectors are summed. A dead member ends the job through
MPI; `TIMEOUT` only bounds what a collective may wait for a peer should that fail.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import numpy as np

from .allreduce import Handle, SoloAverager, owned_float32

TIMEOUT = timedelta(minutes=30)
"""Longest wait of a collective for a peer (torch's gloo default). A learner waits for its
peers in ordinary running (a peer still sampling, writing a checkpoint), which the stall and
heartbeat checks already bound; this must never fire before them."""


def unavailable_reason(cuda: bool) -> str | None:
    """None when torch.distributed can average here, with NCCL when `cuda`, else with gloo."""
    try:
        import torch.distributed as dist
    except Exception as err:  # noqa: BLE001 - a broken torch is a reason, for a user
        return f"torch.distributed does not import ({type(err).__name__}: {err})"
    if not dist.is_available():
        return "this torch was built without torch.distributed"
    if cuda and not dist.is_nccl_available():
        return "this torch was built without NCCL"
    if not cuda and not dist.is_gloo_available():
        return "this torch was built without gloo"
    return None


class _ProcessGroup:
    """torch's default process group over one MPI communicator, shared by the groups on it."""

    users = 0
    backend = ""
    store: Any = None
    store_path = ""
    LEFT_KEY = "hpcmarl/left"

    @classmethod
    def join(cls, comm: Any, store_path: str, backend: str) -> None:
        """Start the process group (collective over `comm`) or join the one already started."""
        import torch.distributed as dist

        if cls.users == 0:
            if comm.Get_rank() == 0 and os.path.exists(store_path):
                os.remove(store_path)  # a stale store of an earlier run or a crashed one
            comm.Barrier()
            store = dist.FileStore(store_path, comm.Get_size())
            dist.init_process_group(
                backend,
                store=store,
                rank=comm.Get_rank(),
                world_size=comm.Get_size(),
                timeout=TIMEOUT,
            )
            cls.backend, cls.store, cls.store_path = backend, store, store_path
        elif dist.get_world_size() != comm.Get_size() or dist.get_rank() != comm.Get_rank():
            raise RuntimeError(
                f"torch.distributed already runs on another group ({dist.get_world_size()} "
                "ranks); a rank can host the learners of one data-parallel group only"
            )
        cls.users += 1

    @classmethod
    def leave(cls) -> None:
        """Destroy the process group when its last averager closes (a local call).

        The member that leaves last removes the store file. torch removes it in the destructor of
        the last member's store, which need not run before a process exits: CI once found the
        file of a 2-learner group left behind after a clean close.
        """
        import torch.distributed as dist

        cls.users -= 1
        if cls.users > 0 or not dist.is_initialized():
            return
        last = cls.store.add(cls.LEFT_KEY, 1) == dist.get_world_size()
        dist.destroy_process_group()
        cls.store = None
        if last:
            try:
                os.remove(cls.store_path)
            except FileNotFoundError:
                pass  # a copy of the store already removed it on its way out


class TorchAverager(SoloAverager):
    """Averages, broadcasts and gathers with torch.distributed's async ops over the group.

    With NCCL the host vector is copied to the learner's GPU, reduced there and copied back
    when read; with gloo it is reduced in place in the host memory the caller handed over.
    """

    backend = "torch"

    def __init__(self, comm: Any, store_path: str, device: str) -> None:
        import torch

        nccl = device.startswith("cuda")
        if nccl:
            torch.cuda.set_device(torch.device(device))
        _ProcessGroup.join(comm, store_path, "nccl" if nccl else "gloo")
        self.device = torch.device(device if nccl else "cpu")
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.closed = False

    @property
    def library(self) -> str:
        """`nccl` or `gloo`: what averages for this group."""
        return _ProcessGroup.backend

    def start(self, flat: np.ndarray) -> Handle:
        import torch.distributed as dist

        sent = owned_float32(flat)
        np.multiply(sent, np.float32(1.0 / self.size), out=sent)  # as MpiAverager: sum of means
        tensor = self._on_device(sent)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
        return Handle(sent, work, self.size, self._copied_back, keep=tensor)

    def start_broadcast(self, flat: np.ndarray) -> Handle:
        import torch.distributed as dist

        buffer = owned_float32(flat)
        tensor = self._on_device(buffer)
        work = dist.broadcast(tensor, src=0, async_op=True)
        return Handle(buffer, work, self.size, self._copied_back, keep=tensor)

    def start_gather(self, row: np.ndarray) -> Handle:
        import torch
        import torch.distributed as dist

        sent = self._on_device(np.ascontiguousarray(row, dtype=np.int64).reshape(-1))
        rows = [torch.empty_like(sent) for _ in range(self.size)]
        work = dist.all_gather(rows, sent, async_op=True)
        out = np.empty((self.size, sent.numel()), dtype=np.int64)
        return Handle(out, work, self.size, self._gathered, keep=(sent, rows))

    def ready(self, handle: Handle) -> bool:
        return bool(handle.request.is_completed())

    def wait(self, handle: Handle) -> np.ndarray:
        handle.request.wait()
        return self.result(handle)

    def close(self) -> None:
        """Leave the process group (destroyed with its last averager); once."""
        if not self.closed:
            self.closed = True
            _ProcessGroup.leave()

    def _on_device(self, array: np.ndarray) -> Any:
        import torch

        tensor = torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _copied_back(self, handle: Handle) -> np.ndarray:
        handle.request.wait()  # raises a failed collective's error; orders NCCL's stream
        if self.device.type != "cpu":
            handle.buffer[...] = handle.keep.cpu().numpy()
        return handle.buffer

    def _gathered(self, handle: Handle) -> np.ndarray:
        handle.request.wait()
        for i, row in enumerate(handle.keep[1]):
            handle.buffer[i] = row.cpu().numpy()
        return handle.buffer
