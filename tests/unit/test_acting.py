"""Acting for several agents at once, and the episode bookkeeping of a collector's steps."""

from __future__ import annotations

import numpy as np

from hpcmarl.algos.actors import build_actor
from hpcmarl.config.schema import EnvConfig, JobConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.launch.build import build_population, probe_env
from hpcmarl.roles.acting import Memory, act_all
from hpcmarl.roles.collector import EpisodeTracker

SPREAD = EnvConfig(
    kind="pettingzoo",
    id="mpe2.simple_spread_v3",
    kwargs={"max_cycles": 25, "continuous_actions": False},
    num_envs=4,
)


def test_agents_sharing_a_key_get_their_own_rows_of_one_forward_pass() -> None:
    cfg = JobConfig()
    cfg.env, cfg.learner.algo = SPREAD, "mappo"
    population = build_population(cfg, probe_env(cfg))
    (key,) = population.keys()
    actor = build_actor(population.spec(key))
    env = make_vector_env(SPREAD, 4, seed=0)
    obs = env.reset()
    bindings = dict.fromkeys(env.agents, key)
    actions, extras = act_all(
        {key: actor}, bindings, obs, np.random.default_rng(5), 0, greedy=False, memory=Memory()
    )
    joined = np.concatenate([obs[a] for a in env.agents])
    whole = actor.act(joined, np.random.default_rng(5), env_steps=0, greedy=False)
    for i, agent in enumerate(env.agents):
        rows = slice(4 * i, 4 * (i + 1))
        np.testing.assert_array_equal(actions[agent], whole.actions[rows])
        np.testing.assert_array_equal(extras[agent]["log_probs"], whole.extras["log_probs"][rows])


def test_episode_returns_are_the_float64_sums_of_the_agents_float32_rewards() -> None:
    env = make_vector_env(SPREAD, 3, seed=1)  # rewards: float distances, three agents
    env.reset()
    tracker = EpisodeTracker(3, index=0)
    returns, lengths = np.zeros(3), np.zeros(3, np.int32)
    expected: list[tuple[float, int]] = []
    rng = np.random.default_rng(0)
    for _ in range(60):
        step = env.step({a: rng.integers(5, size=3) for a in env.agents})
        held = tracker.lengths
        tracker.record(step)
        assert (held == lengths).all()  # a step record's lengths stay as they were
        returns += sum(step.rewards.values())
        lengths += 1
        for i in np.flatnonzero(step.episode_ended):
            expected.append((float(returns[i]), int(lengths[i])))
            returns[i], lengths[i] = 0.0, 0
    summary = tracker.task_summary()
    assert len(expected) > 3
    assert summary["episode_returns"] == [r for r, _ in expected]
    assert summary["episode_lengths"] == [n for _, n in expected]
    assert (tracker.lengths == lengths).all()
