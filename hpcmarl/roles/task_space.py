"""Task spaces and task ids: the commander's bookkeeping, apart from its messages.

A task space is DI-engine's limited-space container: a task may start only while fewer than
`capacity` tasks of that kind run. Shrinking a collector space pauses collectors (their next
request waits), growing it resumes them; a failed task releases its space like a finished one.
"""

from __future__ import annotations

import itertools


class TaskSpace:
    """At most `capacity` tasks at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def acquire(self) -> bool:
        if self.used >= self.capacity:
            return False
        self.used += 1
        return True

    def release(self) -> None:
        self.used = max(0, self.used - 1)

    def increase(self, n: int = 1) -> None:
        self.capacity += n

    def decrease(self, n: int = 1) -> None:
        """Running tasks finish; only new ones are held back."""
        self.capacity = max(0, self.capacity - n)


_task_ids = itertools.count(1)


def new_task_id(kind: str) -> str:
    return f"{kind}_task_{next(_task_ids)}"
