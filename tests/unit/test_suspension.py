"""A job suspended whole is not training: the commander leaves the gap out of the run's elapsed
time, which `commander.max_wall_time_s` limits; a rank 0 that was busy (its CPU time went on)
was training, and that time counts. The real suspension, under mpirun, is tests/mpi/test_suspend.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpcmarl.config.loader import load_job
from hpcmarl.roles.commander import Commander
from hpcmarl.testing.world import OneRank

GAP_S = 100.0
"""Seconds the commander's loop stood still; more than half of the 120 s heartbeat timeout."""


def commander_after_a_gap(tmp_path: Path, cpu_s: float) -> Commander:
    """A commander 150 s into its run whose loop stood still for the last `GAP_S` seconds, with
    `cpu_s` of its own CPU time spent in them."""
    commander = OneRank(
        load_job(None, ["commander.max_wall_time_s=120", "checkpoint.at_end=false"])
    ).commander(tmp_path)
    now = time.monotonic()
    commander.stats.start = now - 150.0
    commander.last_loop = (now - GAP_S, time.process_time() - cpu_s)
    commander.notice_suspension()
    return commander


def test_a_suspension_does_not_count_as_wall_time(tmp_path: Path) -> None:
    commander = commander_after_a_gap(tmp_path, cpu_s=0.0)
    assert 49.0 < commander.stats.elapsed() < 60.0  # 150 s, less the 100 s suspended
    commander.check_stop_conditions()
    assert commander.stop_reason == ""


def test_a_busy_rank_0_counts_as_wall_time(tmp_path: Path) -> None:
    commander = commander_after_a_gap(tmp_path, cpu_s=GAP_S)
    assert commander.stats.elapsed() >= 150.0
    commander.check_stop_conditions()
    assert "wall-time limit reached" in str(commander.stop_reason)
