"""n-step transitions: folded from one-step ones against a hand computation, the same whether
an episode spans one fragment or several, truncated at the episode's end, and DQN's target
bootstrapping with each transition's own discount."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcmarl.algos.dqn import DQN
from hpcmarl.items.writers import NStepWriter, fold_n_step, make_writer
from hpcmarl.testing.groups import group_of, job_with

from .test_items import records

GAMMA = 0.5


def episode_rows(rewards: list[float], terminated: bool, agent: int = 0, episode: int = 7):
    steps = len(rewards)
    done = np.zeros(steps, bool)
    done[-1] = terminated
    return {
        "observations": np.arange(steps, dtype=np.float32)[:, None],
        "next_observations": np.arange(1, steps + 1, dtype=np.float32)[:, None],
        "rewards": np.array(rewards, np.float32),
        "terminations": done,
        "truncations": np.zeros(steps, bool)
        if terminated
        else done | (np.arange(steps) == steps - 1),
        "agent_id": np.full(steps, agent, np.int16),
        "episode_id": np.full(steps, episode, np.int64),
        "step": np.arange(steps, dtype=np.int32),
    }


def test_n_step_returns_match_a_hand_computation_and_stop_at_the_episode_end() -> None:
    folded, waiting = fold_n_step(episode_rows([1, 2, 3, 4, 5], terminated=True), 3, GAMMA)
    assert waiting is None
    np.testing.assert_allclose(
        folded["rewards"], [1 + 0.5 * 2 + 0.25 * 3, 2 + 1.5 + 1.0, 3 + 2 + 1.25, 4 + 2.5, 5]
    )
    np.testing.assert_allclose(folded["discounts"], [0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_array_equal(folded["next_observations"][:, 0], [3, 4, 5, 5, 5])
    np.testing.assert_array_equal(folded["terminations"], [False, False, True, True, True])
    np.testing.assert_array_equal(folded["observations"][:, 0], [0, 1, 2, 3, 4])


def test_an_open_window_waits_for_the_next_fragment() -> None:
    whole = episode_rows([1, 2, 3, 4, 5, 6], terminated=False)
    at_once, _ = fold_n_step(whole, 3, GAMMA)
    first = {k: v[:4] for k, v in whole.items()}
    first["truncations"] = np.zeros(4, bool)  # the episode goes on after this fragment
    done_early, waiting = fold_n_step(first, 3, GAMMA)
    assert len(done_early["rewards"]) == 2 and len(waiting["rewards"]) == 2
    rest = {k: np.concatenate([waiting[k], v[4:]]) for k, v in whole.items()}
    done_late, left = fold_n_step(rest, 3, GAMMA)
    assert left is None
    for name in at_once:
        np.testing.assert_array_equal(
            np.concatenate([done_early[name], done_late[name]]), at_once[name], err_msg=name
        )
    # a truncated episode still bootstraps: not terminated, from where the window ends
    assert not at_once["terminations"].any() and at_once["truncations"][-3:].all()


def test_runs_of_different_agents_and_episodes_never_mix() -> None:
    a = episode_rows([1, 1, 1], terminated=True, agent=0, episode=1)
    b = episode_rows([10, 10], terminated=True, agent=1, episode=1)
    c = episode_rows([100], terminated=True, agent=0, episode=2)
    rows = {k: np.concatenate([c[k], b[k], a[k]]) for k in a}  # in any order
    folded, _ = fold_n_step(rows, 3, GAMMA)
    by_run = {
        (int(g), int(e), int(s)): r
        for g, e, s, r in zip(
            folded["agent_id"], folded["episode_id"], folded["step"], folded["rewards"], strict=True
        )
    }
    assert by_run == {
        (0, 1, 0): 1.75,
        (0, 1, 1): 1.5,
        (0, 1, 2): 1.0,
        (1, 1, 0): 15.0,
        (1, 1, 1): 10.0,
        (0, 2, 0): 100.0,
    }


def test_the_writer_folds_real_steps_and_the_quitters_end() -> None:
    """The early-exit env: `quitter` terminates after 3 of the episode's 8 steps."""
    job = job_with(gamma=GAMMA, dqn__n_step=4)
    spec = DQN.item_spec(group_of(3, 2, agents=2), job)
    assert spec.n_step == 4 and "discounts" in spec.names
    writer = make_writer(spec, ["quitter", "runner"], {"quitter": 0, "runner": 1}, 2, length=4)
    assert isinstance(writer, NStepWriter)
    batches = []
    for record in records(8):
        writer.add(record)
        if writer.advance():
            batches.append(writer.batch())
            writer.reset()
    rows = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    assert spec.check(rows) == 2 * (3 + 8)  # every one-step transition starts one n-step one
    quitter = rows["agent_id"] == 0
    assert rows["terminations"][quitter].all()  # each of its windows reaches its end
    np.testing.assert_allclose(
        sorted(rows["discounts"][quitter]), [0.125] * 2 + [0.25] * 2 + [0.5] * 2
    )
    assert np.isclose(rows["discounts"][~quitter], GAMMA**4).sum() == 2 * 5


def test_dqn_bootstraps_an_n_step_transition_with_its_own_discount() -> None:
    job = job_with(gamma=0.9, dqn__n_step=3, dqn__double_q=False, hidden_sizes=[8])
    dqn = DQN(group_of(3, 2), job, seed=0)
    batch = {
        "observations": np.zeros((2, 3), np.float32),
        "actions": np.zeros(2, np.int64),
        "rewards": np.array([1.0, 1.0], np.float32),
        "next_observations": np.ones((2, 3), np.float32),
        "terminations": np.array([False, True]),
        "discounts": np.array([0.729, 0.81], np.float32),
    }
    _, stats, _ = dqn.compute_gradients(batch, None)
    with torch.no_grad():
        v = dqn.q_target(torch.ones(1, 3)).max().item()
    assert stats["target_mean"] == pytest.approx((1 + 0.729 * v + 1) / 2, rel=1e-5)
