"""Turn-based games and action masks under real mpirun: Kuhn poker self-play by independent DQN
never plays an illegal move, and DQN learns the masked test env beyond random legal play."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.testing import masked

from .conftest import run_mpi
from .test_train import check_run_dir, finished_line

MASKED_ID = f"hpcmarl.testing.masked:{masked.ENV_ID}"
MASKED_JOB = [
    f"env.id={MASKED_ID}",
    "env.num_envs=4",
    "learner.gamma=0.5",
    "learner.hidden_sizes=[64]",
    "learner.updates_per_task=50",
    "learner.dqn.eps_decay_steps=3000",
    "learner.dqn.target_network_update_freq=50",
    "replay.learning_starts=500",
    "replay.samples_per_insert=8",
    "collector.fragment_length=10",
    "commander.stop_value=null",
    "commander.max_env_steps=10000",
    "commander.eval_interval_s=1",
    "commander.eval_episodes=20",
    "checkpoint.interval_s=0",
    "topology.collectors=1",
    "topology.learners=1",
    "topology.replay_shards=1",
]
MARGIN = 1.0
"""Return a learner must beat random legal play by (per 10-step episode; the best legal play
earns 2.8 more, and 20 evaluation episodes have a standard error of about 0.3)."""


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def no_illegal_action(result, run_dir: Path) -> None:
    """An illegal action raises in the env; a collector reports it as a failed task."""
    failed = [r for r in metrics(run_dir) if r["kind"] == "task_failed"]
    assert not failed, failed[:3]
    assert "illegal" not in result.stdout + result.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 5])
def test_kuhn_self_play_runs_and_never_plays_an_illegal_action(tmp_path: Path, ranks: int) -> None:
    """The job file as it is, for 8 s of its training clock (its 30,000 steps took 140 s of a
    loaded full suite at `-n 5`): legality and the zero-sum returns show from the first
    evaluations. A step budget is no clock: an idle machine ran 15,000 steps in 2.1-2.4 s at
    -n 1, and the stop came before the one evaluation due in that time finished, or began."""
    budget = ["commander.max_wall_time_s=8", "commander.max_env_steps=10000000"]
    args = ["-m", "hpcmarl", "jobs/kuhn_dqn.yaml", *budget, f"runtime.run_dir={tmp_path}"]
    result = run_mpi(ranks, args, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "wall-time limit reached" in finished_line(result.stdout)
    check_run_dir(tmp_path)
    no_illegal_action(result, tmp_path)
    evals = [r for r in metrics(tmp_path) if r["kind"] == "eval"]
    assert evals and set(evals[-1]["agent_returns"]) == {"player_0", "player_1"}
    for row in evals:  # zero-sum: what one player wins the other loses
        assert sum(row["agent_returns"].values()) == pytest.approx(0.0, abs=1e-9)


def random_legal_return(episodes: int = 400) -> float:
    """Mean episode return of uniformly random legal play, measured here."""
    env = make_vector_env(EnvConfig(id=MASKED_ID), episodes, seed=123)
    env.reset()
    rng, total = np.random.default_rng(0), np.zeros(episodes)
    running = np.ones(episodes, bool)
    while running.any():
        assert env.action_masks is not None
        mask = env.action_masks["agent_0"]
        action = np.array([rng.choice(np.flatnonzero(row)) for row in mask])
        step = env.step({"agent_0": action})
        total += np.where(running, step.rewards["agent_0"], 0.0)
        running &= ~step.episode_ended
    return float(total.mean())


MASKED_QMIX = [
    "learner.algo=qmix",
    "learner.batch_size=16",
    "learner.qmix.episode_limit=10",
    "learner.qmix.rnn_hidden=32",
    "learner.qmix.eps_decay_steps=3000",
    "learner.qmix.target_network_update_freq=50",
    "replay.learning_starts=50",
    "replay.samples_per_insert=4",
    "replay.error_buffer=200",
]
"""A team of one recurrent agent on the same env: masks as columns of prioritized episode
items, the masked argmax of its targets and of its actor."""


@pytest.mark.mpi
@pytest.mark.parametrize("algo", [[], MASKED_QMIX], ids=["dqn", "qmix"])
def test_masked_learners_learn_beyond_random_legal_play(tmp_path: Path, algo: list[str]) -> None:
    baseline = random_legal_return()
    assert baseline == pytest.approx(10 * masked.RANDOM_STEP_VALUE, abs=0.3)
    args = ["-m", "hpcmarl", *MASKED_JOB, *algo, f"runtime.run_dir={tmp_path}"]
    result = run_mpi(1, args, 180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step budget reached" in finished_line(result.stdout)
    no_illegal_action(result, tmp_path)
    evals = [r["return_mean"] for r in metrics(tmp_path) if r["kind"] == "eval"]
    assert evals and max(evals) > baseline + MARGIN, (baseline, evals)
