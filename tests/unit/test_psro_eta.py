"""The progress line's ETA of a PSRO run follows its iteration budget: the elapsed time over
the iterations done times those left. Timed by its env steps against the job's out-of-reach
step budget (kuhn_psro: 10^8) it read `eta 41956s` for a run minutes from its end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpcmarl.config.loader import load_job
from hpcmarl.roles.commander import Commander
from hpcmarl.testing.world import OneRank


def commander_of(run_dir: Path, *overrides: str) -> Commander:
    cfg = load_job("jobs/kuhn_psro.yaml", ["psro.iterations=20", *overrides])
    return OneRank(cfg).commander(run_dir)


def eta_printed(commander: Commander, run_dir: Path) -> float | None:
    """The progress row the commander writes, after 100 s of a run stepping 100 env steps/s."""
    now = time.monotonic()
    commander.stats.start, commander.stats._last = now - 100.0, (now - 10.0, 0, 0)
    commander.stats.env_steps = 1_000
    commander.report_progress(force=True)
    commander.sink.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "progress"][-1]["eta_s"]


def test_the_eta_of_a_psro_run_follows_its_iterations(tmp_path: Path) -> None:
    commander = commander_of(tmp_path)
    commander.schedule.iteration, commander.schedule.phase = 5, "between"
    assert eta_printed(commander, tmp_path) == pytest.approx(300.0, abs=1.0)  # 100 s x 15 / 5


def test_the_iteration_in_hand_counts_by_its_training(tmp_path: Path) -> None:
    commander = commander_of(tmp_path, "psro.updates_per_iteration=100")
    schedule = commander.schedule
    schedule.iteration, schedule.phase = 5, "train"  # 4 done, the 5th half trained
    schedule.updates = dict.fromkeys(schedule.updates, 50)
    schedule.steps = [schedule.cfg.steps_per_iteration // 2, 0]
    assert schedule.progress() == pytest.approx(4.5 / 20)
    assert eta_printed(commander, tmp_path) == pytest.approx(100.0 * 15.5 / 4.5, abs=1.0)


def test_before_any_iteration_is_done_the_eta_is_unknown(tmp_path: Path) -> None:
    commander = commander_of(tmp_path)
    assert eta_printed(commander, tmp_path) is None
