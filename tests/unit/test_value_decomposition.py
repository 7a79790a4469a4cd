"""Teams on episodes: the episode writer's padding and `filled` mask, VDN's and QMIX's mixers,
the targets against hand computations, the recurrent actor against the learner's unrolled
network, and exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcmarl.algos.actors import RecurrentEpsilonGreedyActor, build_actor
from hpcmarl.algos.contract import run_update
from hpcmarl.algos.networks import get_flat
from hpcmarl.algos.value_decomposition import (
    QMIXMixer,
    ValueDecomposition,
    VDNMixer,
    lambda_returns,
    sequence_inputs,
    tensors_of,
    unroll,
)
from hpcmarl.items.writers import EpisodeWriter, make_writer
from hpcmarl.roles.acting import Memory, act_all
from hpcmarl.testing.groups import group_of, job_with, random_items

from .test_items import records

torch.set_num_threads(1)
AGENTS = {"quitter": 0, "runner": 1}


def team_job(**settings):
    return job_with(batch_size=4, replay__prioritized=False, **settings)


def early_exit_writer(limit: int, mixer: str = "qmix") -> EpisodeWriter:
    group = group_of(3, 2, agents=2, state_dim=6)
    job = team_job(qmix__episode_limit=limit, qmix__mixer=mixer)
    spec = ValueDecomposition.item_spec(group, job)
    writer = make_writer(spec, list(AGENTS), AGENTS, num_envs=2, length=4)
    assert isinstance(writer, EpisodeWriter)
    return writer


def feed(writer: EpisodeWriter, steps: int) -> list[dict[str, np.ndarray]]:
    """Batches at each fragment end (every `writer.length` steps)."""
    batches = []
    for record in records(steps):
        writer.add(record)
        if writer.advance():
            batches.append(writer.batch())
            writer.reset()
    return batches


def test_an_episode_is_one_item_padded_after_its_last_step() -> None:
    writer = early_exit_writer(limit=10)
    first, second = feed(writer, 8)  # the 8-step episode ends in the second fragment
    assert len(first["actions"]) == 0  # nothing closed yet: an empty batch, shaped right
    assert first["observations"].shape == (0, 10, 2, 3)
    assert writer.spec.check(second) == 2  # one episode per env copy
    np.testing.assert_array_equal(second["filled"].sum(axis=1), [8, 8])
    assert not second["filled"][:, 8:].any() and (second["observations"][:, 8:] == 0).all()
    assert second["active"][:, :, 0].sum(axis=1).tolist() == [3, 3]  # the quitter's 3 steps
    np.testing.assert_array_equal(second["step"][0, :8], np.arange(8))
    assert second["terminations"][:, 2, 0].all()  # the quitter terminates at its third step
    assert not second["terminations"][:, :, 1].any()  # the runner is truncated
    assert writer.padded_steps == 2 * 2 and writer.filled_steps == 16


def test_an_episode_longer_than_the_limit_goes_on_in_the_next_item() -> None:
    writer = early_exit_writer(limit=5)
    batches = feed(writer, 8)
    items = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    assert len(items["actions"]) == 4  # 5 + 3 steps in each of the two copies
    np.testing.assert_array_equal(sorted(items["filled"].sum(axis=1)), [3, 3, 5, 5])
    tails = items["filled"].sum(axis=1) == 3
    np.testing.assert_array_equal(items["step"][tails][:, :3], [[5, 6, 7]] * 2)
    np.testing.assert_array_equal(items["episode_id"][tails][:, 0], [0, 1])


def test_a_restart_drops_the_episodes_in_progress() -> None:
    writer = early_exit_writer(limit=10)
    steps = records(8)
    for record in steps[:5]:
        writer.add(record)
    writer.discard_pending()
    for record in steps[:8]:  # a fresh 8-step episode in each copy
        writer.add(record)
    batch = writer.batch()
    np.testing.assert_array_equal(batch["filled"].sum(axis=1), [8, 8])
    np.testing.assert_array_equal(batch["step"][:, 0], [0, 0])


def test_vdn_adds_and_qmix_is_monotonic_in_every_agents_q() -> None:
    qs = torch.randn(7, 3)
    assert torch.allclose(VDNMixer()(qs, None), qs.sum(dim=1))
    torch.manual_seed(0)
    mixer = QMIXMixer(agents=3, state_dim=5, embed=8, hypernet_embed=16)
    qs = torch.randn(64, 3, requires_grad=True)
    state = torch.randn(64, 5)
    total = mixer(qs, state)
    assert total.shape == (64,)
    (grad,) = torch.autograd.grad(total.sum(), qs)
    assert (grad >= 0).all()  # dQ_tot / dQ_i >= 0 for every state and every agent
    # and the shape of its input is kept: [B, T, agents] -> [B, T]
    assert mixer(torch.randn(2, 4, 3), torch.randn(2, 4, 5)).shape == (2, 4)


def test_lambda_returns_match_a_hand_computation() -> None:
    gamma, lam = 0.9, 0.7
    r = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    v = torch.tensor([[10.0, 20.0, 30.0, 0.0]])  # V(s_{t+1}) per step
    done = torch.zeros(1, 4)
    filled = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # a truncated 3-step episode, padded
    got = lambda_returns(r, v, done, filled, gamma, lam)[0]
    g2 = 3 + gamma * 30  # the last step bootstraps fully
    g1 = 2 + gamma * ((1 - lam) * 20 + lam * g2)
    g0 = 1 + gamma * ((1 - lam) * 10 + lam * g1)
    np.testing.assert_allclose(got.numpy(), [g0, g1, g2, 0.0], rtol=1e-6)
    terminated = lambda_returns(r, v, torch.tensor([[0.0, 0.0, 1.0, 0.0]]), filled, gamma, lam)
    assert terminated[0, 2].item() == pytest.approx(3.0)  # no bootstrap past termination
    one_step = lambda_returns(r, v, done, filled, gamma, 0.0)[0]
    np.testing.assert_allclose(one_step.numpy(), (r + gamma * v)[0].numpy() * [1, 1, 1, 0])


def random_episodes(algo: ValueDecomposition, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Episodes of 5 real steps of 6, terminated at the fifth."""
    batch = random_items(algo.item_spec(algo.group, algo.job), n, n_actions=4, seed=seed)
    batch["filled"][:, 5:] = False
    batch["active"][:, 5:] = False
    batch["terminations"][:, 4] = True
    return batch


def make_team(mixer: str = "qmix", **settings) -> ValueDecomposition:
    job = team_job(qmix__mixer=mixer, qmix__episode_limit=6, qmix__rnn_hidden=16, **settings)
    return ValueDecomposition(group_of(5, 4, agents=3, state_dim=7), job, seed=3)


@pytest.mark.parametrize("mixer", ["vdn", "qmix"])
def test_one_step_targets_match_a_hand_computation(mixer: str) -> None:
    algo = make_team(mixer, gamma=0.9)
    batch = random_episodes(algo, 2)
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], algo.agent_ids)
    with torch.no_grad():
        online = unroll(algo.agent, inputs)[0].numpy()
        target = unroll(algo.agent_target, inputs)[0].numpy()
        got = algo.targets(t, torch.from_numpy(online), inputs).numpy()
    b, step = 1, 2
    best = online[b, step + 1].argmax(axis=-1)  # double Q: the online agents choose
    q_next = torch.tensor(target[b, step + 1, np.arange(3), best])
    state = torch.from_numpy(batch["next_state"][b, step]) if mixer == "qmix" else None
    with torch.no_grad():
        mixed = algo.mixer_target(q_next[None], None if state is None else state[None])
    expected = batch["rewards"][b, step].sum() + 0.9 * mixed.item()
    assert got[b, step] == pytest.approx(expected, rel=1e-5)
    assert got[b, 4] == pytest.approx(batch["rewards"][b, 4].sum(), rel=1e-5)  # terminated


@pytest.mark.parametrize("bootstrap", [True, False])
def test_a_truncated_last_step_bootstraps_only_when_asked(bootstrap: bool) -> None:
    algo = make_team("qmix", gamma=0.9, qmix__bootstrap_truncated=bootstrap)
    batch = random_episodes(algo, 2)
    batch["terminations"][:] = False
    batch["truncations"][:] = False
    batch["truncations"][:, 4] = True  # a time limit at the fifth step
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], algo.agent_ids)
    with torch.no_grad():
        got = algo.targets(t, unroll(algo.agent, inputs)[0], inputs).numpy()
    reward = batch["rewards"][:, 4].sum(axis=-1)
    if bootstrap:
        assert not np.allclose(got[:, 4], reward, rtol=1e-5)
    else:
        np.testing.assert_allclose(got[:, 4], reward, rtol=1e-5)
    assert not np.allclose(got[:, 3], batch["rewards"][:, 3].sum(axis=-1), rtol=1e-5)


def test_the_actor_acting_step_by_step_sees_what_the_learner_unrolls() -> None:
    """The collector advances each agent's GRU state one step at a time; the learner runs the
    GRU over the stored episode. Both must give the same Q-values, or the learner would train
    a network other than the one that acted."""
    algo = make_team("vdn", qmix__eps_start=0.0, qmix__eps_end=0.0)
    ((key, spec),) = algo.policy_specs(algo.group, algo.job).items()
    actor = build_actor(spec)
    assert isinstance(actor, RecurrentEpsilonGreedyActor)
    actor.set_weights(algo.publish()[key])
    batch = random_episodes(algo, 1)
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], algo.agent_ids)
    with torch.no_grad():
        unrolled = unroll(algo.agent, inputs)[0][0].numpy()  # [T+1, N, A]
    memory = Memory()
    bindings = {a: key for a in algo.group.agents}
    rng = np.random.default_rng(0)
    for step in range(6):
        obs = {a: batch["observations"][:, step, i] for i, a in enumerate(algo.group.agents)}
        actions, _ = act_all({key: actor}, bindings, obs, rng, 0, greedy=True, memory=memory)
        for i, agent in enumerate(algo.group.agents):
            assert actions[agent][0] == unrolled[step, i].argmax()
    memory.reset(np.array([True]))
    assert all((state == 0).all() for state in memory.states.values())


def test_a_masked_action_is_never_chosen_and_never_a_target() -> None:
    group = group_of(5, 4, agents=2)
    group = type(group)(**{**group.__dict__, "action_masks": True})
    job = team_job(qmix__episode_limit=6, qmix__rnn_hidden=8, qmix__mixer="vdn")
    algo = ValueDecomposition(group, job, seed=0)
    (spec,) = algo.policy_specs(group, job).values()
    actor = build_actor(spec)
    actor.set_weights(algo.publish()[spec.key])
    mask = np.zeros((50, 4), bool)
    mask[:, 2] = True
    mask[::2, 0] = True
    rng = np.random.default_rng(1)
    for greedy in (True, False):
        obs, index = rng.standard_normal((50, 5)), np.zeros(50, np.int64)
        out = actor.act(obs, rng, env_steps=0, greedy=greedy, action_mask=mask, agent_index=index)
        assert mask[np.arange(50), out.actions].all()
    batch = random_episodes(algo, 2)
    batch["next_action_masks"][:] = False
    batch["next_action_masks"][..., 1] = True  # only action 1 is legal at every s'
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], algo.agent_ids)
    with torch.no_grad():
        target = unroll(algo.agent_target, inputs)[0][:, 1:]
        got = algo.targets(t, unroll(algo.agent, inputs)[0], inputs)
    alive = 1 - t["terminations"][..., 0]
    expected = t["rewards"].sum(-1) + algo.cfg.gamma * target[..., 1].sum(-1) * alive
    np.testing.assert_allclose(got[:, :4].numpy(), expected[:, :4].numpy(), rtol=1e-5)


@pytest.mark.parametrize("mixer", ["vdn", "qmix"])
def test_updates_lower_the_loss_and_resume_bit_for_bit(mixer: str) -> None:
    algo = make_team(mixer, lr=0.003, qmix__td_lambda=0.6)
    batch = random_episodes(algo, 4)
    first = run_update(algo, batch)
    assert first.priorities is not None and first.priorities.shape == (4,)
    for _ in range(30):
        last = run_update(algo, batch)
    assert last.stats["loss"] < 0.5 * first.stats["loss"]
    twin = make_team(mixer, lr=0.003, qmix__td_lambda=0.6)
    twin.load_state_dict(algo.state_dict())
    a, b = run_update(algo, batch), run_update(twin, batch)
    assert a.stats == b.stats
    np.testing.assert_array_equal(algo.group_weights(), twin.group_weights())


def test_rewards_are_standardized_by_moments_the_group_averages_first() -> None:
    algo = make_team("vdn", gamma=0.9)
    plain = make_team("vdn", gamma=0.9, qmix__standardize_rewards=False)
    batch = random_episodes(algo, 3)
    team = batch["rewards"].astype(np.float64).sum(axis=-1)[batch["filled"]]
    steps = algo.update(batch)
    moments = next(steps)  # what data-parallel members average before anything else
    np.testing.assert_allclose(moments, [team.mean(), (team**2).mean(), 1.0], rtol=1e-5)
    grad = steps.send(moments)
    with pytest.raises(StopIteration):
        steps.send(grad)
    mean, std = algo.reward_norm.stats()
    assert mean == pytest.approx(team.mean(), rel=1e-5)
    assert std == pytest.approx(max(team.var(), 1e-2) ** 0.5, rel=1e-4)
    plain.load_group_weights(algo.group_weights())
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], algo.agent_ids)
    with torch.no_grad():
        online = unroll(algo.agent, inputs)[0]
        shift = algo.targets(t, online, inputs) - plain.targets(t, online, inputs)
    reward = t["rewards"].sum(-1)
    np.testing.assert_allclose(shift.numpy(), ((reward - mean) / std - reward).numpy(), atol=1e-5)


def test_soft_targets_move_a_fraction_of_the_way_after_every_update() -> None:
    """`target_tau`: after each update every target parameter (agents and mixer) is
    tau * online + (1 - tau) * its previous value; with 0 the hard copy waits for its turn."""
    soft = make_team(qmix__target_tau=0.25)
    batch = random_episodes(soft, 4)
    pairs = [(soft.agent, soft.agent_target), (soft.mixer, soft.mixer_target)]
    before = [get_flat(target).copy() for _, target in pairs]
    run_update(soft, batch)
    for (online, target), old in zip(pairs, before, strict=True):
        want = 0.25 * get_flat(online) + 0.75 * old
        np.testing.assert_allclose(get_flat(target), want, rtol=1e-6, atol=1e-7)
    hard = make_team(qmix__target_network_update_freq=3)
    kept = get_flat(hard.mixer_target).copy()
    run_update(hard, batch)
    run_update(hard, batch)
    np.testing.assert_array_equal(get_flat(hard.mixer_target), kept)
    run_update(hard, batch)
    np.testing.assert_array_equal(get_flat(hard.mixer_target), get_flat(hard.mixer))
