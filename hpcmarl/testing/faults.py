"""Fault injection for tests: make a chosen role fail on purpose, switched on by environment.

`HPCMARL_FAULT=<role kind or name>:<poll number>[:<action>]` makes that role, on its N-th poll,
`raise` (the default) a RuntimeError, `exit` the process at once with code 17, or `kill` it
with SIGKILL, as `kill -9` or the OOM killer would. Tests use it
to prove that any role's failure ends the whole job quickly instead of hanging it. In place of
the poll number, a message kind (`stop`, `checkpoint`, ...) makes the fault strike before the
poll that would handle the first such message: a kill at a moment of the protocol, which no
timing from outside the job can hit reliably; `start` strikes the rank hosting the role as it
sets up its transport, while every rank is still in the job's start-up collectives; and
`rank<R>:init:<action>` strikes rank R before it starts MPI (`MPI_Init`).

`HPCMARL_FAULT_WRITE_DELAY=<role kind or name>:<seconds>[:<writes>]` makes that role's checkpoint
writer wait before it writes, as a slow filesystem would: tests use it to see the role's loop
(and the run's work) go on while its file is written. With `<writes>`, only the role's first
that many checkpoints are slow, so a test pays the delay once rather than at every checkpoint.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_spec: tuple[str, int | str, str] | None | bool = False
_delayed_writes: dict[str, int] = {}


def _parse() -> tuple[str, int | str, str] | None:
    raw = os.environ.get("HPCMARL_FAULT", "")
    if not raw:
        return None
    parts = raw.split(":")
    action = parts[2] if len(parts) > 2 else "raise"
    return parts[0], int(parts[1]) if parts[1].isdigit() else parts[1], action


def write_delay(role_kind: str, role_name: str) -> float:
    """Seconds the role's checkpoint writer waits before writing (0 unless a test asks); each
    call is one checkpoint of the role."""
    raw = os.environ.get("HPCMARL_FAULT_WRITE_DELAY", "")
    if not raw:
        return 0.0
    target, seconds, *writes = raw.split(":")
    delayed = _delayed_writes.get(role_name, 0)
    if target not in (role_kind, role_name) or (writes and delayed >= int(writes[0])):
        return 0.0
    _delayed_writes[role_name] = delayed + 1
    return float(seconds)


def maybe_inject(role: Any) -> None:
    """Called before every poll of every role; costs one comparison when no fault is set."""
    spec = _current()
    if spec is None:
        return
    target, at, action = spec
    if target in (role.kind, role.name) and _due(role, at):
        _strike(action, role.name, f"poll {role.polls + 1}")


def strike_at_start(names: list[str], kinds: list[str]) -> None:
    """Called once per rank before its transport is set up, with the roles it will host."""
    spec = _current()
    if spec is not None and spec[1] == "start" and spec[0] in (*names, *kinds):
        _strike(spec[2], ", ".join(names), "start-up")


def strike_before_mpi() -> None:
    """Called once per process before MPI is initialised (its rank from Open MPI's launcher)."""
    spec = _current()
    rank = os.environ.get("OMPI_COMM_WORLD_RANK")
    if spec is not None and spec[1] == "init" and spec[0] == f"rank{rank}":
        _strike(spec[2], spec[0], "start, before MPI_Init")


def _current() -> tuple[str, int | str, str] | None:
    global _spec
    if _spec is False:
        _spec = _parse()
    return _spec  # type: ignore[return-value]


def _strike(action: str, who: str, when: str) -> None:
    if action == "exit":
        os._exit(17)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault in {who} at {when}")


def _due(role: Any, at: int | str) -> bool:
    """At the role's poll number `at`, or before it handles a message of kind `at`."""
    if isinstance(at, int):
        return role.polls + 1 == at
    return any(msg.kind == at for msg in role.inbox)
