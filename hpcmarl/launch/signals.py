"""Signals as flags: a handler only records the signal; the commander acts on it in its loop.

Slurm sends SIGUSR1 (with `--signal`) or SIGTERM before a time limit or on preemption; an
interactive user sends SIGINT. Acting inside the handler could interrupt a half-sent message,
so the handler does nothing but set a flag that the commander polls.

The batch script (`slurm/train.sh`) does not pass Slurm's warning on as a signal: one that came
while the ranks were starting would kill a rank that has no handler yet, or be dropped by a
launcher that has not started them. It writes the signal's name into the file named by
`HPCMARL_SIGNAL_FILE` instead, and the commander reads that file as it polls for signals.
`tools/mpirun.sh` does the same with a TERM, INT or HUP of its own (Open MPI's mpirun would end
the ranks on those at once), and sends SIGUSR2, which mpirun forwards to every rank, when the
commander has not read the file (it runs on another host).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

SIGNAL_FILE_ENV = "HPCMARL_SIGNAL_FILE"
FILE_CHECK_INTERVAL_S = 0.25
"""How often the commander looks for the signal file: a stat, a few times a second."""

_received: list[str] = []
_next_file_check = 0.0


CAUGHT = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
"""The signals `install` turns into flags."""


def install() -> None:
    for sig in CAUGHT:
        signal.signal(sig, _record)


def _record(signum: int, frame: object) -> None:
    _received.append(signal.Signals(signum).name)


def requested() -> str:
    """Name of the first signal received (or written into the signal file), or '' when none."""
    if not _received:
        _check_signal_file()
    return _received[0] if _received else ""


_relayed = 0


def relay_to_commander(rank: int) -> None:
    """A rank without the commander that got TERM, INT or HUP of its own (not the USR1 or USR2
    the launcher sends every rank, the commander included) passes it on through the signal
    file, which the commander reads; where there is none, it says that it goes on."""
    global _relayed
    own = [name for name in _received[_relayed:] if name in ("SIGTERM", "SIGINT", "SIGHUP")]
    _relayed = len(_received)
    if not own:
        return
    path = os.environ.get(SIGNAL_FILE_ENV)
    if path and _write_signal_file(path, own[0]):
        print(
            f"hpcmarl: rank {rank} got {own[0]}: asked the commander to checkpoint and stop",
            flush=True,
        )
        return
    print(
        f"hpcmarl: rank {rank} got {own[0]}, which only the commander (rank 0) acts on; this "
        "rank goes on: send it to tools/mpirun.sh or rank 0 to checkpoint and stop",
        flush=True,
    )


def _write_signal_file(path: str, name: str) -> bool:
    try:
        with open(f"{path}.{os.getpid()}.tmp", "w") as fh:
            fh.write(f"{name}\n")
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    except OSError:
        return False
    return True


def stopped_before_start(comm: Any, run_dir: str) -> str:
    """The line that ends a job whose process got a signal before its roles were built (on any
    rank: every rank must agree, or the others would wait for it), or ''.

    Nothing has been trained then, so there is nothing to checkpoint: a Ctrl-C or a preemption
    during the slow start-up stops at once. The code is the checkpointed one (75), so a batch
    script requeues and the run starts again. A signal only written into the signal file (Slurm's
    warning through `slurm/train.sh`) is left to the commander, which checkpoints once the roles
    exist; when `tools/mpirun.sh` relays one as SIGUSR2, the file names the one it got."""
    own = _received[0] if _received else ""
    if comm is not None:
        own = next((name for name in comm.allgather(own) if name), "")
    if not own:
        return ""
    name = _take_signal_file() or own
    return (
        f"hpcmarl: stopped by {name} during start-up, before any training: nothing was lost; "
        f"start it again (python -m hpcmarl resume {run_dir})"
    )


def _take_signal_file() -> str:
    """The written-down signal's name, or ''; the file goes, so that it cannot stop the run when
    it starts again."""
    path = os.environ.get(SIGNAL_FILE_ENV)
    if not path:
        return ""
    try:
        with open(path) as f:
            name = f.read().strip()
        os.remove(path)
    except OSError:
        return ""
    return name if name.startswith("SIG") or not name else f"SIG{name}"


def clear() -> None:
    global _next_file_check, _relayed
    _received.clear()
    _relayed = 0
    _next_file_check = 0.0


def _check_signal_file() -> None:
    """A signal the batch script wrote down counts as received; the file is then removed, so
    that it is read once."""
    global _next_file_check
    path = os.environ.get(SIGNAL_FILE_ENV)
    now = time.monotonic()
    if not path or now < _next_file_check:
        return
    _next_file_check = now + FILE_CHECK_INTERVAL_S
    try:
        with open(path) as f:
            name = f.read().strip() or "SIGUSR1"
    except OSError:
        return
    _received.append(name if name.startswith("SIG") else f"SIG{name}")
    try:
        os.remove(path)
    except OSError:
        pass
