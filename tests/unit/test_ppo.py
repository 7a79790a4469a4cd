"""PPO's math against hand computations, its update's shape as a generator, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcmarl.algos.actors import CategoricalActor
from hpcmarl.algos.contract import run_update
from hpcmarl.algos.ppo import PPO, clipped_surrogate, clipped_value_loss
from hpcmarl.algos.returns import ValueNorm, decision_gae, gae
from hpcmarl.testing.groups import group_of, job_with

torch.set_num_threads(1)
GAMMA, LAM = 0.9, 0.8


def hand_gae(r, v, v_next, term, trunc):
    """Advantages of one fragment, written out step by step."""
    steps = len(r)
    adv = [0.0] * steps
    following = 0.0
    for t in reversed(range(steps)):
        bootstrap = 0.0 if term[t] else GAMMA * v_next[t]
        delta = r[t] + bootstrap - v[t]
        carried = 0.0 if (term[t] or trunc[t]) else GAMMA * LAM * following
        adv[t] = delta + carried
        following = adv[t]
    return np.array(adv, np.float32)


def test_gae_matches_a_hand_computation_across_episode_ends() -> None:
    rng = np.random.default_rng(0)
    r, v, v_next = (rng.standard_normal(6).astype(np.float32) for _ in range(3))
    term = np.array([0, 0, 1, 0, 0, 0], bool)  # an episode terminates at step 2
    trunc = np.array([0, 0, 0, 0, 1, 0], bool)  # the next is truncated at step 4
    got = gae(r[None], v[None], v_next[None], term[None], (term | trunc)[None], GAMMA, LAM)[0]
    np.testing.assert_allclose(got, hand_gae(r, v, v_next, term, trunc), rtol=1e-6)
    # a truncated step still bootstraps from V(s'); a terminated one does not
    assert got[4] == pytest.approx(r[4] + GAMMA * v_next[4] - v[4])
    assert got[2] == pytest.approx(r[2] - v[2])
    # lambda 1 and no ends: the discounted return to the fragment end plus its bootstrap
    none = np.zeros(6, bool)
    v_next[:5] = v[1:]  # within one episode s'_t is s_{t+1}: the sum telescopes
    mc = gae(r[None], v[None], v_next[None], none[None], none[None], GAMMA, 1.0)[0]
    tail = sum(GAMMA**k * r[k] for k in range(6)) + GAMMA**6 * v_next[5]
    assert mc[0] + v[0] == pytest.approx(tail, rel=1e-5)


def test_a_turn_based_players_advantage_runs_over_its_own_decisions() -> None:
    """Two players alternating (player 0 at steps 0, 2, 3; player 1 at 1, 4): the first
    episode ends at step 2 with rewards to both, the second is cut by the fragment's end."""
    rng = np.random.default_rng(1)
    r, v, v_next = (rng.standard_normal((1, 5, 2)).astype(np.float32) for _ in range(3))
    r[0, :2] = 0.0
    active = np.zeros((1, 5, 2), bool)
    active[0, [0, 2, 3], 0] = True
    active[0, [1, 4], 1] = True
    term = np.zeros((1, 5, 2), bool)
    term[0, 2] = True
    got = gae(r, v, v_next, term, term, GAMMA, LAM, active)[0]
    a2 = r[0, 2, 0] - v[0, 2, 0]
    expected_p0 = {
        2: a2,
        0: r[0, 1, 0] + GAMMA * v[0, 2, 0] - v[0, 0, 0] + GAMMA * LAM * a2,
        3: r[0, 3, 0] + r[0, 4, 0] + GAMMA * v_next[0, 4, 0] - v[0, 3, 0],
    }
    expected_p1 = {
        1: r[0, 1, 1] + r[0, 2, 1] - v[0, 1, 1],  # the opponent's last move ends its episode
        4: r[0, 4, 1] + GAMMA * v_next[0, 4, 1] - v[0, 4, 1],
    }
    for t, want in expected_p0.items():
        assert got[t, 0] == pytest.approx(want, rel=1e-5)
    for t, want in expected_p1.items():
        assert got[t, 1] == pytest.approx(want, rel=1e-5)
    assert not got[~active[0]].any()  # no advantage where the player did not decide


def test_decisions_at_every_step_give_the_usual_gae() -> None:
    rng = np.random.default_rng(2)
    r, v = (rng.standard_normal((3, 8, 2)).astype(np.float32) for _ in range(2))
    v_next = np.concatenate([v[:, 1:], rng.standard_normal((3, 1, 2)).astype(np.float32)], 1)
    term = np.zeros((3, 8, 2), bool)
    term[0, 3] = True
    trunc = np.zeros_like(term)
    trunc[1, 5] = True
    v_next[0, 3] = 0.5  # the final observations where the episodes end
    v_next[1, 5] = -0.25
    everywhere = np.ones_like(term)
    usual = gae(r, v, v_next, term, term | trunc, GAMMA, LAM)
    by_decision = decision_gae(r, v, v_next, term, term | trunc, GAMMA, LAM, everywhere)
    np.testing.assert_allclose(by_decision, usual, rtol=1e-5, atol=1e-6)


def test_clipped_surrogate_takes_the_pessimistic_bound() -> None:
    ratio = torch.tensor([0.5, 1.0, 1.5, 1.5, 0.5])
    adv = torch.tensor([1.0, 2.0, 1.0, -1.0, -1.0])
    # by hand: min(r A, clip(r) A) with clip 0.2 -> [0.5, 2.0, 1.2, -1.5, -0.8]
    expected = -np.mean([0.5, 2.0, 1.2, -1.5, -0.8])
    assert clipped_surrogate(ratio, adv, 0.2).item() == pytest.approx(expected)


def test_clipped_value_loss_is_the_larger_of_clipped_and_unclipped() -> None:
    old = torch.tensor([0.0, 0.0])
    values = torch.tensor([1.0, -0.1])
    targets = torch.tensor([2.0, 0.5])
    # unclipped squared/2: [0.5, 0.18]; clipped values [0.2, -0.1]: [1.62, 0.18]
    got = clipped_value_loss(values, old, targets, clip=0.2, delta=0.0).item()
    assert got == pytest.approx(np.mean([1.62, 0.18]))
    assert clipped_value_loss(values, old, targets, 0.0, 0.0).item() == pytest.approx(0.34)


def test_value_norm_normalises_and_inverts() -> None:
    norm = ValueNorm(beta=0.5)
    x = np.array([1.0, 3.0, 5.0, 7.0], np.float32)
    assert norm.stats() == (0.0, 1.0)
    norm.update_from(norm.moments(x))
    mean, std = norm.stats()
    assert mean == pytest.approx(4.0) and std == pytest.approx(np.sqrt(5.0))
    np.testing.assert_allclose(norm.denormalize(norm.normalize(x)), x, rtol=1e-6)
    # moments of two equal halves averaged are the moments of the whole, even for huge values
    assert np.isfinite(norm.moments(np.full(10_000, 1e17))).all()
    halves = (norm.moments(x[:2]) + norm.moments(x[2:])) / 2
    other = ValueNorm(beta=0.5)
    other.update_from(halves)
    assert other.stats() == pytest.approx((mean, std))


def make_ppo(seed: int = 0, agents: int = 2, **settings: object) -> PPO:
    job = job_with(hidden_sizes=[16], collector__fragment_length=5, **settings)
    return PPO(group_of(3, 4, agents=agents), job, seed)


def fragment_batch(ppo: PPO, items: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random fragments of the PPO's own item spec, with log-probs from its own actor."""
    spec = PPO.item_spec(ppo.group, ppo.job)
    rng = np.random.default_rng(seed)
    batch = {}
    for c in spec.columns:
        shape = (items, *spec.item_shape(c))
        if c.dtype == "|b1":
            batch[c.name] = rng.random(shape) < 0.1
        elif c.dtype.startswith("<i"):
            batch[c.name] = rng.integers(0, 4, shape).astype(c.dtype)
        else:
            batch[c.name] = rng.standard_normal(shape).astype(c.dtype)
    batch["active"][:] = True
    batch["active"][0, 3:, -1] = False  # an agent that finished early
    with torch.no_grad():
        logits = ppo.acting("shared")(torch.from_numpy(batch["observations"]))
        log_p = torch.log_softmax(logits, -1).gather(
            -1, torch.from_numpy(batch["actions"])[..., None]
        )
    batch["log_probs"] = log_p.squeeze(-1).numpy()
    return batch


def test_an_update_yields_moments_then_epochs_times_minibatches_gradients() -> None:
    ppo = make_ppo(ppo__epochs=3, ppo__minibatches=2)
    steps = ppo.update(fragment_batch(ppo, 4))
    sizes = [len(next(steps))]
    try:
        while True:
            sizes.append(len(steps.send(np.zeros(sizes[-1], np.float32))))
    except StopIteration as done:
        result = done.value
    n_params = sum(p.numel() for p in ppo.params)
    assert sizes == [3] + [n_params] * 6
    assert ppo.updates == 1 and ppo.steps == 6
    assert {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac"} <= set(result.stats)


def test_the_first_epoch_starts_at_ratio_one_and_inactive_steps_carry_no_loss() -> None:
    ppo = make_ppo(ppo__epochs=1, ppo__minibatches=1)
    batch = fragment_batch(ppo, 3)
    result = run_update(ppo, batch)
    assert result.stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert result.stats["clip_frac"] == 0.0
    data = make_ppo().prepare(batch)
    assert len(data["returns"]) == batch["active"].sum()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverged_update_stops_with_the_cause_and_the_fix() -> None:
    ppo = make_ppo()
    batch = fragment_batch(ppo, 2)
    batch["rewards"][:] = np.inf
    with pytest.raises(FloatingPointError, match="PPO diverged in update 1.*lower learner.lr"):
        run_update(ppo, batch)


def test_resume_continues_bit_for_bit() -> None:
    original = make_ppo(seed=1)
    run_update(original, fragment_batch(original, 4, seed=0))
    restored = make_ppo(seed=99)
    restored.load_state_dict(original.state_dict())
    for seed in (1, 2):
        run_update(original, fragment_batch(original, 4, seed=seed))
        run_update(restored, fragment_batch(restored, 4, seed=seed))
    np.testing.assert_array_equal(original.group_weights(), restored.group_weights())
    assert original.value_norm.stats() == restored.value_norm.stats()


def test_central_and_local_critics_see_what_their_names_say() -> None:
    central = make_ppo(ppo__critic="central")
    local = make_ppo(ppo__critic="local")
    assert central.critic_width() == central.group.state_dim + 2  # + one-hot of 2 agents
    assert local.critic_width() == 3 + 2
    assert "state" in PPO.item_spec(central.group, central.job).names
    assert "next_observations" in PPO.item_spec(local.group, local.job).names


def test_ppo_learns_a_bandit_and_its_actor_acts_like_its_policy() -> None:
    """Reward 1 for action 2, else 0: the policy must come to prefer action 2."""
    ppo = make_ppo(lr=0.01, agents=1, ppo__entropy_coef=0.0)
    (spec,) = PPO.policy_specs(ppo.group, ppo.job).values()
    actor = CategoricalActor(spec)
    rng = np.random.default_rng(0)
    for i in range(30):
        actor.set_weights(ppo.publish()[spec.key])
        batch = fragment_batch(ppo, 8, seed=i)
        batch["active"][:] = True
        batch["terminations"][:] = True  # every step an episode of its own: a bandit
        acted = actor.act(batch["observations"].reshape(-1, 3), rng, env_steps=0, greedy=False)
        batch["actions"] = acted.actions.reshape(8, 5, 1)
        batch["log_probs"] = acted.extras["log_probs"].reshape(8, 5, 1)
        batch["rewards"] = (batch["actions"] == 2).astype(np.float32)
        run_update(ppo, batch)
    actor.set_weights(ppo.publish()[spec.key])
    obs = rng.standard_normal((200, 3)).astype(np.float32)
    assert (actor.act(obs, rng, env_steps=0, greedy=True).actions == 2).mean() > 0.9
    sampled = actor.act(obs, rng, env_steps=0, greedy=False)
    assert (sampled.actions == 2).mean() > 0.7
    assert (sampled.extras["log_probs"] <= 0).all()


def test_a_team_of_policies_trains_each_actor_on_its_own_agents() -> None:
    """A group of two policies (no parameter sharing) and one centralised critic."""
    job = job_with(hidden_sizes=[16], collector__fragment_length=5, ppo__actor_agent_id=True)
    ppo = PPO(group_of(3, 4, agents=2, shared=False), job, seed=0)
    assert sorted(ppo.publish()) == ["main/a0", "main/a1"]
    specs = PPO.policy_specs(ppo.group, ppo.job)
    assert all(s.agent_ids == 1 and s.in_dim == 4 for s in specs.values())
    batch = fragment_batch_of(ppo, items=3)
    before = {k: v.copy() for k, v in ppo.publish().items()}
    result = run_update(ppo, batch)
    assert np.isfinite(result.stats["policy_loss"])
    after = ppo.publish()
    assert all(not np.array_equal(before[k], after[k]) for k in before)  # both actors learned


def fragment_batch_of(ppo: PPO, items: int) -> dict[str, np.ndarray]:
    spec = PPO.item_spec(ppo.group, ppo.job)
    rng = np.random.default_rng(0)
    batch = {}
    for c in spec.columns:
        shape = (items, *spec.item_shape(c))
        if c.dtype == "|b1":
            batch[c.name] = np.zeros(shape, bool)
        elif c.dtype.startswith("<i"):
            batch[c.name] = rng.integers(0, 4, shape).astype(c.dtype)
        else:
            batch[c.name] = rng.standard_normal(shape).astype(c.dtype)
    batch["active"][:] = True
    batch["log_probs"][:] = np.log(0.25)
    return batch


def test_critic_heads_run_the_critic_once_per_env_step_with_a_head_per_agent() -> None:
    ppo = make_ppo(ppo__critic_heads=True, ppo__epochs=2, ppo__minibatches=3)
    assert ppo.critic_width() == ppo.group.state_dim  # no one-hot: the head tells agents apart
    batch = fragment_batch(ppo, 4)
    values, _ = ppo.values_of(batch)
    assert values.shape == batch["actions"].shape  # [items, T, agents]
    with torch.no_grad():
        by_hand = ppo.networks["critic"](torch.from_numpy(batch["state"][1, 2]))
    np.testing.assert_allclose(values[1, 2], ppo.value_norm.denormalize(by_hand.numpy()), rtol=1e-5)
    data = ppo.prepare(batch)
    for rows in ppo.minibatch_rows(data):
        steps = np.unique(data["step_of_row"][rows])  # whole env steps: all their active agents
        assert len(rows) == np.isin(data["step_of_row"], steps).sum()
    assert np.isfinite(run_update(ppo, batch).stats["value_loss"])


def test_critic_heads_learn_each_agents_own_value() -> None:
    """Agent 0 is paid 1 at every (terminal) step and agent 1 nothing: one state, two values."""
    ppo = make_ppo(ppo__critic_heads=True, lr=0.01, ppo__value_norm=False)
    for i in range(40):
        batch = fragment_batch(ppo, 4, seed=i)
        batch["active"][:] = True
        batch["terminations"][:] = True
        batch["rewards"][..., 0], batch["rewards"][..., 1] = 1.0, 0.0
        run_update(ppo, batch)
    values, _ = ppo.values_of(fragment_batch(ppo, 4, seed=99))
    assert values[..., 0].mean() == pytest.approx(1.0, abs=0.15)
    assert values[..., 1].mean() == pytest.approx(0.0, abs=0.15)


def test_resume_with_critic_heads_continues_bit_for_bit() -> None:
    original = make_ppo(seed=1, ppo__critic_heads=True, ppo__minibatches=2)
    run_update(original, fragment_batch(original, 4, seed=0))
    restored = make_ppo(seed=99, ppo__critic_heads=True, ppo__minibatches=2)
    restored.load_state_dict(original.state_dict())
    for seed in (1, 2):
        run_update(original, fragment_batch(original, 4, seed=seed))
        run_update(restored, fragment_batch(restored, 4, seed=seed))
    np.testing.assert_array_equal(original.group_weights(), restored.group_weights())
