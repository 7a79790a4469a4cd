"""The Horovod backend of the learner collectives (see `allreduce.py` for the interface).

Horovod is started on the learner sub-communicator of one policy only (`hvd.init(comm=...)`),
so its process set is exactly the learner ranks of that policy and the other ranks never run
Horovod's background thread. The alternative, `hvd.init(process_sets=[...])` on every rank of
the world, would make every collector and replay shard wake Horovod's coordination loop every
millisecond for collectives it never takes part in. A rank hosts at most one learner group, so
one Horovod per process is enough.

Each operation carries a stable name (`<policy>.grad`, ...): Horovod matches operations across
ranks by name, and a stable name lets its response cache skip the negotiation after the first
step. At most one operation per name is in flight, which the learner's lockstep guarantees.

`HPCMARL_NO_HOROVOD=1` hides an installed Horovod, so that `learner.allreduce=auto` can be seen
falling back to MPI on a machine that has it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .allreduce import Handle, SoloAverager, owned_float32

HIDE_VAR = "HPCMARL_NO_HOROVOD"


def unavailable_reason() -> str | None:
    """None when `horovod.torch` imports and was built with MPI; else why not, for a user."""
    if os.environ.get(HIDE_VAR, "") not in ("", "0"):
        return f"horovod is hidden by {HIDE_VAR}=1"
    try:
        import horovod.torch as hvd
    except ModuleNotFoundError as err:
        if (err.name or "").startswith("horovod"):
            return "horovod is not installed"
        return f"horovod does not import (ModuleNotFoundError: {err})"
    except Exception as err:  # noqa: BLE001 - a broken build (ABI, missing library) is a reason
        return f"horovod does not import ({type(err).__name__}: {err})"
    if not hvd.mpi_built():
        return "horovod was built without MPI"
    return None


def init_horovod(comm: Any) -> Any:
    """`horovod.torch`, initialised on `comm` (collective over `comm`; once per process)."""
    import horovod.torch as hvd

    if not hvd.is_initialized():
        hvd.init(comm=comm)
    elif hvd.size() != comm.Get_size() or hvd.rank() != comm.Get_rank():
        raise RuntimeError(
            f"horovod already runs on another communicator ({hvd.size()} ranks); "
            "a rank can host the learners of one data-parallel group only"
        )
    return hvd


class HorovodAverager(SoloAverager):
    """Averages, broadcasts and gathers with Horovod's async ops over the group's process set."""

    backend = "horovod"

    def __init__(self, comm: Any, tag: str) -> None:
        self.hvd = init_horovod(comm)
        self.process_set = self.hvd.global_process_set
        self.size = self.hvd.size()
        self.rank = self.hvd.rank()
        self.tag = tag

    def start(self, flat: np.ndarray) -> Handle:
        import torch

        buffer = owned_float32(flat)
        request = self.hvd.allreduce_async_(
            torch.from_numpy(buffer),
            name=f"{self.tag}.grad.{buffer.size}",
            op=self.hvd.Average,
            process_set=self.process_set,
        )
        return Handle(buffer, request, self.size, self._in_place)

    def start_broadcast(self, flat: np.ndarray) -> Handle:
        import torch

        buffer = owned_float32(flat)
        request = self.hvd.broadcast_async_(
            torch.from_numpy(buffer),
            0,
            name=f"{self.tag}.weights.{buffer.size}",
            process_set=self.process_set,
        )
        return Handle(buffer, request, self.size, self._in_place)

    def start_gather(self, row: np.ndarray) -> Handle:
        import torch

        sent = np.ascontiguousarray(row, dtype=np.int64).reshape(1, -1)
        request = self.hvd.allgather_async(
            torch.from_numpy(sent),
            name=f"{self.tag}.digest.{sent.size}",
            process_set=self.process_set,
        )
        return Handle(sent, request, self.size, self._gathered, keep=sent)

    def ready(self, handle: Handle) -> bool:
        return bool(self.hvd.poll(handle.request))

    def wait(self, handle: Handle) -> np.ndarray:
        return self.result(handle)  # synchronize blocks until done

    def _in_place(self, handle: Handle) -> np.ndarray:
        self.hvd.synchronize(handle.request)  # also frees Horovod's handle
        return handle.buffer

    def _gathered(self, handle: Handle) -> np.ndarray:
        return self.hvd.synchronize(handle.request).numpy()
