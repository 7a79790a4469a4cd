"""R2D2: sequences cut with overlap at episode edges, the stored recurrent state, burn-in,
n-step targets against a hand computation, value rescaling, per-sequence priorities, and
exact resume; the velocity-free CartPole."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from hpcmarl.algos.contract import run_update
from hpcmarl.algos.r2d2 import R2D2, rescale, unrescale
from hpcmarl.algos.value_decomposition import sequence_inputs, tensors_of, unroll
from hpcmarl.envs import partial
from hpcmarl.items.writers import EpisodeWriter, make_writer
from hpcmarl.testing.groups import group_of, job_with, random_items

from .test_items import records

torch.set_num_threads(1)
HIDDEN = 8


def r2d2_job(**settings):
    base = {
        "batch_size": 4,
        "r2d2__rnn_hidden": HIDDEN,
        "replay__sequence_length": 6,
        "replay__burn_in": 0,
        "replay__sequence_overlap": 0,
    }
    return job_with(**(base | settings))


def sequences_of(length: int, overlap: int, steps: int = 8) -> list[dict[str, np.ndarray]]:
    """The early-exit env's sequences (`runner`: 8 steps then truncated), its recurrent state
    at each step set to the step index, so one can tell which step a state came from."""
    job = r2d2_job(replay__sequence_length=length, replay__sequence_overlap=overlap)
    spec = R2D2.item_spec(group_of(3, 2, agents=2), job)
    writer = make_writer(spec, ["quitter", "runner"], {"quitter": 0, "runner": 1}, 2, length=4)
    assert isinstance(writer, EpisodeWriter)
    out = []
    for i, record in enumerate(records(steps)):
        record.recurrent_states = {"runner": np.full((2, HIDDEN), float(i), np.float32)}
        writer.add(record)
        if writer.advance():
            batch = writer.batch()
            out += [{k: v[j] for k, v in batch.items()} for j in range(len(batch["actions"]))]
            writer.reset()
    return out


def test_sequences_overlap_and_never_cross_an_episode_end() -> None:
    items = sequences_of(length=4, overlap=2)
    copy0 = [s for s in items if s["episode_id"][0] == 0]
    assert [s["step"][s["filled"]].tolist() for s in copy0] == [
        [0, 1, 2, 3],
        [2, 3, 4, 5],
        [4, 5, 6, 7],
    ]
    # the state stored at a sequence's first step is the one the actor had there
    assert [s["recurrent_state"][0, 1, 0] for s in copy0] == [0.0, 2.0, 4.0]
    assert (items[0]["recurrent_state"][:, 0] == 0).all()  # the quitter has no state: zeros
    longer = sequences_of(length=5, overlap=2)
    copy0 = [s for s in longer if s["episode_id"][0] == 0]
    assert [s["step"][s["filled"]].tolist() for s in copy0] == [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]]
    # an episode shorter than a sequence: one padded sequence
    (short,) = [s for s in sequences_of(length=10, overlap=3) if s["episode_id"][0] == 0]
    assert short["filled"].sum() == 8 and not short["filled"][8:].any()


def test_value_rescaling_inverts_exactly() -> None:
    x = torch.tensor([-500.0, -3.0, 0.0, 0.5, 42.0, 1e4], dtype=torch.float64)
    assert torch.allclose(unrescale(rescale(x)), x, rtol=1e-9, atol=1e-9)
    assert rescale(torch.tensor(0.0)).item() == 0.0


def batch_of(algo: R2D2, items: int, seed: int = 0) -> dict[str, np.ndarray]:
    return random_items(algo.item_spec(algo.group, algo.job), items, n_actions=2, seed=seed)


def test_n_step_targets_match_a_hand_computation() -> None:
    gamma, n = 0.9, 3
    algo = R2D2(
        group_of(3, 2),
        r2d2_job(gamma=gamma, r2d2__n_step=n, r2d2__value_rescaling=False, r2d2__double_q=False),
        seed=1,
    )
    batch = batch_of(algo, 1)
    batch["filled"][0, 5:] = False  # 5 real steps of 6
    batch["terminations"][0, 4] = True  # the episode terminates at its fifth step
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], 0)
    h0 = t["recurrent_state"][:, 0]
    with torch.no_grad():
        q_target, _ = unroll(algo.q_target, inputs, h0)
        got = algo.n_step_targets(t, q_target, q_target, burn=0)[0, :, 0].numpy()
    v = q_target[0, 1:, 0].max(dim=-1).values.numpy()  # V(s_{t+1}) of step t
    r = batch["rewards"][0, :, 0]
    expected = [
        r[0] + gamma * r[1] + gamma**2 * r[2] + gamma**3 * v[2],
        r[1] + gamma * r[2] + gamma**2 * r[3] + gamma**3 * v[3],
        r[2] + gamma * r[3] + gamma**2 * r[4],  # terminates at step 4: no bootstrap
        r[3] + gamma * r[4],
        r[4],
    ]
    np.testing.assert_allclose(got[:5], expected, rtol=1e-5)
    # a sequence that ends with its episode going on bootstraps from its last next state
    batch["filled"][:] = True
    batch["terminations"][:] = False
    t["filled"], t["terminations"] = torch.ones(1, 6), torch.zeros(1, 6, 1)
    with torch.no_grad():
        got = algo.n_step_targets(t, q_target, q_target, burn=0)[0, :, 0].numpy()
    assert got[5] == pytest.approx(r[5] + gamma * v[5], rel=1e-5)
    assert got[4] == pytest.approx(r[4] + gamma * r[5] + gamma**2 * v[5], rel=1e-5)


def test_burn_in_warms_the_stored_state_and_carries_no_loss() -> None:
    job = r2d2_job(replay__burn_in=3, replay__sequence_overlap=3)
    algo = R2D2(group_of(3, 2), job, seed=2)
    batch = batch_of(algo, 2)
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], 0)
    h0 = t["recurrent_state"][:, 0]
    with torch.no_grad():
        whole, _ = unroll(algo.q, inputs, h0)
        after = algo.unroll_after_burn_in(algo.q, inputs, h0, burn=3)
        zero, _ = unroll(algo.q, inputs, None)
    torch.testing.assert_close(after, whole[:, 3:])  # the same state after the burn-in
    assert not torch.allclose(whole, zero)  # the stored state matters
    changed = dict(batch, rewards=batch["rewards"].copy())
    changed["rewards"][:, :3] += 100.0  # rewards of burn-in steps only
    _, first, _ = algo.compute_gradients(batch, None)
    _, second, _ = algo.compute_gradients(changed, None)
    assert first["loss"] == pytest.approx(second["loss"])
    zero_job = r2d2_job(
        replay__burn_in=3, replay__sequence_overlap=3, replay__zero_init_states=True
    )
    zero_init = R2D2(group_of(3, 2), zero_job, seed=2)
    zero_init.load_state_dict(algo.state_dict())
    other = batch_of(algo, 2)
    other["recurrent_state"][:] = 0.0
    assert zero_init.compute_gradients(batch, None)[1] == algo.compute_gradients(other, None)[1]


def test_priorities_mix_the_largest_and_the_mean_td_error_of_each_sequence() -> None:
    algo = R2D2(group_of(3, 2), r2d2_job(r2d2__priority_eta=0.9), seed=3)
    batch = batch_of(algo, 3)
    batch["filled"][1, 4:] = False
    t = tensors_of(batch, algo.device)
    inputs = sequence_inputs(t["observations"], t["next_observations"], 0)
    with torch.no_grad():
        q = algo.unroll_after_burn_in(algo.q, inputs, t["recurrent_state"][:, 0], 0)
        qt = algo.unroll_after_burn_in(algo.q_target, inputs, t["recurrent_state"][:, 0], 0)
        target = algo.n_step_targets(t, q, qt, 0)
    taken = q[:, :-1].gather(-1, t["actions"][..., None]).squeeze(-1)
    delta = (taken - target).abs()[..., 0].numpy()
    _, _, priorities = algo.compute_gradients(batch, None)
    for i, rows in enumerate([slice(0, 6), slice(0, 4), slice(0, 6)]):
        d = delta[i, rows]
        assert priorities[i] == pytest.approx(0.9 * d.max() + 0.1 * d.mean(), rel=1e-5)


def test_updates_lower_the_loss_and_resume_bit_for_bit() -> None:
    job = r2d2_job(lr=0.003, replay__burn_in=2, replay__sequence_overlap=2)
    algo = R2D2(group_of(3, 2), job, seed=4)
    batch = batch_of(algo, 4)
    first = run_update(algo, batch)
    for _ in range(40):
        last = run_update(algo, batch)
    assert last.stats["loss"] < 0.5 * first.stats["loss"]
    twin = R2D2(group_of(3, 2), job, seed=4)
    twin.load_state_dict(algo.state_dict())
    a, b = run_update(algo, batch), run_update(twin, batch)
    assert a.stats == b.stats
    np.testing.assert_array_equal(algo.group_weights(), twin.group_weights())


def test_the_velocity_free_cartpole_shows_positions_only() -> None:
    env = gymnasium.make(f"hpcmarl.envs.partial:{partial.ENV_ID}")
    obs, _ = env.reset(seed=0)
    full = gymnasium.make("CartPole-v1")
    full_obs, _ = full.reset(seed=0)
    np.testing.assert_allclose(obs, full_obs[[0, 2]])
    assert env.observation_space.shape == (2,)
    for _ in range(5):
        obs, *_ = env.step(1)
        full_obs, *_ = full.step(1)
    np.testing.assert_allclose(obs, full_obs[[0, 2]], rtol=1e-6)
