"""The OpenSpiel adapter: one mover per step, its legal actions as the mask, terminal payoffs,
seeded chance, and the games and actions it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.config.schema import EnvConfig, JobConfig
from hpcmarl.envs import ENV_KINDS, make_vector_env
from hpcmarl.envs.vector import MultiAgentVectorEnv, VectorStep
from hpcmarl.errors import EnvError

KUHN = EnvConfig(kind="openspiel", id="kuhn_poker")
LEDUC = EnvConfig(kind="openspiel", id="leduc_poker")
PLAYERS = ["player_0", "player_1"]


def legal_actions(env: MultiAgentVectorEnv, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A uniformly random legal action of every agent (the inactive ones' are ignored)."""
    assert env.action_masks is not None
    actions = {}
    for agent, mask in env.action_masks.items():
        weights = mask / mask.sum(axis=1, keepdims=True)
        actions[agent] = np.array([rng.choice(len(w), p=w) for w in weights])
    return actions


def play(cfg: EnvConfig, seed: int, steps: int, num_envs: int = 3) -> list[VectorStep]:
    env = make_vector_env(cfg, num_envs, seed, with_state=True)
    env.reset()
    rng = np.random.default_rng(7)
    return [env.step(legal_actions(env, rng)) for _ in range(steps)]


def test_the_openspiel_kind_is_a_family() -> None:
    from hpcmarl.config.schema import ENV_FAMILIES

    assert set(ENV_KINDS) == set(ENV_FAMILIES)


def test_kuhn_has_one_mover_per_step_and_zero_sum_terminal_payoffs() -> None:
    env = make_vector_env(KUHN, 3, seed=0, with_state=True)
    obs = env.reset()
    assert env.agents == PLAYERS and env.turn_based and env.has_masks
    assert env.obs_dim("player_0") == 11 and env.n_actions("player_0") == 2
    assert env.state_dim == 22 and obs["player_0"].dtype == np.float32
    rng = np.random.default_rng(0)
    returns, movers, episodes = np.zeros((3, 2)), np.zeros(3, int), 0
    for _ in range(60):
        step = env.step(legal_actions(env, rng))
        active = np.stack([step.active[a] for a in PLAYERS])
        assert (active.sum(axis=0) == 1).all()  # exactly one player acted in every copy
        assert active[0, movers == 0].all()  # player_0 opens every episode
        rewards = np.stack([step.rewards[a] for a in PLAYERS], axis=1)
        assert (rewards[~step.episode_ended] == 0).all()  # poker pays only at the end
        returns += rewards
        for a in PLAYERS:
            np.testing.assert_array_equal(step.terminations[a], step.episode_ended)
            assert not step.truncations[a].any()
        for i in np.flatnonzero(step.episode_ended):
            assert returns[i].sum() == 0 and returns[i, 0] in (-2, -1, 1, 2)
            returns[i], movers[i], episodes = 0, -1, episodes + 1
        movers += 1
        np.testing.assert_array_equal(
            env.states, np.concatenate([step.observations[a] for a in PLAYERS], axis=1)
        )
    assert episodes >= 40


def test_the_mask_is_the_movers_legal_actions_and_all_legal_for_the_others() -> None:
    steps = play(LEDUC, seed=1, steps=200)
    restricted = 0
    for step in steps:
        assert step.action_masks is not None and step.next_action_masks is not None
        for a in PLAYERS:
            assert step.action_masks[a].shape == (3, 3) and step.action_masks[a].dtype == bool
        movers_next = [m.all(axis=1) for m in step.action_masks.values()]
        restricted += int((~np.logical_and(*movers_next)).sum())
        ended = step.episode_ended
        for a in PLAYERS:  # the terminal s' has nothing to choose: every action "legal"
            assert step.next_action_masks[a][ended].all()
    assert restricted > 50  # leduc often rules out fold or raise; only the mover's mask does


def test_a_seeded_run_deals_the_same_cards() -> None:
    first, again, other = play(KUHN, 3, 50), play(KUHN, 3, 50), play(KUHN, 4, 50)
    for a, b in zip(first, again, strict=True):
        for agent in PLAYERS:
            np.testing.assert_array_equal(a.observations[agent], b.observations[agent])
            np.testing.assert_array_equal(a.rewards[agent], b.rewards[agent])
    dealt = [s.observations["player_0"] for s in first]
    assert any(
        not np.array_equal(d, o.observations["player_0"]) for d, o in zip(dealt, other, strict=True)
    )


def test_an_illegal_action_names_the_player_the_action_and_the_legal_set() -> None:
    env = make_vector_env(KUHN, 1, seed=0)
    env.reset()
    with pytest.raises(EnvError) as info:
        env.step({"player_0": np.array([2]), "player_1": np.array([0])})
    assert "player_0 chose action 2" in info.value.cause and "[0, 1]" in info.value.cause
    assert "action_masks" in info.value.fix


def test_a_masked_action_in_leduc_is_caught() -> None:
    env = make_vector_env(LEDUC, 1, seed=0)
    env.reset()
    assert env.action_masks is not None
    mover = next(a for a, m in env.action_masks.items() if not m.all())
    banned = int(np.flatnonzero(~env.action_masks[mover][0])[0])
    with pytest.raises(EnvError, match=f"{mover} chose action {banned}"):
        env.step(dict.fromkeys(PLAYERS, np.array([banned])))


def test_inactive_players_actions_are_ignored() -> None:
    env = make_vector_env(KUHN, 1, seed=0)
    env.reset()
    step = env.step({"player_0": np.array([0]), "player_1": np.array([5])})  # 5: never legal
    assert step.active["player_0"][0] and not step.active["player_1"][0]


def test_game_parameters_come_from_env_kwargs() -> None:
    env = make_vector_env(EnvConfig(kind="openspiel", id="kuhn_poker", kwargs={"players": 3}), 1, 0)
    assert env.agents == ["player_0", "player_1", "player_2"]
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(kind="openspiel", id="kuhn_poker", kwargs={"playerz": 3}), 1, 0)
    assert "playerz" in info.value.cause and "players" in info.value.fix


def test_unknown_game_suggests_close_names() -> None:
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(kind="openspiel", id="kuhn_pokr"), 1, 0)
    assert "kuhn_pokr" in info.value.cause and "'kuhn_poker'" in info.value.fix


def test_simultaneous_game_is_refused_with_the_turn_based_wrapper_as_fix() -> None:
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(kind="openspiel", id="matrix_rps"), 1, 0)
    assert "simultaneous" in info.value.cause
    fixed = info.value.fix.split("env.id=")[1].strip("'")
    env = make_vector_env(EnvConfig(kind="openspiel", id=fixed), 1, 0)  # the fix works
    assert env.agents == PLAYERS


def test_game_without_tensors_is_refused() -> None:
    with pytest.raises(EnvError, match="neither an information_state_tensor"):
        make_vector_env(EnvConfig(kind="openspiel", id="coordinated_mp"), 1, 0)


def test_a_game_without_information_state_observes_its_observation_tensor() -> None:
    env = make_vector_env(EnvConfig(kind="openspiel", id="tic_tac_toe"), 1, 0)
    assert env.obs_dim("player_0") == 27


def test_probe_reports_masks_and_turns() -> None:
    from hpcmarl.launch.build import probe_env

    cfg = JobConfig()
    cfg.env = EnvConfig(kind="openspiel", id="kuhn_poker")
    cfg.agents.mapping = "independent"
    spec = probe_env(cfg)
    assert spec.action_masks and spec.turn_based and spec.agents == PLAYERS
    assert spec.group_spec("player_0", "main").action_masks
    cartpole = probe_env(JobConfig())
    assert not cartpole.action_masks and not cartpole.turn_based


class RandomLegal:
    """An actor that plays a uniformly random legal action (for evaluation bookkeeping)."""

    class spec:  # noqa: N801 - the attributes act_all reads
        agent_ids = 0
        recurrent = 0

    def act(self, obs, rng, *, env_steps, greedy, action_mask=None, **_):
        from hpcmarl.algos.actors import random_actions
        from hpcmarl.algos.contract import ActResult

        return ActResult(random_actions(rng, len(obs), action_mask.shape[1], action_mask))


def test_evaluation_counts_payoffs_that_arrive_while_a_player_waits() -> None:
    from hpcmarl.roles.evaluation import Evaluation

    env = make_vector_env(KUHN, 40, seed=5)
    evaluation = Evaluation(env, {"k": RandomLegal()}, dict.fromkeys(PLAYERS, "k"))
    while not evaluation.step():
        pass
    returns = np.stack([evaluation.agent_returns[a] for a in PLAYERS])
    np.testing.assert_array_equal(returns.sum(axis=0), 0)  # zero-sum in every episode
    assert (np.abs(returns) >= 1).all()  # both players were paid, whoever moved last
