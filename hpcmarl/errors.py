"""Errors a user can cause, each carrying its cause and its fix.

Anything raised as `UserError` ends the program with one message and a non-zero exit code,
never a traceback: the user did nothing wrong by reading our internals, so we do not show them.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: bad job file, world too small, unknown environment."""

    exit_code = 2

    def __init__(self, cause: str, fix: str = "") -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(self.message())

    def message(self) -> str:
        return f"{self.cause}; fix: {self.fix}" if self.fix else self.cause


class ConfigError(UserError):
    """A job file or override that does not fit the schema."""


class TopologyError(UserError):
    """A job whose roles cannot be placed on the world it was started with."""


class EnvError(UserError):
    """An environment that cannot be created or does not fit the algorithm."""


class EnvOutputError(EnvError):
    """An env step that returned what training cannot use (a NaN or None reward, an observation
    of the wrong shape): not a passing failure to retry, so the job ends at once, naming the
    env, the agent, the step and the field."""


class ReportedFailure(RuntimeError):
    """A failure one role reported to the commander, which ends the job for it: the failure
    line names the reporting rank and role, and its traceback goes to that rank's file, as if
    the role had failed there (the report got through first, so the run records it)."""

    def __init__(self, rank: int, role: str, cause: str, traceback_text: str) -> None:
        self.rank, self.role, self.cause = rank, role, cause
        self.traceback_text = traceback_text
        super().__init__(cause)
