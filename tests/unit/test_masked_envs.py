"""Masks through the env layer: gymnasium's `info["action_mask"]`, PettingZoo's observation
dicts, the masked test env; and no mask arrays at all for envs without masks."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest

from hpcmarl.config.loader import load_job
from hpcmarl.config.schema import EnvConfig, JobConfig
from hpcmarl.envs import MultiAgentVectorEnv, make_vector_env
from hpcmarl.envs.adapters import ParallelCopy
from hpcmarl.errors import EnvError
from hpcmarl.testing import masked

MASKED = EnvConfig(kind="gymnasium", id=f"hpcmarl.testing.masked:{masked.ENV_ID}")


def mean_step_reward(pick: str, steps: int = 400) -> float:
    env = make_vector_env(MASKED, 8, seed=0)
    obs, rng, total = env.reset(), np.random.default_rng(0), 0.0
    for _ in range(steps):
        assert env.action_masks is not None
        mask = env.action_masks["agent_0"]
        context = obs["agent_0"][:, 0].astype(int)
        if pick == "best":
            action = np.where(mask, masked.VALUES[context], -1).argmax(1)
        else:
            action = random_legal(rng, mask)
        step = env.step({"agent_0": action})
        total += float(step.rewards["agent_0"].sum())
        obs = step.observations
    return total / (8 * steps)


def random_legal(rng: np.random.Generator, mask: np.ndarray) -> np.ndarray:
    return np.array([rng.choice(np.flatnonzero(row)) for row in mask])


def test_the_masked_env_shows_a_changing_mask_and_pays_for_the_best_legal_action() -> None:
    env = make_vector_env(MASKED, 4, seed=0)
    obs = env.reset()
    assert env.has_masks and not env.turn_based and env.obs_dim("agent_0") == 5
    assert env.action_masks is not None
    first = env.action_masks["agent_0"].copy()
    assert (first.sum(1) == masked.LEGAL_PER_STEP).all()
    np.testing.assert_array_equal(obs["agent_0"][:, 1:], first)  # the observation shows it
    step = env.step({"agent_0": np.argmax(first, axis=1)})
    assert step.next_action_masks is not None and step.action_masks is not None
    assert not np.array_equal(step.action_masks["agent_0"], first)
    assert mean_step_reward("random") == pytest.approx(masked.RANDOM_STEP_VALUE, abs=0.03)
    assert mean_step_reward("best") == pytest.approx(masked.BEST_STEP_VALUE, abs=0.03)


def test_the_masked_env_ends_episodes_and_hands_on_the_reset_mask() -> None:
    env = make_vector_env(MASKED, 2, seed=1)
    env.reset()
    rng = np.random.default_rng(0)
    for t in range(1, 11):
        assert env.action_masks is not None
        step = env.step({"agent_0": random_legal(rng, env.action_masks["agent_0"])})
        assert step.episode_ended.tolist() == [t == 10] * 2
    assert step.truncations["agent_0"].all() and step.action_masks is not None
    assert step.next_action_masks is not None
    np.testing.assert_array_equal(step.observations["agent_0"][:, 1:], step.action_masks["agent_0"])


def test_choosing_a_masked_action_is_caught() -> None:
    env = make_vector_env(MASKED, 1, seed=0)
    env.reset()
    assert env.action_masks is not None
    banned = np.flatnonzero(~env.action_masks["agent_0"][0])[:1]
    with pytest.raises(masked.IllegalAction) as info:
        env.step({"agent_0": banned})
    assert isinstance(info.value, EnvError) and f"action {banned[0]} is illegal" in info.value.cause


def test_a_job_names_the_masked_env_by_module_and_id() -> None:
    from hpcmarl.launch.build import item_specs, probe_env

    cfg = load_job(None, ["env.id=" + MASKED.id])
    spec = probe_env(cfg)
    assert spec.action_masks and not spec.turn_based
    (items,) = item_specs(cfg, spec).values()
    assert items.column("next_action_masks").shape == (4,)


def test_an_env_without_masks_allocates_no_mask_arrays() -> None:
    env = make_vector_env(EnvConfig(), 2, seed=0)
    env.reset()
    step = env.step({"agent_0": np.zeros(2, np.int64)})
    assert not env.has_masks and env.action_masks is None
    assert step.action_masks is None and step.next_action_masks is None
    assert "action_masks" not in probe_env_items(JobConfig())


def probe_env_items(cfg: JobConfig) -> tuple[str, ...]:
    from hpcmarl.launch.build import item_specs, probe_env

    (items,) = item_specs(cfg, probe_env(cfg)).values()
    return items.names


class DictObsEnv:
    """A parallel env in PettingZoo's classic style: observations are {observation,
    action_mask} dicts; agent `b` may only play action t % 3 at step t."""

    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Dict(
            {
                "observation": gymnasium.spaces.Box(-10, 10, (2,)),
                "action_mask": gymnasium.spaces.MultiBinary(3),
            }
        )

    def action_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Discrete(3)

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict]:
        self.agents, self.t = ["a", "b"], 0
        return self._obs(), {}

    def step(self, actions: dict[str, int]) -> tuple[dict[str, Any], ...]:
        assert actions["b"] == self.t % 3, "b chose a masked action"
        self.t += 1
        done = {a: self.t == 2 for a in self.agents}
        obs = self._obs()
        if self.t == 2:
            self.agents = []
        return obs, dict.fromkeys(obs, 1.0), done, dict.fromkeys(obs, False), {}

    def close(self) -> None:
        pass

    def _obs(self) -> dict[str, Any]:
        b_mask = np.zeros(3, np.int8)
        b_mask[self.t % 3] = 1
        return {
            "a": {"observation": np.full(2, float(self.t)), "action_mask": np.ones(3, np.int8)},
            "b": {"observation": np.full(2, -float(self.t)), "action_mask": b_mask},
        }


def test_pettingzoo_observation_dicts_give_masks_and_only_the_observation_part() -> None:
    env = MultiAgentVectorEnv([ParallelCopy(DictObsEnv(), "dict")], seed=0)
    assert env.obs_dim("b") == 2  # the mask is not part of the observation
    obs = env.reset()
    assert env.has_masks and env.action_masks is not None
    assert obs["b"][0].tolist() == [0.0, 0.0]
    assert env.action_masks["b"].tolist() == [[True, False, False]]
    step = env.step({"a": np.array([2]), "b": np.array([0])})
    assert step.action_masks is not None and step.action_masks["b"].tolist() == [
        [False, True, False]
    ]
    assert step.observations["b"][0].tolist() == [-1.0, -1.0]
    last = env.step({"a": np.array([0]), "b": np.array([1])})
    assert last.episode_ended[0] and last.action_masks is not None
    assert last.action_masks["b"].tolist() == [[True, False, False]]  # the reset's mask


TICTACTOE = EnvConfig(kind="pettingzoo", id="pettingzoo.classic.tictactoe_v3")
OLD_PETTINGZOO_API = pytest.mark.filterwarnings("ignore:The old environment creation API")
"""PettingZoo's classic modules warn on import about their own creation API."""


@OLD_PETTINGZOO_API
def test_an_aec_classic_game_is_played_turn_by_turn_with_the_movers_mask() -> None:
    env = make_vector_env(TICTACTOE, 2, seed=0, with_state=True)
    env.reset()
    assert env.turn_based and env.has_masks and env.agents == ["player_1", "player_2"]
    assert env.obs_dim("player_1") == 18 and env.n_actions("player_1") == 9
    rng, moves, ended = np.random.default_rng(0), np.zeros(2, int), 0
    returns = np.zeros((2, 2))
    for _ in range(40):
        assert env.action_masks is not None
        mover = np.where(moves % 2 == 0, 0, 1)  # player_1 opens every game
        for i, k in enumerate(mover):  # the mover's free squares; the other may do anything
            mask = env.action_masks[env.agents[k]][i]
            assert mask.sum() == 9 - moves[i] and env.action_masks[env.agents[1 - k]][i].all()
        step = env.step({a: random_legal(rng, env.action_masks[a]) for a in env.agents})
        active = np.stack([step.active[a] for a in env.agents])
        np.testing.assert_array_equal(active[1], mover == 1)
        assert (active.sum(0) == 1).all()
        returns += np.stack([step.rewards[a] for a in env.agents], axis=1)
        moves += 1
        for i in np.flatnonzero(step.episode_ended):
            assert returns[i].sum() == 0 and step.terminations["player_2"][i]
            returns[i], moves[i], ended = 0, 0, ended + 1
    assert ended >= 3


@OLD_PETTINGZOO_API
def test_an_illegal_move_in_an_aec_game_is_caught() -> None:
    env = make_vector_env(TICTACTOE, 1, seed=0)
    env.reset()
    env.step({"player_1": np.array([4]), "player_2": np.array([0])})
    with pytest.raises(EnvError, match=r"player_2 chose action 4 .*illegal"):
        env.step({"player_1": np.array([0]), "player_2": np.array([4])})
