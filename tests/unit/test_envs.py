"""The multi-agent vector env: true final observations, auto-reset, seeding, PettingZoo, errors."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest

from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs import MultiAgentVectorEnv, make_vector_env
from hpcmarl.envs.adapters import ParallelCopy
from hpcmarl.envs.frames import ParallelFrameStack
from hpcmarl.errors import EnvError

CARTPOLE = EnvConfig(kind="gymnasium", id="CartPole-v1")
SPREAD = EnvConfig(kind="pettingzoo", id="mpe2.simple_spread_v3", kwargs={"max_cycles": 5})


def fixed_actions(steps: int, num_envs: int, n: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(123)
    return [rng.integers(n, size=num_envs) for _ in range(steps)]


def test_cartpole_final_observation_is_true_next_state_then_auto_reset() -> None:
    venv = make_vector_env(CARTPOLE, num_envs=2, seed=10)
    bare = gymnasium.make("CartPole-v1")  # copy 1 replayed by hand
    obs = venv.reset()
    bare_obs, _ = bare.reset(seed=11)
    np.testing.assert_array_equal(obs["agent_0"][1], bare_obs)
    ends = 0
    for actions in fixed_actions(300, 2):
        step = venv.step({"agent_0": actions})
        bare_next, reward, term, trunc, _ = bare.step(int(actions[1]))
        np.testing.assert_array_equal(step.next_observations["agent_0"][1], bare_next)
        assert step.rewards["agent_0"][1] == reward and step.terminations["agent_0"][1] == term
        assert step.episode_ended[1] == (term or trunc)
        if term or trunc:
            ends += 1
            bare_obs, _ = bare.reset()
            assert not np.array_equal(step.observations["agent_0"][1], bare_next)
        else:
            bare_obs = bare_next
        np.testing.assert_array_equal(step.observations["agent_0"][1], bare_obs)
    assert ends >= 3


def test_cartpole_arrays_have_the_documented_types() -> None:
    venv = make_vector_env(CARTPOLE, num_envs=3, seed=0)
    assert venv.agents == ["agent_0"]
    assert venv.obs_dim("agent_0") == 4 and venv.n_actions("agent_0") == 2
    obs = venv.reset()
    assert obs["agent_0"].dtype == np.float32 and obs["agent_0"].shape == (3, 4)
    step = venv.step({"agent_0": np.zeros(3, dtype=np.int64)})
    assert step.rewards["agent_0"].dtype == np.float32
    for column in (step.terminations, step.truncations, step.active):
        assert column["agent_0"].dtype == bool and column["agent_0"].shape == (3,)
    assert step.episode_ended.dtype == bool and step.active["agent_0"].all()


def test_truncation_ends_the_episode_without_terminating() -> None:
    cfg = EnvConfig(kind="gymnasium", id="CartPole-v1", kwargs={"max_episode_steps": 3})
    venv = make_vector_env(cfg, num_envs=1, seed=0)
    venv.reset()
    for t in range(3):
        step = venv.step({"agent_0": np.array([t % 2])})
    assert step.episode_ended[0] and step.truncations["agent_0"][0]
    assert not step.terminations["agent_0"][0]


def run_cartpole(seed: int) -> list[np.ndarray]:
    venv = make_vector_env(CARTPOLE, num_envs=3, seed=seed)
    out = [venv.reset()["agent_0"]]
    for actions in fixed_actions(100, 3):
        step = venv.step({"agent_0": actions})
        out += [step.next_observations["agent_0"], step.observations["agent_0"]]
    return out


def test_seeding_is_reproducible_and_copies_differ() -> None:
    first, again, other = run_cartpole(5), run_cartpole(5), run_cartpole(6)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])
    assert len({tuple(row) for row in first[0]}) == 3
    np.testing.assert_array_equal(first[0][1], other[0][0])  # copy i is seeded seed + i


def test_simple_spread_three_agents_end_together_after_max_cycles() -> None:
    venv = make_vector_env(SPREAD, num_envs=2, seed=0)
    assert venv.agents == ["agent_0", "agent_1", "agent_2"]
    assert all(venv.obs_dim(a) == 18 and venv.n_actions(a) == 5 for a in venv.agents)
    obs = venv.reset()
    assert all(obs[a].shape == (2, 18) and obs[a].dtype == np.float32 for a in venv.agents)
    for t, actions in enumerate(fixed_actions(5, 2, n=5), start=1):
        step = venv.step({a: actions for a in venv.agents})
        assert step.episode_ended.tolist() == [t == 5] * 2
        for a in venv.agents:
            assert step.truncations[a].tolist() == [t == 5] * 2
            assert not step.terminations[a].any() and step.active[a].all()
    for a in venv.agents:
        assert not np.array_equal(step.observations[a], step.next_observations[a])
    assert not venv.step({a: actions for a in venv.agents}).episode_ended.any()


class EarlyExitEnv:
    """Parallel env where agent `b` terminates after 1 step and `a` is truncated after 3."""

    possible_agents = ["b", "a"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Box(-10, 10, (2,))

    def action_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Discrete(2)

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict]:
        self.agents, self.t = ["a", "b"], 0
        return {a: np.full(2, -1.0) for a in self.agents}, {}

    def step(self, actions: dict[str, int]) -> tuple[dict[str, Any], ...]:
        assert set(actions) == set(self.agents)  # a finished agent is sent no action
        self.t += 1
        obs = {a: np.full(2, float(self.t)) for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        terms = {a: a == "b" for a in self.agents}
        truncs = {a: a == "a" and self.t == 3 for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}

    def close(self) -> None:
        pass


def test_agent_finished_early_gets_inactive_padding_until_episode_ends() -> None:
    venv = MultiAgentVectorEnv([ParallelCopy(EarlyExitEnv(), "early")], seed=0)
    assert venv.agents == ["a", "b"]
    venv.reset()
    zeros = np.zeros(1, dtype=np.int64)
    first = venv.step({"a": zeros, "b": zeros})
    assert first.active["b"][0] and first.terminations["b"][0] and not first.episode_ended[0]
    second = venv.step({"a": zeros, "b": zeros})
    assert not second.active["b"][0] and second.terminations["b"][0]
    assert second.rewards["b"][0] == 0.0 and second.active["a"][0]
    third = venv.step({"a": zeros, "b": zeros})
    assert third.episode_ended[0] and third.truncations["a"][0]
    assert third.next_observations["a"][0].tolist() == [3.0, 3.0]
    assert third.observations["a"][0].tolist() == [-1.0, -1.0]


def test_parallel_frame_stacks_shift_by_one_frame_and_stop_with_their_agent() -> None:
    """`replay.stack_num` on a PettingZoo parallel env: each agent's last 3 frames, newest
    last, its first frame standing in at the start; a finished agent's stack stops with it
    (its padding rows are zeros, as unstacked), and the global state stays unstacked."""
    venv = MultiAgentVectorEnv([ParallelCopy(ParallelFrameStack(EarlyExitEnv(), 3, "e"), "e")], 0)
    assert venv.obs_dim("a") == 6 and venv.observation_space("a").shape == (3, 2)
    first = venv.reset()
    assert first["a"][0].tolist() == [-1.0] * 6
    zeros = np.zeros(1, dtype=np.int64)
    steps = [venv.step({"a": zeros, "b": zeros}) for _ in range(3)]
    assert steps[0].next_observations["a"][0].tolist() == [-1, -1, -1, -1, 1, 1]
    assert steps[1].next_observations["a"][0].tolist() == [-1, -1, 1, 1, 2, 2]
    assert steps[0].next_observations["b"][0].tolist() == [-1, -1, -1, -1, 1, 1]
    assert not steps[1].active["b"][0] and not steps[1].next_observations["b"].any()
    assert steps[2].episode_ended[0] and steps[2].next_observations["a"][0].tolist() == [
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    assert steps[2].observations["a"][0].tolist() == [-1.0] * 6  # the next episode's start
    spread = make_vector_env(SPREAD, num_envs=1, seed=0, with_state=True, frame_stack=2)
    spread.reset()
    assert spread.obs_dim("agent_0") == 36 and spread.state_dim == 54


def test_frame_stacks_of_structured_observations_are_refused() -> None:
    class Masked(EarlyExitEnv):
        def observation_space(self, agent: str) -> gymnasium.Space:
            return gymnasium.spaces.Dict({"observation": super().observation_space(agent)})

    with pytest.raises(EnvError, match="stacks array observations"):
        ParallelFrameStack(Masked(), 2, "masked")


def test_unknown_gymnasium_id_suggests_close_names() -> None:
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(id="CartPol-v1"), num_envs=1, seed=0)
    assert "CartPol-v1" in info.value.cause and "CartPole-v1" in info.value.fix


def test_unknown_pettingzoo_module_names_the_tried_path() -> None:
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(kind="pettingzoo", id="mpe2.simple_sprad_v3"), 1, 0)
    assert "mpe2.simple_sprad_v3" in info.value.cause
    assert "mpe2.simple_spread_v3" in info.value.fix
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(kind="pettingzoo", id="nosuchpkg.some_env"), 1, 0)
    assert "nosuchpkg.some_env" in info.value.cause and "mpe2.simple_spread_v3" in info.value.fix


def test_unknown_kind_lists_the_families() -> None:
    with pytest.raises(EnvError, match="pettingzoo"):
        make_vector_env(EnvConfig(kind="atari"), 1, 0)


@pytest.mark.parametrize(
    ("module", "kwargs"),
    [
        ("simple_spread_v3", {"N": 3, "max_cycles": 7, "local_ratio": 0.5}),
        ("simple_spread_v3", {"N": 2, "max_cycles": 5, "continuous_actions": True}),
        ("simple_tag_v3", {"max_cycles": 6}),
        ("simple_speaker_listener_v4", {"max_cycles": 6}),
        ("simple_world_comm_v3", {"max_cycles": 4}),
    ],
)
def test_aec_cycle_steps_exactly_as_pettingzoos_conversion(module: str, kwargs: dict) -> None:
    """Same seed, same actions: the same observations, rewards, flags, agents and state as
    PettingZoo's `aec_to_parallel`, through episode ends and resets."""
    import importlib

    from hpcmarl.envs.cycle import AecCycle, fast_parallel

    make = importlib.import_module(f"mpe2.{module}").parallel_env
    theirs, ours = make(**kwargs), fast_parallel(make(**kwargs))
    assert isinstance(ours, AecCycle)
    for agent in theirs.possible_agents:
        theirs.action_space(agent).seed(7)
    for episode in range(3):
        their_obs, _ = theirs.reset(seed=episode)
        our_obs, _ = ours.reset(seed=episode)
        assert ours.state_from_observations  # every mpe2 env's state is its observations
        _assert_same_dicts(their_obs, our_obs)
        np.testing.assert_array_equal(theirs.state(), ours.state())
        while theirs.agents:
            assert ours.agents == theirs.agents
            actions = {a: theirs.action_space(a).sample() for a in theirs.agents}
            their_step = theirs.step(actions)
            our_step = ours.step(actions)
            for their_part, our_part in zip(their_step, our_step, strict=True):
                _assert_same_dicts(their_part, our_part)
            np.testing.assert_array_equal(theirs.state(), ours.state())
        assert not ours.agents


def _assert_same_dicts(theirs: dict, ours: dict) -> None:
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        if isinstance(value, dict):
            assert ours[key] == value
        else:
            np.testing.assert_array_equal(np.asarray(ours[key]), np.asarray(value))
            assert np.asarray(ours[key]).dtype == np.asarray(value).dtype


def test_aec_cycle_asks_the_env_for_its_state_unless_it_is_the_observations() -> None:
    from mpe2 import simple_spread_v3

    from hpcmarl.envs.cycle import fast_parallel, state_is_observations

    raw = simple_spread_v3.raw_env()

    class OwnState(type(raw)):  # type: ignore[misc]
        def state(self) -> np.ndarray:
            return np.zeros(3, np.float32)

    raw.__class__ = OwnState
    assert not state_is_observations(raw)

    env = fast_parallel(simple_spread_v3.parallel_env())
    different = np.arange(54, dtype=np.float32)
    env.parallel.state = lambda: different  # what a reset's check sees, and then believes
    env.reset(seed=0)
    assert not env.state_from_observations
    np.testing.assert_array_equal(env.state(), different)
