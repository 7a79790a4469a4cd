"""Legal-action masks in acting and learning: no rule ever picks an illegal action, DQN's target
is a max over the legal actions of s', PPO scores the masked policy, and nothing turns NaN."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hpcmarl.algos.actors import CategoricalActor, EpsilonGreedyActor, random_actions
from hpcmarl.algos.contract import run_update
from hpcmarl.algos.dqn import DQN
from hpcmarl.algos.masking import entropy_of, masked_log_softmax, masked_max
from hpcmarl.algos.ppo import PPO
from hpcmarl.testing.groups import group_of, job_with

torch.set_num_threads(1)
OBS_DIM, N_ACTIONS, ROWS = 3, 5, 4000


def random_masks(rows: int, seed: int = 0) -> np.ndarray:
    """Random masks with at least one legal action per row, often only one."""
    rng = np.random.default_rng(seed)
    masks = rng.random((rows, N_ACTIONS)) < 0.35
    masks[np.arange(rows), rng.integers(N_ACTIONS, size=rows)] = True
    return masks


def masked_dqn(seed: int = 0, **settings: object) -> DQN:
    group = dataclasses.replace(group_of(OBS_DIM, N_ACTIONS), action_masks=True)
    return DQN(group, job_with(hidden_sizes=[8], **settings), seed=seed)


def epsilon_actor(eps: float) -> EpsilonGreedyActor:
    dqn = masked_dqn(dqn__eps_start=eps, dqn__eps_end=eps)
    (spec,) = DQN.policy_specs(dqn.group, dqn.job).values()
    actor = EpsilonGreedyActor(spec)
    actor.set_weights(dqn.publish()["main/shared"])
    return actor


def observations(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, OBS_DIM)).astype(np.float32)


def legal(actions: np.ndarray, masks: np.ndarray) -> bool:
    return bool(masks[np.arange(len(actions)), actions].all())


def test_masked_argmax_is_the_best_legal_action() -> None:
    actor, masks, obs = epsilon_actor(0.0), random_masks(ROWS), observations(ROWS)
    greedy = actor.act(obs, np.random.default_rng(0), env_steps=0, greedy=True, action_mask=masks)
    scores = actor.scores(obs).numpy()
    np.testing.assert_array_equal(greedy.actions, np.where(masks, scores, -np.inf).argmax(1))
    assert (greedy.actions != scores.argmax(1)).any()  # the mask changed some choices


@pytest.mark.parametrize("eps", [1.0, 0.5])
def test_masked_exploration_never_chooses_an_illegal_action(eps: float) -> None:
    actor, masks, obs = epsilon_actor(eps), random_masks(ROWS, seed=1), observations(ROWS)
    rng = np.random.default_rng(2)
    for _ in range(5):
        actions = actor.act(obs, rng, env_steps=0, greedy=False, action_mask=masks).actions
        assert legal(actions, masks)


def test_masked_exploration_is_uniform_over_the_legal_actions() -> None:
    mask = np.array([[True, False, True, False, True]] * 30_000)
    draws = random_actions(np.random.default_rng(3), len(mask), N_ACTIONS, mask)
    counts = np.bincount(draws, minlength=N_ACTIONS)
    assert counts[[1, 3]].tolist() == [0, 0]
    np.testing.assert_allclose(counts[[0, 2, 4]] / len(draws), 1 / 3, atol=0.01)


def test_masked_sampling_never_chooses_an_illegal_action() -> None:
    ppo = PPO(group_of(OBS_DIM, N_ACTIONS), job_with(hidden_sizes=[8]), seed=0)
    (spec,) = PPO.policy_specs(ppo.group, ppo.job).values()
    actor = CategoricalActor(spec)
    actor.set_weights(ppo.publish()["main/shared"])
    masks, obs, rng = random_masks(ROWS, seed=4), observations(ROWS), np.random.default_rng(5)
    result = actor.act(obs, rng, env_steps=0, greedy=False, action_mask=masks)
    assert legal(result.actions, masks) and np.isfinite(result.extras["log_probs"]).all()
    only = masks.sum(1) == 1  # a row with one legal action takes it with probability 1
    np.testing.assert_allclose(result.extras["log_probs"][only], 0.0, atol=1e-6)


def transition_batch(rows: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    masks = random_masks(rows, seed)
    return {
        "observations": observations(rows, seed),
        "actions": rng.integers(N_ACTIONS, size=rows).astype(np.int64),
        "rewards": rng.standard_normal(rows).astype(np.float32),
        "next_observations": observations(rows, seed + 1),
        "terminations": np.zeros(rows, bool),
        "truncations": np.zeros(rows, bool),
        "action_masks": masks,
        "next_action_masks": random_masks(rows, seed + 1),
    }


def q_of(net: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.from_numpy(obs)).double().numpy()


@pytest.mark.parametrize("double_q", [True, False])
def test_masked_target_matches_a_hand_computation(double_q: bool) -> None:
    dqn = masked_dqn(dqn__double_q=double_q)
    noise = torch.Generator().manual_seed(3)  # not the global generator: test order
    with torch.no_grad():  # target and online differ, so double Q differs from a plain max
        for p in dqn.q_target.parameters():
            p.add_(torch.randn(p.shape, generator=noise))
    batch = transition_batch()
    batch["terminations"][4] = True
    batch["next_action_masks"][4:] = False  # no legal action at s': terminal, then not
    _, _, td = dqn.compute_gradients(batch, None)
    rows = np.arange(6)
    legal_next = batch["next_action_masks"]
    target_q = q_of(dqn.q_target, batch["next_observations"])
    if double_q:
        online = np.where(legal_next, q_of(dqn.q, batch["next_observations"]), -np.inf)
        v_next = target_q[rows, online.argmax(1)]
    else:
        v_next = np.where(legal_next, target_q, -np.inf).max(1)
    v_next[4:] = 0.0  # nothing legal: nothing to bootstrap from
    alive = 1.0 - batch["terminations"]
    q_taken = q_of(dqn.q, batch["observations"])[rows, batch["actions"]]
    hand = q_taken - (batch["rewards"] + dqn.cfg.gamma * alive * v_next)
    np.testing.assert_allclose(td, hand, rtol=1e-5, atol=1e-5)
    unmasked = dict(batch)
    del unmasked["next_action_masks"], unmasked["action_masks"]
    _, _, plain = dqn.compute_gradients(unmasked, None)
    assert not np.allclose(plain[:4], td[:4], atol=1e-4)  # the mask changed the targets


def test_an_empty_mask_at_a_terminal_next_state_keeps_the_update_finite() -> None:
    dqn = masked_dqn()
    batch = transition_batch()
    batch["terminations"][:] = True
    batch["next_action_masks"][:] = False
    result = run_update(dqn, batch)
    assert all(np.isfinite(v) for v in result.stats.values())
    assert result.priorities is not None and np.isfinite(result.priorities).all()
    assert np.isfinite(dqn.publish()["main/shared"]).all()


def test_masked_max_and_entropy_are_finite_for_illegal_actions() -> None:
    scores = torch.tensor([[1.0, 5.0, 2.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    assert masked_max(scores, mask).tolist() == [2.0, 0.0]
    logits = scores[:1]
    log_p = masked_log_softmax(logits, mask[:1])
    entropy = entropy_of(log_p)
    assert entropy.item() == pytest.approx(float(torch.distributions.Categorical(
        logits=torch.tensor([1.0, 2.0])).entropy()))  # fmt: skip
    entropy.sum().backward()
    assert torch.isfinite(scores.grad).all() and scores.grad[0, 1] == 0


def test_ppo_scores_the_masked_policy_its_actor_sampled_from() -> None:
    group = dataclasses.replace(group_of(OBS_DIM, N_ACTIONS, agents=2), action_masks=True)
    job = job_with(hidden_sizes=[16], collector__fragment_length=5, ppo__epochs=1)
    ppo = PPO(group, job, seed=0)
    spec = PPO.item_spec(group, job)
    assert spec.column("action_masks").shape == (N_ACTIONS,)
    rng = np.random.default_rng(0)
    items, steps, agents = 3, 5, 2
    masks = random_masks(items * steps * agents, seed=6).reshape(items, steps, agents, -1)
    obs = rng.standard_normal((items, steps, agents, OBS_DIM)).astype(np.float32)
    logits = ppo.acting("shared")(torch.from_numpy(obs)).detach()
    log_p = masked_log_softmax(logits, torch.from_numpy(masks))
    actions = torch.distributions.Categorical(logits=log_p).sample()
    taken = log_p.gather(-1, actions[..., None]).squeeze(-1)
    batch = {
        "observations": obs,
        "actions": actions.numpy().astype(np.int64),
        "log_probs": taken.numpy(),
        "rewards": rng.standard_normal((items, steps, agents)).astype(np.float32),
        "terminations": np.zeros((items, steps, agents), bool),
        "truncations": np.zeros((items, steps, agents), bool),
        "active": np.ones((items, steps, agents), bool),
        "episode_id": np.zeros((items, steps), np.int64),
        "step": np.zeros((items, steps), np.int32),
        "policy_version": np.zeros((items, steps), np.int64),
        "state": rng.standard_normal((items, steps, 2 * OBS_DIM)).astype(np.float32),
        "next_state": rng.standard_normal((items, steps, 2 * OBS_DIM)).astype(np.float32),
        "action_masks": masks,
    }
    assert spec.check(batch) == items
    result = run_update(ppo, batch)
    assert result.stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)  # the same policy
    assert np.isfinite(result.stats["entropy"]) and np.isfinite(result.stats["policy_loss"])
    unmasked = {k: v for k, v in batch.items() if k != "action_masks"}
    other = PPO(group, job, seed=0)
    assert run_update(other, unmasked).stats["approx_kl"] > 1e-3  # without it, another policy
