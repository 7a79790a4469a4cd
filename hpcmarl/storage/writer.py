"""A role's checkpoint file written by a thread, while the role goes on polling.

A role's state is snapshotted at the cut (in its own loop, where nothing else changes it), and
the snapshot is written here. h5py and hashlib release the GIL while they write and hash, so the
role keeps answering messages and sending heartbeats: a replay shard writing many GiB is no
longer mistaken for a hung rank, and its collectors keep collecting.

`snapshot` makes the tree safe to write later: every array the role might still change is
copied. An array the role owns outright and at least `TRUSTED_BYTES` large is taken as built
for the snapshot (a table's `state()` gathers its rows into new arrays), and `Pieces` are views
their owner keeps unchanged until `done()` says the file is written.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import write_role_state
from .hdf5 import FileRecord, Pieces, Tree

TRUSTED_BYTES = 64 << 20
"""Arrays smaller than this are always copied into a snapshot: the copy costs next to nothing."""


def snapshot(tree: Any) -> Any:
    """`tree` with every array the role could still modify copied (see the module docstring)."""
    if isinstance(tree, dict):
        return {key: snapshot(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(snapshot(value) for value in tree)
    if isinstance(tree, np.ndarray):
        return tree if tree.flags.owndata and tree.nbytes >= TRUSTED_BYTES else tree.copy()
    if isinstance(tree, np.generic):
        return tree.copy()
    return tree


def tree_nbytes(tree: Any) -> int:
    """The bytes of array data in a tree: what the file will hold, before compression."""
    if isinstance(tree, dict):
        return sum(tree_nbytes(value) for value in tree.values())
    if isinstance(tree, list):
        return sum(tree_nbytes(value) for value in tree)
    if isinstance(tree, (np.ndarray, np.generic, Pieces)):
        return int(tree.nbytes)
    return 0


WRITER_NICE = 10
"""Niceness of a writer thread: on a node whose cores the ranks already fill, the run's own
work goes first and the write takes the time left over; on an idle node (a checkpoint that
ends the run, or spare cores) it costs nothing."""


def lower_priority() -> None:
    """Make the calling thread yield the CPU to the rank's loop (Linux sets niceness per
    thread); elsewhere, or where refused, nothing changes."""
    try:
        thread = threading.get_native_id()
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, niceness + WRITER_NICE))
    except (AttributeError, OSError):
        pass


HDF5_OVERHEAD = 64 << 10
"""Bytes a file needs beyond its arrays (superblock, object headers, attributes), at most."""


class DiskFullError(OSError):
    """A checkpoint file that does not fit on the run directory's filesystem (errno ENOSPC;
    its text is the one line, without the `[Errno 28]` prefix)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = errno.ENOSPC


def disk_full(run_dir: str | Path, ckpt_id: str, role: str, nbytes: int) -> DiskFullError:
    """The one line for a full disk: where, how much was needed and free, and what to do."""
    free = shutil.disk_usage(run_dir).free
    needed = nbytes + HDF5_OVERHEAD
    return DiskFullError(
        f"no space left on the disk of {run_dir}: {role}'s file of checkpoint {ckpt_id} needs "
        f"about {needed:,} bytes and {free:,} bytes are free; fix: free at least "
        f"{max(needed - free, 0):,} bytes there (other runs, or lower checkpoint.keep), then "
        f"`python -m hpcmarl resume {run_dir}` continues from its newest complete checkpoint",
    )


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC, as the OS raises it or as HDF5 words it inside h5py's RuntimeError ("file write
    failed: ... errno = 28, error message = 'No space left on device'")."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    return isinstance(err, RuntimeError | OSError) and f"errno = {errno.ENOSPC}," in str(err)


def check_room(run_dir: str | Path, ckpt_id: str, role: str, nbytes: int) -> None:
    """Refuse a write that cannot fit before HDF5 starts it: HDF5 meets a full disk only when it
    flushes or closes, and h5py's finalizers then print tracebacks of their own."""
    if shutil.disk_usage(run_dir).free < nbytes + HDF5_OVERHEAD:
        raise disk_full(run_dir, ckpt_id, role, nbytes)


class CheckpointWriter:
    """Writes one role's part of a checkpoint on a thread of its own."""

    def __init__(
        self, run_dir: str | Path, ckpt_id: str, role: str, tree: Tree, delay_s: float = 0.0
    ) -> None:
        self.ckpt_id, self.role, self.delay_s = ckpt_id, role, delay_s
        self.nbytes = tree_nbytes(tree)
        self.started = time.monotonic()
        self.seconds = 0.0
        self._record: FileRecord | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._write,
            args=(run_dir, tree),
            name=f"hpcmarl-checkpoint-{role}",
            daemon=True,  # a failing rank must not wait for it: the file is atomic anyway
        )
        self._thread.start()

    def _write(self, run_dir: str | Path, tree: Tree) -> None:
        lower_priority()
        try:
            time.sleep(self.delay_s)  # only where a test asks (testing.faults.write_delay)
            check_room(run_dir, self.ckpt_id, self.role, self.nbytes)
            self._record = write_role_state(run_dir, self.ckpt_id, self.role, tree)
        except DiskFullError as err:  # handed to the role's own loop by result()
            self._error = err
        except BaseException as err:
            self._error = err
            if is_disk_full(err):  # the one line; HDF5's own words stay in the traceback file
                self._error = disk_full(run_dir, self.ckpt_id, self.role, self.nbytes)
                self._error.__cause__ = err
        self.seconds = time.monotonic() - self.started

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float) -> bool:
        """Wait for the file to be written or to fail, at most `timeout_s`; True when it is."""
        self._thread.join(timeout_s)
        return self.done()

    def result(self) -> FileRecord:
        """The file's record once written; the writer's error, raised in the caller's thread."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._record is not None
        return self._record
