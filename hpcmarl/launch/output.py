"""Progress lines that outlive their reader: `python -m hpcmarl ... | head -3`.

When `head` has its lines it exits, and every later print to the closed pipe raises
BrokenPipeError, in whichever role happened to print. A run's record is its run directory
(`progress.csv`, `metrics.jsonl`), not the terminal, so a closed stream must not end training:
from the first failed write on, the stream's file descriptor points at /dev/null, its lines are
dropped, and the run ends as it would have, with its own exit code.

A stream that cannot be written at all (`> /dev/full`, a redirect onto a full or read-only
disk) is another matter: it fails with a `UserError`, which at start-up is the usual one line
and exit 2.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from ..errors import UserError


class DroppingStream:
    """A text stream whose writes and flushes survive the reader closing the pipe."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)
        except OSError as err:
            raise self._unwritable(err) from err

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()
        except OSError as err:
            raise self._unwritable(err) from err

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def check(self) -> None:
        """Raise the one-line error now if the stream refuses even an empty write (`> /dev/full`),
        before the run directory is made; a closed pipe passes (its lines are dropped)."""
        try:
            os.write(self._stream.fileno(), b"")
        except BrokenPipeError:
            pass
        except (OSError, ValueError) as err:  # ValueError, io.UnsupportedOperation: no descriptor
            if isinstance(err, OSError) and err.errno is not None:
                raise self._unwritable(err) from err

    def _unwritable(self, err: OSError) -> UserError:
        return UserError(
            f"{self._name} cannot be written ({err.strerror or err})",
            f"redirect {self._name} to a file on a disk with room, or to /dev/null",
        )

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
            setattr(sys, name, DroppingStream(stream, name))


def check_streams_writable() -> None:
    """At start-up, on the rank that prints: refuse stdout or stderr that cannot be written."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, DroppingStream):
            stream.check()
