"""Memory where the task needs it: R2D2 on CartPole without its velocities beats a
feed-forward DQN, under real mpirun.

Only the cart position and the pole angle are observed, so a policy without memory cannot tell
which way the pole moves: the feed-forward DQN stays near 45 (however many updates it makes),
the random policy near 22; R2D2 (jobs/cartpole_novel_r2d2.yaml) passes 100 by 60k to 80k env
steps and 300 by about 100k (tools/bench_r2d2.py measures the whole curve).

The feed-forward DQN gets 30k env steps, R2D2 80k: the DQN's plateau is reached by 15k and
does not move after (one 80k run, 2026-12-07: best evaluation 26 by 11.5k, 42.0 by 20k, 42.8
by 30k, 44.4 by 40k, 50.0 by 80k), so its last 50k steps (most of the test's time) showed
nothing the first 30k did not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcmarl.envs.partial import ENV_ID

from .conftest import run_mpi
from .test_train import finished_line

R2D2_STEPS = 80000
FEED_FORWARD_STEPS = 30000
BUDGET = [
    "commander.stop_value=null",
    "commander.eval_interval_s=5",
    "checkpoint.interval_s=0",
]
FEED_FORWARD = [
    "jobs/cartpole_dqn.yaml",
    f"env.id=hpcmarl.envs.partial:{ENV_ID}",
    "replay.samples_per_insert=8",
]
"""The default DQN job on the same env, with fewer updates per step to keep CI short (its
plateau does not move with more)."""


def best_eval(tmp_path: Path, job: list[str], steps: int) -> tuple[float, list[float]]:
    budget = [*BUDGET, f"commander.max_env_steps={steps}"]
    args = ["-m", "hpcmarl", job[0], *budget, *job[1:], f"runtime.run_dir={tmp_path}"]
    result = run_mpi(1, args, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search("stop_value reached|step budget reached", finished_line(result.stdout))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r["return_mean"] for r in rows if r["kind"] == "eval"]
    return max(evals), evals


@pytest.mark.mpi
@pytest.mark.slow
def test_r2d2_beats_a_feed_forward_dqn_on_the_velocity_free_cartpole(tmp_path: Path) -> None:
    feed_forward, baseline = best_eval(tmp_path / "dqn", FEED_FORWARD, FEED_FORWARD_STEPS)
    assert feed_forward < 90, baseline  # without memory it cannot balance for long
    floor = max(100.0, feed_forward + 40)  # R2D2 stops at the first evaluation above it
    job = ["jobs/cartpole_novel_r2d2.yaml", f"commander.stop_value={floor + 0.1}"]
    recurrent, curve = best_eval(tmp_path / "r2d2", job, R2D2_STEPS)
    assert recurrent > floor, (curve, baseline)
