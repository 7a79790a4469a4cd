"""Gradient averaging across the learners of one policy, without blocking the rank loop.

`start(flat)` begins an average and returns a handle; `ready(handle)` tests it; `result(handle)`
gives the mean. A group of one returns at once. The MPI backend fuses all gradients of a
network into one flat buffer and averages it with one `Iallreduce` over the learner
sub-communicator, never the whole world.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Handle:
    """An average in flight: the buffer being reduced and its request."""

    def __init__(self, buffer: np.ndarray, request: Any, size: int) -> None:
        self.buffer = buffer
        self.request = request
        self.size = size


class SoloAverager:
    """The group of one: the average of one gradient is itself."""

    backend = "none"
    size = 1

    def start(self, flat: np.ndarray) -> Handle:
        return Handle(flat, None, 1)

    def ready(self, handle: Handle) -> bool:
        return True

    def result(self, handle: Handle) -> np.ndarray:
        return handle.buffer

    def average(self, flat: np.ndarray) -> np.ndarray:
        """Blocking wrapper, for tests and benchmarks."""
        return self.result(self.start(flat))


class MpiAverager(SoloAverager):
    """Averages over an MPI communicator of learner ranks with one fused `Iallreduce`."""

    backend = "mpi"

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.size = comm.Get_size()

    def start(self, flat: np.ndarray) -> Handle:
        buffer = np.ascontiguousarray(flat, dtype=np.float32).copy()
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        return Handle(buffer, request, self.size)

    def ready(self, handle: Handle) -> bool:
        return bool(handle.request.Test())

    def result(self, handle: Handle) -> np.ndarray:
        handle.buffer /= handle.size
        return handle.buffer

    def average(self, flat: np.ndarray) -> np.ndarray:
        handle = self.start(flat)
        handle.request.Wait()
        return self.result(handle)
