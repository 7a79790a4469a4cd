"""How `make test` deals the suite out to two pytest-xdist workers (`pytest -n 2`).

Most of a test's time here is spent waiting: for a deterministic schedule in which one rank
works at a time, for a heartbeat timeout, for Slurm. Two workers fill those waits with another
module's tests. Each module stays on one worker, with its module fixtures (an earlier run that
several tests read). Two groups span modules:
- `cluster`: the Slurm and multi-host tiers share machine-wide state (the single-node Slurm and
  its time-limit jobs, the namespaces of `tools/local_cluster.sh`, which the tier takes down at
  its end), so one worker runs them all, first, in collection order: the multi-host tests
  while the time-limit jobs run, then the Slurm ones;
- `deterministic`: the deterministic runs that tests/checkpoint/test_deterministic.py trains once
  per session are also read by tests/mpi/test_compact_items.py.
The groups are the scheduler's own (xdist's `xdist_group` marks do not reach pytest 9's node
ids).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

GROUPS = {
    "tests/slurm/": "cluster",
    "tests/multihost/": "cluster",
    "tests/checkpoint/test_deterministic.py": "deterministic",
    "tests/mpi/test_compact_items.py": "deterministic",
}


def group_of(nodeid: str) -> str:
    """The group of a test: its shared-state group, else its module."""
    module = nodeid.split("::")[0]
    for prefix, group in GROUPS.items():
        if module.startswith(prefix):
            return group
    return module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's module-by-module scheduler, with the groups above as its units (under the
    default `--dist load` only: another `--dist` keeps its own)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # by test count, it left 1-test modules of 65 s last

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, the `cluster` group is dealt out first (its Slurm jobs take minutes of
    waiting to run through), the rest in collection order, so the unit tests, many and short,
    come last and fill the end evenly."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=lambda item: group_of(item.nodeid) != "cluster")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist, the worker that runs the `cluster` group starts Slurm's time-limit jobs at
    its first test of the group (without xdist they start when collection ends)."""
    if "PYTEST_XDIST_WORKER" in os.environ and group_of(item.nodeid) == "cluster":
        from .slurm.conftest import start_time_limit_cycle

        start_time_limit_cycle(item.session)
