"""An env without a time limit: named at start-up, and its evaluation episodes are cut at
`commander.eval_max_episode_steps` (counted as truncated), so a reached budget ends the run
with its final checkpoint instead of waiting for an episode that never ends and then failing
the checkpoint with a wrong cause."""

from __future__ import annotations

import json

import numpy as np

from hpcmarl.algos.actors import build_actor
from hpcmarl.config.schema import EnvConfig, JobConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.launch.build import build_population, eval_episode_cap, probe_env
from hpcmarl.roles.evaluation import Evaluation

from ..mpi.conftest import run_local

ENDLESS = "hpcmarl.testing.broken:Broken-v0"


def endless_job() -> JobConfig:
    cfg = JobConfig()
    cfg.env = EnvConfig(kind="gymnasium", id=ENDLESS, kwargs={"episode_steps": None})
    return cfg


def test_the_cap_is_the_jobs_the_envs_or_ten_thousand() -> None:
    cfg = endless_job()
    assert eval_episode_cap(cfg, probe_env(cfg)) == 10_000
    cfg.commander.eval_max_episode_steps = 30
    assert eval_episode_cap(cfg, probe_env(cfg)) == 30
    assert eval_episode_cap(JobConfig(), probe_env(JobConfig())) == 500  # CartPole-v1's own


def test_an_endless_evaluation_episode_is_cut_and_counted_as_truncated() -> None:
    cfg = endless_job()
    population = build_population(cfg, probe_env(cfg))
    (key,) = population.keys()
    actor = build_actor(population.spec(key))
    actor.set_weights(np.zeros(population.spec(key).size, np.float32))
    env = make_vector_env(cfg.env, 3, seed=0)
    assert env.unlimited and env.time_limit is None
    evaluation = Evaluation(env, {key: actor}, {"agent_0": key}, max_steps=40)
    steps = 1
    while not evaluation.step():
        steps += 1
    summary = evaluation.summary()
    assert steps == 40 and summary["truncated"] == 3 and summary["length_mean"] == 40.0
    assert summary["return_mean"] == 40.0


def test_a_budget_reached_with_an_endless_env_ends_with_its_checkpoint(tmp_path) -> None:
    """It used to stall for checkpoint.timeout_s, then fail blaming the filesystem."""
    args = [
        "-m",
        "hpcmarl",
        "env.kind=gymnasium",
        f"env.id={ENDLESS}",
        "env.kwargs={episode_steps: null}",
        "replay.learning_starts=50",
        "commander.stop_value=null",
        "commander.max_env_steps=600",
        "commander.deterministic=true",
        "commander.eval_every_rounds=1",
        "commander.eval_max_episode_steps=300",
        "checkpoint.timeout_s=20",
        "topology.collectors=1",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(args, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"warning: {ENDLESS} has no time limit" in result.stdout
    assert "finished: step budget reached" in result.stdout
    assert (tmp_path / "checkpoints" / "latest").exists()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [row for row in rows if row.get("kind") == "eval"]
    assert evals and all(row["truncated"] == row["episodes"] for row in evals)
