"""One job per run directory: rank 0 holds a lock on `RUN_DIR/.hpcmarl-lock` for the job's life.

Two jobs writing one run directory interleave their rows, overwrite each other's checkpoints and
move `latest` under each other's feet. Rank 0 takes an `flock` on the lock file before it writes
anything there and keeps the file open until the process ends, so the kernel lets the lock go
whichever way the job ends. The file also records who holds it (host, PID, Slurm job), for the
message that refuses a second job, and because `flock` may not reach across hosts (some NFS and
Lustre mounts lock per node only): where the lock cannot be taken at all, the record alone
decides.

A job that ends cleanly empties the record. A record left behind by a job that died (same host,
PID gone, or the earlier start of this same requeued Slurm job) is stale and taken over with a
line saying so.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket

from ..errors import UserError

LOCK_NAME = ".hpcmarl-lock"
MARKER_NAME = ".hpcmarl-run"
"""Written when a run directory is created: what tells an hpcmarl run from a user's folder."""
OWN_FILES = {LOCK_NAME, MARKER_NAME, ".slurm-signal", ".slurm-signal.tmp"}
"""Files hpcmarl may find in a run directory before it has made it a run (the batch script
writes a signal that came during start-up into it)."""

_held: RunDirLock | None = None


def is_run_dir(run_dir: str) -> bool:
    """An hpcmarl run: the marker (every run made since it exists) or checkpoints (runs from
    before), or nothing but hpcmarl's own files."""
    if not os.path.isdir(run_dir):
        return True
    names = set(os.listdir(run_dir))
    return MARKER_NAME in names or "checkpoints" in names or names <= OWN_FILES


def refuse_foreign_dir(run_dir: str) -> None:
    """An existing folder with files of its own is the user's, not a run: never write into it
    (its config.yaml would be replaced and rows appended to its CSV files)."""
    if is_run_dir(run_dir):
        return
    raise UserError(
        f"runtime.run_dir = {run_dir!r} is a directory with files that is not an hpcmarl run "
        "(no checkpoints/ and no .hpcmarl-run marker): writing the run there would replace "
        "or append to those files",
        "choose a new or empty runtime.run_dir",
    )


def own_record() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        "slurm_restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    }


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDirLock:
    """The open lock file of a run directory; closing it (or the process ending) frees it."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, LOCK_NAME)
        self.created = not os.path.lexists(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def acquire(self) -> str | None:
        """Take the lock, or raise the refusal naming its holder; returns the line to print
        when a stale lock was taken over."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            self.refuse(self.record())
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            locked = False  # this filesystem cannot lock: the record alone decides
        holder = self.record()
        line = None
        if holder:
            if not self.stale(holder, locked):
                self.refuse(holder)
            line = (
                f"hpcmarl: taking over the stale lock of {self.run_dir}: PID {holder['pid']} "
                f"on {holder['host']} left it and no longer runs there"
            )
        self.write(own_record())
        return line

    @staticmethod
    def stale(holder: dict, locked: bool) -> bool:
        """Whether a left-behind record's job has ended."""
        mine = own_record()
        if holder.get("host") == mine["host"]:
            return locked or not pid_alive(int(holder.get("pid", 0)))
        job = holder.get("slurm_job_id")  # this job's own earlier start, requeued elsewhere
        return (
            bool(job)
            and job == mine["slurm_job_id"]
            and (int(holder.get("slurm_restart", 0)) < mine["slurm_restart"])
        )

    def refuse(self, holder: dict) -> None:
        self.close()
        who = f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        if holder.get("slurm_job_id"):
            who += f" (Slurm job {holder['slurm_job_id']})"
        raise UserError(
            f"runtime.run_dir = {self.run_dir!r} is in use by another hpcmarl job: {who}",
            "wait for that job to end, or choose another runtime.run_dir; if it is gone "
            f"(its host crashed), empty {self.path}",
        )

    def record(self) -> dict:
        os.lseek(self.fd, 0, os.SEEK_SET)
        text = os.read(self.fd, 4096).decode(errors="replace").strip()
        try:
            holder = json.loads(text) if text else {}
        except ValueError:
            holder = {}
        return holder if isinstance(holder, dict) else {}

    def write(self, holder: dict) -> None:
        text = json.dumps(holder).encode() if holder else b""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text, 0)
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_run_dir(run_dir: str) -> None:
    """Rank 0 takes the run directory for this job (once; a later call for the same directory
    does nothing); a stale lock taken over is said in one line."""
    global _held
    if _held is not None and _held.run_dir == run_dir:
        return
    lock = RunDirLock(run_dir)
    line = lock.acquire()
    if line:
        print(line, flush=True)
    _held = lock


def release_run_dir() -> None:
    """A job that ends cleanly empties its record: the next job starts without a line."""
    global _held
    if _held is None:
        return
    try:
        _held.write({})
    except OSError:
        pass
    _held.close()
    _held = None


def abandon_run_dir() -> None:
    """A start-up refused after the lock was taken: free it, and remove the lock file when this
    job made it, so that a refused job leaves nothing behind."""
    global _held
    if _held is None:
        return
    _held.close()
    if _held.created:
        try:
            os.unlink(_held.path)
        except OSError:
            pass
    _held = None
