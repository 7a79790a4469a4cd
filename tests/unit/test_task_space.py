"""Task spaces (pause/resume of collectors) and the epsilon schedule."""

from __future__ import annotations

import pytest

from hpcmarl.algos.actors import linear_epsilon
from hpcmarl.roles.task_space import TaskSpace


def test_task_space_limits_pauses_and_resumes() -> None:
    space = TaskSpace(2)
    assert space.acquire() and space.acquire() and not space.acquire()
    space.decrease()
    space.release()
    assert not space.acquire()
    space.increase()
    assert space.acquire()


def test_failed_or_finished_tasks_release_space_without_going_negative() -> None:
    space = TaskSpace(1)
    space.release()
    assert space.used == 0 and space.acquire()


@pytest.mark.parametrize(("steps", "expected"), [(0, 1.0), (500, 0.55), (1000, 0.1), (5000, 0.1)])
def test_linear_epsilon(steps: int, expected: float) -> None:
    assert linear_epsilon(steps, 1.0, 0.1, 1000) == pytest.approx(expected)
