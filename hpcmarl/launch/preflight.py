"""Checks rank 0 makes once the job is placed, before any rank builds a role or writes a file.

Whatever the job, its overrides, the machine or its files get wrong must end the start-up with
one `hpcmarl: error: ...; fix: ...` line and exit code 2, not with a traceback from a rank deep
in its construction, and must leave nothing behind: the run directory is created last, once
every other check has passed, and removed again if it cannot be written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from ..config.loader import save_resolved
from ..config.schema import JobConfig
from ..errors import ConfigError, UserError
from .run_lock import MARKER_NAME, abandon_run_dir, lock_run_dir, refuse_foreign_dir
from .topology import Topology


def check_allreduce(cfg: JobConfig, topology: Topology) -> None:
    """`learner.allreduce=horovod` where Horovod cannot run is refused here, once, instead of
    on every learner rank while it builds its averager."""
    if cfg.learner.allreduce != "horovod":
        return
    if not any(len(learners) > 1 for learners in topology.learners_of_group.values()):
        return  # no group averages across ranks: no backend is started
    from ..comm import horovod

    reason = horovod.unavailable_reason()
    if reason is not None:
        raise ConfigError(
            f"learner.allreduce=horovod but {reason}",
            "run `bash tools/install_horovod.sh`, or set learner.allreduce=auto or mpi",
        )


def run_dir_of(cfg: JobConfig) -> str:
    """The job's run directory: `runtime.run_dir`, or `runs/<name>-<timestamp>`."""
    return cfg.runtime.run_dir or os.path.join(
        "runs", f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )


def claim_run_dir(run_dir: str) -> None:
    """Before rank 0 reads anything in an existing run directory: refuse a folder of the
    user's that is not a run, and one that another job is running in (run_lock.py)."""
    if not os.path.isdir(run_dir):
        return  # created, and locked, by create_run_dir
    try:
        lock_run_dir(run_dir)
    except OSError:
        return  # not writable: create_run_dir says so, with the fix
    refuse_foreign_dir(run_dir)  # the lock file made for it is removed again on refusal


def create_run_dir(cfg: JobConfig, run_dir: str) -> list[str]:
    """Create the run directory, lock it for this job, mark it as a run and write the
    resolved job into it (`config.yaml`); returns the directories it made, deepest first.

    This is the run's first write, so a directory that cannot be created or written is found
    here, with the fix; the directories made on the way are removed again, so a refused job
    leaves nothing behind.
    """
    existed = os.path.isdir(run_dir)
    made = _missing_dirs(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
        lock_run_dir(run_dir)
        marker = os.path.join(run_dir, MARKER_NAME)
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write("an hpcmarl run directory: hpcmarl writes into it only\n")
        save_resolved(cfg, os.path.join(run_dir, "config.yaml"))
        return made
    except OSError as err:
        abandon_run_dir()
        for path in made:
            try:
                os.rmdir(path)
            except OSError:
                break
        verb = "written" if existed else "created"
        raise UserError(
            f"runtime.run_dir = {run_dir!r} cannot be {verb}: {_why(run_dir, err, existed)}",
            f"choose another runtime.run_dir (a directory you can write), or fix the "
            f"permissions of {_first_existing(run_dir)}",
        ) from None


def unmake_run_dir(run_dir: str, made: Sequence[str]) -> None:
    """Undo `create_run_dir` for a job refused after it (another host cannot use the folder):
    free the lock, and remove the folders it made with what it wrote there. A folder that
    existed before is left, its files with it."""
    abandon_run_dir()
    if not made:
        return
    for name in (MARKER_NAME, "config.yaml"):
        try:
            os.unlink(os.path.join(run_dir, name))
        except OSError:
            pass
    for path in made:
        try:
            os.rmdir(path)
        except OSError:
            break


def _missing_dirs(path: str) -> list[str]:
    """The directories `os.makedirs(path)` would create, deepest first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _first_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _why(run_dir: str, err: OSError, existed: bool) -> str:
    """The reason in words, naming a regular file that stands where a directory must be."""
    blocker = _first_existing(run_dir)
    if not os.path.isdir(blocker):
        return f"{blocker} is a file, not a directory"
    if existed:
        return f"no file can be created in it ({err.strerror or err})"
    return f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
