"""Signals as flags: a handler only records the signal; the commander acts on it in its loop.

Slurm sends SIGUSR1 (with `--signal`) or SIGTERM before a time limit or on preemption; an
interactive user sends SIGINT. Acting inside the handler could interrupt a half-sent message,
so the handler does nothing but set a flag that the commander polls.
"""

from __future__ import annotations

import signal

_received: list[str] = []


def install() -> None:
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, _record)


def _record(signum: int, frame: object) -> None:
    _received.append(signal.Signals(signum).name)


def requested() -> str:
    """Name of the first signal received, or '' when none."""
    return _received[0] if _received else ""


def clear() -> None:
    _received.clear()
