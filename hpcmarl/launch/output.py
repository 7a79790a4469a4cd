"""Progress lines that outlive their reader: `python -m hpcmarl ... | head -3`.

When `head` has its lines it exits, and every later print to the closed pipe raises
BrokenPipeError, in whichever role happened to print. A run's record is its run directory
(`progress.csv`, `metrics.jsonl`), not the terminal, so a closed stream must not end training:
from the first failed write on, the stream's file descriptor points at /dev/null, its lines are
dropped, and the run ends as it would have, with its own exit code.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class DroppingStream:
    """A text stream whose writes and flushes survive the reader closing the pipe."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _drop(self) -> None:
        """Point the descriptor at /dev/null: what is still buffered, and every later line,
        goes there, including the interpreter's last flush at exit."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:
            self._stream.flush()
        except BrokenPipeError:
            pass  # the old pipe's bytes were in flight; nothing left to lose


def keep_running_when_streams_close() -> None:
    """Wrap stdout and stderr (`2>&1 | head` closes both) once, at the start of a command."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, DroppingStream):
            setattr(sys, name, DroppingStream(stream))
