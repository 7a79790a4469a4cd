"""Fault injection for tests: make a chosen role fail on purpose, switched on by environment.

`HPCMARL_FAULT=<role kind or name>:<poll number>[:<action>]` makes that role, on its N-th poll,
`raise` (the default) a RuntimeError, `exit` the process at once with code 17, or `kill` it
with SIGKILL, as `kill -9` or the OOM killer would. Tests use it
to prove that any role's failure ends the whole job quickly instead of hanging it.

`HPCMARL_FAULT_WRITE_DELAY=<role kind or name>:<seconds>[:<writes>]` makes that role's checkpoint
writer wait before it writes, as a slow filesystem would: tests use it to see the role's loop
(and the run's work) go on while its file is written. With `<writes>`, only the role's first
that many checkpoints are slow, so a test pays the delay once rather than at every checkpoint.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_spec: tuple[str, int, str] | None | bool = False
_delayed_writes: dict[str, int] = {}


def _parse() -> tuple[str, int, str] | None:
    raw = os.environ.get("HPCMARL_FAULT", "")
    if not raw:
        return None
    parts = raw.split(":")
    action = parts[2] if len(parts) > 2 else "raise"
    return parts[0], int(parts[1]), action


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
    global _spec
    if _spec is False:
        _spec = _parse()
    if _spec is None:
        return
    target, at_poll, action = _spec  # type: ignore[misc]
    if target not in (role.kind, role.name) or role.polls + 1 != at_poll:
        return
    if action == "exit":
        os._exit(17)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault in {role.name} at poll {at_poll}")
