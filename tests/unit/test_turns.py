"""Turn-based transitions: a player's step spans from one of its decisions to its next one,
stitched across env steps and fragments, with the payoffs that arrive while it waits."""

from __future__ import annotations

import dataclasses

import numpy as np

from hpcmarl.algos.dqn import DQN
from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.envs.vector import VectorStep
from hpcmarl.items.writers import StepRecord, TransitionWriter, TurnBasedWriter, make_writer
from hpcmarl.testing.groups import group_of, job_with

P0, P1 = "a0", "a1"
N_ACTIONS = 3


def masked_group(obs_dim: int, n_actions: int):
    return dataclasses.replace(group_of(obs_dim, n_actions, agents=2), action_masks=True)


def obs(t: int) -> dict[str, np.ndarray]:
    """Player k sees [k, t] at step t: every observation names its owner and its time."""
    return {P0: np.array([[0.0, t]], np.float32), P1: np.array([[1.0, t]], np.float32)}


def mask(t: int) -> dict[str, np.ndarray]:
    """A mask that differs from step to step (and between the players)."""
    return {
        P0: np.array([[t % 2 == 0, True, t % 3 == 0]]),
        P1: np.array([[True, t % 2 == 1, False]]),
    }


ALL_LEGAL = {P0: np.ones((1, N_ACTIONS), bool), P1: np.ones((1, N_ACTIONS), bool)}


def record(t: int, mover: str, action: int, episode: int, index: int, end: tuple | None = None):
    """Step t of one copy: `mover` plays `action`; `end` = (payoff a0, payoff a1, reset t)."""
    done = end is not None
    next_obs, rewards = obs(t + 1), {P0: np.zeros(1, np.float32), P1: np.zeros(1, np.float32)}
    if done:
        rewards = {P0: np.array([end[0]], np.float32), P1: np.array([end[1]], np.float32)}
    flags = {a: np.array([done]) for a in (P0, P1)}
    step = VectorStep(
        next_observations=next_obs,
        observations=obs(end[2]) if done else next_obs,
        rewards=rewards,
        terminations=flags,
        truncations={a: np.zeros(1, bool) for a in (P0, P1)},
        episode_ended=np.array([done]),
        active={P0: np.array([mover == P0]), P1: np.array([mover == P1])},
        next_action_masks=ALL_LEGAL if done else mask(t + 1),
        action_masks=mask(end[2]) if done else mask(t + 1),
    )
    actions = {P0: np.array([action if mover == P0 else 9]), P1: np.array([action])}
    return StepRecord(
        observations=obs(t) if t not in (3, 5) else obs({3: 10, 5: 20}[t]),
        actions=actions,
        step=step,
        episode_id=np.array([episode]),
        step_index=np.array([index], np.int32),
        versions={P0: 4, P1: 7},
        action_masks=mask(t) if t not in (3, 5) else mask({3: 10, 5: 20}[t]),
    )


def hand_written_episodes() -> list[StepRecord]:
    """Kuhn poker, one copy: episode 0 is pass, bet, call (player a1 wins 2); episode 1 is bet,
    pass (a0 wins 1); episode 2 starts with a0's decision. Observations after a reset are
    [k, 10] and [k, 20]."""
    return [
        record(0, P0, 0, 0, 0),
        record(1, P1, 1, 0, 1),
        record(2, P0, 1, 0, 2, end=(-2.0, 2.0, 10)),
        record(3, P0, 1, 1, 0),
        record(4, P1, 0, 1, 1, end=(1.0, -1.0, 20)),
        record(5, P0, 0, 2, 0),
    ]


def fragments(writer: TurnBasedWriter, steps: list[StepRecord]) -> list[dict[str, np.ndarray]]:
    out = []
    for step in steps:
        writer.add(step)
        if writer.advance():
            out.append(writer.batch())
            writer.reset()
    return out


def rows_of(batch: dict[str, np.ndarray], agent_id: int) -> dict[str, np.ndarray]:
    keep = batch["agent_id"] == agent_id
    return {k: v[keep] for k, v in batch.items()}


def test_hand_written_kuhn_episodes_are_stitched_turn_to_turn() -> None:
    spec = DQN.item_spec(masked_group(2, N_ACTIONS), job_with())
    assert {"action_masks", "next_action_masks"} <= set(spec.names)
    writer = make_writer(spec, [P0, P1], {P0: 0, P1: 1}, num_envs=1, length=2, turn_based=True)
    assert isinstance(writer, TurnBasedWriter)
    first, second, third = fragments(writer, hand_written_episodes())
    assert spec.check(first) == 0  # nobody's transition is complete after pass, bet
    assert spec.check(second) == 3
    p0, p1 = rows_of(second, 0), rows_of(second, 1)
    # a0: its pass (next obs at its next turn, t=2, nothing paid yet), then its call (paid -2)
    np.testing.assert_array_equal(p0["observations"], [[0, 0], [0, 2]])
    np.testing.assert_array_equal(p0["next_observations"], [[0, 2], [0, 3]])
    assert p0["actions"].tolist() == [0, 1] and p0["rewards"].tolist() == [0.0, -2.0]
    assert p0["terminations"].tolist() == [False, True]
    np.testing.assert_array_equal(p0["action_masks"], [mask(0)[P0][0], mask(2)[P0][0]])
    np.testing.assert_array_equal(p0["next_action_masks"], [mask(2)[P0][0], [True] * 3])
    # a1: its bet at t=1 is paid +2 when a0 calls at t=2, while a1 waits
    np.testing.assert_array_equal(p1["observations"], [[1, 1]])
    np.testing.assert_array_equal(p1["next_observations"], [[1, 3]])
    assert p1["rewards"].tolist() == [2.0] and p1["terminations"].tolist() == [True]
    assert p1["step"].tolist() == [1] and p1["episode_id"].tolist() == [0]
    assert p1["policy_version"].tolist() == [7] and p0["policy_version"].tolist() == [4, 4]
    # episode 1 in the third fragment; a0's decision at t=5 is still pending
    p0, p1 = rows_of(third, 0), rows_of(third, 1)
    np.testing.assert_array_equal(p0["observations"], [[0, 10]])
    np.testing.assert_array_equal(p0["next_observations"], [[0, 5]])
    assert p0["rewards"].tolist() == [1.0] and p0["episode_id"].tolist() == [1]
    assert p1["rewards"].tolist() == [-1.0] and p1["actions"].tolist() == [0]
    assert writer.waiting[0, 0] and not writer.waiting[1, 0]


def test_a_pending_transition_carries_over_a_fragment_and_discarding_forgets_it() -> None:
    spec = DQN.item_spec(masked_group(2, N_ACTIONS), job_with())
    steps = hand_written_episodes()
    whole = TurnBasedWriter(spec, [P0, P1], {P0: 0, P1: 1}, num_envs=1, length=6)
    (all_at_once,) = fragments(whole, steps)
    split = TurnBasedWriter(spec, [P0, P1], {P0: 0, P1: 1}, num_envs=1, length=1)
    pieces = fragments(split, steps)
    joined = {k: np.concatenate([p[k] for p in pieces]) for k in all_at_once}
    for agent_id in (0, 1):  # the same transitions whatever the fragment length
        for name, column in rows_of(all_at_once, agent_id).items():
            np.testing.assert_array_equal(rows_of(joined, agent_id)[name], column, err_msg=name)
    cut = TurnBasedWriter(spec, [P0, P1], {P0: 0, P1: 1}, num_envs=1, length=2)
    fragments(cut, steps[:2])
    cut.discard_pending()  # the episode was cut (a seeded restart): its pending rows go
    (rest,) = fragments(cut, steps[2:4])
    assert rest["observations"].tolist() == [[0, 2]]  # only what started after the cut
    assert rest["agent_id"].tolist() == [0]


def kuhn_rows(num_envs: int, length: int, steps: int) -> tuple[dict, dict]:
    """Random legal Kuhn play through a TurnBasedWriter; rows of every fragment, and every
    (agent, episode)'s return summed from the env's rewards."""
    env = make_vector_env(EnvConfig(kind="openspiel", id="kuhn_poker"), num_envs, seed=3)
    players = env.agents
    spec = DQN.item_spec(masked_group(11, 2), job_with())
    writer = TurnBasedWriter(spec, players, {a: i for i, a in enumerate(players)}, num_envs, length)
    current, rng = env.reset(), np.random.default_rng(0)
    ids, index, next_id = np.arange(num_envs), np.zeros(num_envs, np.int32), num_envs
    returns: dict[tuple[int, int], float] = {}
    batches = []
    for _ in range(steps):
        actions = {a: rng.integers(2, size=num_envs) for a in players}
        masks = env.action_masks
        step = env.step(actions)
        versions = dict.fromkeys(players, 1)
        writer.add(
            StepRecord(current, actions, step, ids.copy(), index.copy(), versions, None, {}, masks)
        )
        for k, a in enumerate(players):
            for i in range(num_envs):
                returns[(k, ids[i])] = returns.get((k, ids[i]), 0.0) + step.rewards[a][i]
        index += 1
        for i in np.flatnonzero(step.episode_ended):
            ids[i], index[i], next_id = next_id, 0, next_id + 1
        current = step.observations
        if writer.advance():
            batches.append(writer.batch())
            writer.reset()
    rows = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    return rows, {key: r for key, r in returns.items() if key[1] < ids.min()}


def test_real_kuhn_transitions_chain_within_episodes_and_carry_every_payoff() -> None:
    rows, returns = kuhn_rows(num_envs=4, length=5, steps=300)
    seen = 0
    for (agent, episode), paid in returns.items():
        mine = (rows["agent_id"] == agent) & (rows["episode_id"] == episode)
        order = np.argsort(rows["step"][mine])
        chain = {k: v[mine][order] for k, v in rows.items()}
        assert len(chain["actions"]) >= 1
        np.testing.assert_array_equal(chain["next_observations"][:-1], chain["observations"][1:])
        assert chain["terminations"].tolist() == [False] * (len(order) - 1) + [True]
        assert chain["rewards"].sum() == paid  # the payoff reached whoever moved earlier
        assert (chain["observations"][:, agent] == 1).all()  # only its own decisions
        seen += 1
    assert seen > 200
    by_episode: dict[int, float] = {}
    for (_, episode), paid in returns.items():
        by_episode[episode] = by_episode.get(episode, 0.0) + paid
    assert set(by_episode.values()) == {0.0}


def test_without_turns_the_plain_writer_is_chosen() -> None:
    spec = DQN.item_spec(group_of(2, N_ACTIONS, agents=2), job_with())
    assert "action_masks" not in spec.names
    writer = make_writer(spec, [P0, P1], {P0: 0, P1: 1}, num_envs=1, length=2)
    assert type(writer) is TransitionWriter
