"""Ranks lost during a run, as Open MPI's fault tolerance (ULFM) reports them.

Without it, a rank that dies takes the job with it: Open MPI ends every other rank. Started
with `mpirun --with-ft ulfm` (what `tools/mpirun.sh` passes when the job asks for
`runtime.fault_tolerance: collectors`), the survivors go on, and MPI tells them instead: a
receive from any source, a send to the dead rank or a collective over it completes in error
(`MPI_ERR_PROC_FAILED`). `comm.Get_failed()` then names every rank known dead, and
`comm.Ack_failed()` lets receives from any source go on. On one host every survivor learned of
a `kill -9` within 10 ms; across two hosts within 1 s (FACTS.md).

Two traps shape what the transport does with it: a barrier over a dead rank fails, so the ranks
that are left agree to stop with `Iagree` instead; and `MPI_Finalize` hangs once a rank is
gone, so the process leaves with `os._exit` after flushing its output (`exit_now`); a rank
that fails leaves by SIGKILL instead (`die_seen`), as only a signal makes its peers hear of it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

FT_ENV = "OMPI_MCA_mpi_ft_enable"
"""Set to 1 in every rank by `mpirun --with-ft ulfm`."""


def ulfm_enabled() -> bool:
    """Whether this process runs under Open MPI with fault tolerance on: only then may a rank
    die without ending the job."""
    return os.environ.get(FT_ENV) == "1"


def is_peer_failure(err: BaseException) -> bool:
    """Whether an MPI error says a peer rank is gone (not a bug of ours)."""
    from mpi4py import MPI

    if not isinstance(err, MPI.Exception):
        return False
    failed = {
        getattr(MPI, name)
        for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
        if hasattr(MPI, name)
    }
    try:
        return err.Get_error_class() in failed
    except Exception:  # noqa: BLE001 - an error without a class is not one of ours
        return False


def may_be_peer_failure(err: BaseException) -> bool:
    """A peer's death, or an error of several requests (`Testsome`'s `MPI_ERR_IN_STATUS`) that
    may hide one: each request is then tested alone to tell (`RequestPool`)."""
    from mpi4py import MPI

    if is_peer_failure(err):
        return True
    try:
        return isinstance(err, MPI.Exception) and err.Get_error_class() == MPI.ERR_IN_STATUS
    except Exception:  # noqa: BLE001
        return False


class LostRanks:
    """The ranks of `comm` known dead, and those learned since the roles last asked."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.known: set[int] = set()
        self.unseen: set[int] = set()
        """Lost ranks the rank's roles have not been told of yet (`take_unseen`)."""

    def refresh(self) -> set[int]:
        """Ask MPI which ranks are dead, acknowledge them so that receives from any source go
        on, and return the ones not known before."""
        from mpi4py import MPI

        failed = self.comm.Get_failed()
        try:
            ranks = MPI.Group.Translate_ranks(
                failed, list(range(failed.Get_size())), self.comm.Get_group()
            )
        finally:
            failed.Free()
        self.comm.Ack_failed()
        new = {int(r) for r in ranks} - self.known
        self.known |= new
        self.unseen |= new
        return new

    def take_unseen(self) -> set[int]:
        unseen, self.unseen = self.unseen, set()
        return unseen

    def agreement(self, bits: int = 1) -> tuple[Any, Any]:
        """A nonblocking agreement of the ranks left, the barrier of a world with holes, on
        the AND of every rank's `bits`: the request, and the flag that holds the result once it
        completes (keep it alive until then)."""
        import numpy as np

        flag = np.full(1, bits, np.intc)
        return self.comm.Iagree(flag), flag


def die_seen() -> None:
    """End this rank so that its peers learn of it: under ULFM a rank that exits without
    `MPI_Finalize` stays a zombie its peers never hear of (measured: `os._exit(1)` left the
    other ranks waiting for good), while one killed by a signal is reported within
    milliseconds."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def exit_now(code: int) -> None:
    """Leave without `MPI_Finalize`, which hangs once a rank of the world is gone."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
