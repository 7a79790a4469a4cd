"""Signals as flags: a handler only records the signal; the commander acts on it in its loop.

Slurm sends SIGUSR1 (with `--signal`) or SIGTERM before a time limit or on preemption; an
interactive user sends SIGINT. Acting inside the handler could interrupt a half-sent message,
so the handler does nothing but set a flag that the commander polls.

The batch script (`slurm/train.sh`) does not pass Slurm's warning on as a signal: one that came
while the ranks were starting would kill a rank that has no handler yet, or be dropped by a
launcher that has not started them. It writes the signal's name into the file named by
`HPCMARL_SIGNAL_FILE` instead, and the commander reads that file as it polls for signals.
"""

from __future__ import annotations

import os
import signal
import time

SIGNAL_FILE_ENV = "HPCMARL_SIGNAL_FILE"
FILE_CHECK_INTERVAL_S = 0.25
"""How often the commander looks for the signal file: a stat, a few times a second."""

_received: list[str] = []
_next_file_check = 0.0


def install() -> None:
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, _record)


def _record(signum: int, frame: object) -> None:
    _received.append(signal.Signals(signum).name)


def requested() -> str:
    """Name of the first signal received (or written into the signal file), or '' when none."""
    if not _received:
        _check_signal_file()
    return _received[0] if _received else ""


def clear() -> None:
    global _next_file_check
    _received.clear()
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
