"""Training groups, the population registry and the actors built from its PolicySpecs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hpcmarl.algos.actors import CategoricalActor, EpsilonGreedyActor, build_actor, random_actions
from hpcmarl.algos.contract import PolicySpec
from hpcmarl.algos.dqn import DQN
from hpcmarl.algos.mapping import resolve_groups
from hpcmarl.algos.ppo import PPO
from hpcmarl.errors import ConfigError
from hpcmarl.population import Population, server_for
from hpcmarl.testing.groups import group_of, job_with


def test_groups_default_to_one_per_policy_and_must_cover_each_policy_once() -> None:
    assert resolve_groups({}, ["p0", "p1"]) == {"p0": ["p0"], "p1": ["p1"]}
    assert resolve_groups({"team": ["p1", "p0"]}, ["p0", "p1"]) == {"team": ["p0", "p1"]}
    refusals = [
        ({"team": ["p0", "p9"]}, "unknown policy id(s) ['p9']"),
        ({"a": ["p0"], "b": ["p0", "p1"]}, "in more than one group"),
        ({"a": ["p0"]}, "leaves policy id(s) ['p1'] out"),
    ]
    for groups, message in refusals:
        with pytest.raises(ConfigError) as info:
            resolve_groups(groups, ["p0", "p1"])
        assert message in str(info.value)


def test_population_round_trip_bindings_and_servers() -> None:
    job = job_with(hidden_sizes=[8])
    population = Population()
    for spec in PPO.policy_specs(group_of(3, 4, agents=2, shared=False), job).values():
        population.add(spec, trainable=True, group="team")
    assert population.keys() == ["main/a0", "main/a1"]
    copy = Population()
    copy.load_state(population.state())
    assert copy.members == population.members
    assert population.bindings({"a0": "a0", "a1": "a1"}, "main") == {
        "a0": "main/a0",
        "a1": "main/a1",
    }
    with pytest.raises(KeyError, match="not in the population"):
        population.bindings({"a0": "nope"}, "main")
    servers = ["ps0", "ps1", "ps2"]
    assert server_for("main/a0", servers) == server_for("main/a0", list(servers))
    assert {server_for(f"main/p{i}", servers) for i in range(30)} == set(servers)
    with pytest.raises(ValueError, match="already"):
        population.add(population.spec("main/a0"), True, "team")


def test_a_new_best_response_freezes_its_groups_earlier_policies() -> None:
    (spec,) = DQN.policy_specs(group_of(3, 4), job_with(hidden_sizes=[8])).values()
    population = Population()
    population.add(spec, trainable=True, group="player_0")
    population.freeze_group("player_0")
    population.add(dataclasses.replace(spec, key="main/shared-1"), True, "player_0")
    assert population.trainable_keys() == ["main/shared-1"]
    copy = Population()
    copy.load_state(population.state())
    assert copy.members["main/shared"].trainable is False and copy.trainable_keys() == [
        "main/shared-1"
    ]


def test_actors_are_built_from_their_spec_and_check_its_layout() -> None:
    job = job_with(hidden_sizes=[8], dqn__eps_start=0.5, dqn__eps_end=0.5)
    (q_spec,) = DQN.policy_specs(group_of(3, 4), job).values()
    (pi_spec,) = PPO.policy_specs(group_of(3, 4), job).values()
    assert isinstance(build_actor(q_spec), EpsilonGreedyActor)
    assert isinstance(build_actor(PolicySpec.from_json(pi_spec.to_json())), CategoricalActor)
    assert q_spec.exploration()["eps_start"] == 0.5 and pi_spec.activation == "tanh"
    broken = PolicySpec(**{**vars(pi_spec), "params": pi_spec.params[:-1]})
    with pytest.raises(ValueError, match="the spec lists"):
        build_actor(broken)
    with pytest.raises(ConfigError, match="actor kind 'beta'"):
        build_actor(PolicySpec(**{**vars(pi_spec), "actor": "beta"}))


def test_masks_are_honoured_by_greedy_exploring_and_sampling_actors() -> None:
    job = job_with(hidden_sizes=[8], dqn__eps_start=0.5, dqn__eps_end=0.5)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((500, 3)).astype(np.float32)
    mask = rng.random((500, 4)) < 0.5
    mask[np.arange(500), rng.integers(0, 4, 500)] = True  # at least one legal action per row
    for algo in (DQN, PPO):
        (spec,) = algo.policy_specs(group_of(3, 4), job).values()
        actor = build_actor(spec)
        actor.set_weights(rng.standard_normal(spec.size).astype(np.float32))
        for greedy in (True, False):
            result = actor.act(obs, rng, env_steps=0, greedy=greedy, action_mask=mask)
            assert mask[np.arange(500), result.actions].all(), (algo.name, greedy)
    random = random_actions(rng, 500, 4, mask)
    assert mask[np.arange(500), random].all()
    single = np.zeros((2000, 4), bool)
    single[:, [1, 3]] = True
    counts = np.bincount(random_actions(rng, 2000, 4, single), minlength=4)
    assert counts[0] == counts[2] == 0 and abs(counts[1] - counts[3]) < 200


def test_categorical_actor_samples_its_softmax() -> None:
    job = job_with(hidden_sizes=[8])
    (spec,) = PPO.policy_specs(group_of(3, 4), job).values()
    actor = CategoricalActor(spec)
    weights = np.zeros(spec.size, np.float32)
    weights[-4:] = [0.0, np.log(2.0), np.log(3.0), np.log(4.0)]  # the output bias: p = k/10
    actor.set_weights(weights)
    obs = np.zeros((20_000, 3), np.float32)
    result = actor.act(obs, np.random.default_rng(1), env_steps=0, greedy=False)
    frequencies = np.bincount(result.actions, minlength=4) / 20_000
    np.testing.assert_allclose(frequencies, [0.1, 0.2, 0.3, 0.4], atol=0.015)
    np.testing.assert_allclose(
        np.exp(result.extras["log_probs"][:4]), (result.actions[:4] + 1) / 10, rtol=1e-5
    )
    greedy = actor.act(obs[:5], np.random.default_rng(1), env_steps=0, greedy=True)
    assert (greedy.actions == 3).all()
