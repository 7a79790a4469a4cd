"""DQN math, schedules and round trips, on tiny networks without MPI."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from hpcmarl.algos.actors import EpsilonGreedyActor
from hpcmarl.algos.contract import run_update
from hpcmarl.algos.dqn import DQN
from hpcmarl.algos.networks import (
    FlatGrads,
    get_flat,
    mlp,
    param_spec,
    set_flat,
)
from hpcmarl.algos.registry import algorithm_class, check_fits
from hpcmarl.errors import ConfigError, EnvError
from hpcmarl.testing.groups import group_of, job_with

torch.set_num_threads(1)

OBS_DIM, N_ACTIONS = 3, 4


def make_batch(rows: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observations": rng.standard_normal((rows, OBS_DIM)).astype(np.float32),
        "actions": rng.integers(N_ACTIONS, size=rows).astype(np.int64),
        "rewards": rng.standard_normal(rows).astype(np.float32),
        "next_observations": rng.standard_normal((rows, OBS_DIM)).astype(np.float32),
        "terminations": np.zeros(rows, dtype=bool),
        "truncations": np.zeros(rows, dtype=bool),
    }


def make_dqn(seed: int = 0, **overrides: object) -> DQN:
    settings: dict = {"hidden_sizes": [8], "lr": 1e-2, **overrides}
    return DQN(group_of(OBS_DIM, N_ACTIONS), job_with(**settings), seed=seed)


def weights(dqn: DQN) -> np.ndarray:
    return dqn.publish()["main/shared"]


def update(dqn: DQN, batch: dict, importance: np.ndarray | None = None) -> tuple[dict, np.ndarray]:
    result = run_update(dqn, batch, importance)
    assert result.priorities is not None
    return result.stats, result.priorities


def perturb_target(dqn: DQN) -> None:
    """Make target and online differ, so double Q and plain max give different targets."""
    with torch.no_grad():
        for p in dqn.q_target.parameters():
            p.add_(torch.randn_like(p))


def q_values(net: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.from_numpy(obs)).double().numpy()


def hand_td(dqn: DQN, batch: dict[str, np.ndarray], double_q: bool) -> np.ndarray:
    rows = np.arange(len(batch["actions"]))
    q_taken = q_values(dqn.q, batch["observations"])[rows, batch["actions"]]
    q_next_target = q_values(dqn.q_target, batch["next_observations"])
    if double_q:
        best = q_values(dqn.q, batch["next_observations"]).argmax(axis=1)
        v_next = q_next_target[rows, best]
    else:
        v_next = q_next_target.max(axis=1)
    alive = 1.0 - batch["terminations"]
    return q_taken - (batch["rewards"] + dqn.cfg.gamma * alive * v_next)


@pytest.mark.parametrize("double_q", [True, False])
def test_target_matches_hand_computation(double_q: bool) -> None:
    dqn = make_dqn(dqn__double_q=double_q)
    perturb_target(dqn)
    batch = make_batch()
    _, _, td = dqn.compute_gradients(batch, None)
    assert td.dtype == np.float32 and td.shape == (8,)
    np.testing.assert_allclose(td, hand_td(dqn, batch, double_q), rtol=1e-5, atol=1e-5)
    other = hand_td(dqn, batch, not double_q)
    assert not np.allclose(td, other, atol=1e-4)  # the test can tell the two targets apart


def test_termination_cuts_bootstrap_truncation_does_not() -> None:
    dqn = make_dqn()
    perturb_target(dqn)
    batch = make_batch(rows=1)
    batch = {k: np.repeat(v, 3, axis=0) for k, v in batch.items()}
    batch["terminations"] = np.array([False, True, False])
    batch["truncations"] = np.array([False, False, True])
    _, _, td = dqn.compute_gradients(batch, None)
    q_taken = q_values(dqn.q, batch["observations"])[0, batch["actions"][0]]
    np.testing.assert_allclose(td[1], q_taken - batch["rewards"][1], rtol=1e-5)
    assert td[2] == td[0]  # truncated row bootstraps exactly like a plain row
    assert td[1] != td[0]


def huber(x: np.ndarray, delta: float = 1.0) -> np.ndarray:
    a = np.abs(x)
    return np.where(a < delta, 0.5 * x**2, delta * (a - 0.5 * delta))


def test_importance_weights_scale_the_loss() -> None:
    dqn = make_dqn()
    batch = make_batch()
    batch["rewards"] *= 5.0  # both Huber branches occur
    weights = np.linspace(0.1, 1.0, 8).astype(np.float32)

    def gradients(weights: np.ndarray | None) -> tuple:
        grad, stats, td = dqn.compute_gradients(batch, weights)
        return grad.copy(), stats, td  # the vector is the gradients' buffer: the next reuses it

    grad_1, stats_1, td = gradients(None)
    grad_w, stats_w, _ = gradients(weights)
    grad_2, stats_2, _ = gradients(np.full(8, 2.0, np.float32))
    assert stats_w["loss"] == pytest.approx(np.mean(weights * huber(td)), rel=1e-5)
    assert stats_1["loss"] == pytest.approx(np.mean(huber(td)), rel=1e-5)
    assert stats_2["loss"] == pytest.approx(2 * stats_1["loss"], rel=1e-6)
    np.testing.assert_allclose(grad_2, 2 * grad_1, rtol=1e-5, atol=1e-7)
    assert not np.allclose(grad_w, grad_1)


def test_target_network_copies_every_n_updates_and_not_before() -> None:
    dqn = make_dqn(dqn__target_network_update_freq=3)
    batch = make_batch()
    initial = get_flat(dqn.q_target)
    np.testing.assert_array_equal(initial, weights(dqn))
    for _ in range(2):
        update(dqn, batch)
        np.testing.assert_array_equal(get_flat(dqn.q_target), initial)
    update(dqn, batch)
    assert dqn.updates == 3
    copied = get_flat(dqn.q_target)
    np.testing.assert_array_equal(copied, weights(dqn))
    update(dqn, batch)
    update(dqn, batch)
    np.testing.assert_array_equal(get_flat(dqn.q_target), copied)
    assert not np.array_equal(weights(dqn), copied)


def test_compute_plus_apply_equals_update_bitwise() -> None:
    split, fused = make_dqn(seed=7), make_dqn(seed=7)
    for step in range(5):
        batch, importance = make_batch(seed=step), np.full(8, 0.5, np.float32)
        grad, stats_a, td_a = split.compute_gradients(batch, importance)
        split.apply_gradients(grad)
        stats_b, td_b = update(fused, batch, importance)
        np.testing.assert_array_equal(np.abs(td_a), td_b)
        assert stats_a["loss"] == stats_b["loss"]
    np.testing.assert_array_equal(weights(split), weights(fused))


def test_weights_round_trip_and_are_copies() -> None:
    source, sink = make_dqn(seed=1), make_dqn(seed=2)
    flat = weights(source)
    assert flat.dtype == np.float32 and flat.ndim == 1
    set_flat(sink.q, flat)
    np.testing.assert_array_equal(weights(sink), flat)
    flat[:] = 0.0  # a copy: scribbling on it must not touch either model
    assert np.any(weights(source) != 0.0) and np.any(weights(sink) != 0.0)


def test_state_dict_round_trip_resumes_bit_for_bit() -> None:
    original = make_dqn(seed=3, dqn__target_network_update_freq=2)
    for step in range(3):
        update(original, make_batch(seed=step))
    state = original.state_dict()
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in state.values())
    restored = make_dqn(seed=99, dqn__target_network_update_freq=2)
    restored.load_state_dict(state)
    assert restored.updates == 3
    for key, value in restored.state_dict().items():
        np.testing.assert_array_equal(value, state[key])
    for step in range(3, 6):  # optimizer moments and target schedule carry over exactly
        update(original, make_batch(seed=step))
        update(restored, make_batch(seed=step))
    np.testing.assert_array_equal(weights(restored), weights(original))
    np.testing.assert_array_equal(get_flat(restored.q_target), get_flat(original.q_target))


def test_actor_with_dqn_weights_picks_dqn_greedy_actions() -> None:
    dqn = make_dqn(seed=4, dqn__eps_start=1.0, dqn__eps_end=0.0, dqn__eps_decay_steps=100)
    (spec,) = DQN.policy_specs(dqn.group, dqn.job).values()
    actor = EpsilonGreedyActor(spec)
    actor.set_weights(weights(dqn))
    obs = np.random.default_rng(0).standard_normal((64, OBS_DIM)).astype(np.float32)
    rng = np.random.default_rng(0)
    actions = actor.act(obs, rng, env_steps=100, greedy=False).actions
    assert actions.dtype == np.int64 and actions.shape == (64,)
    np.testing.assert_array_equal(actions, q_values(dqn.q, obs).argmax(axis=1))
    greedy = actor.act(obs, rng, env_steps=0, greedy=True).actions
    np.testing.assert_array_equal(greedy, actions)
    random = actor.act(obs, rng, env_steps=0, greedy=False).actions  # epsilon 1 at the start
    assert random.dtype == np.int64 and set(random.tolist()) == set(range(N_ACTIONS))
    mixed = actor.act(obs, rng, env_steps=50, greedy=False).actions  # epsilon 0.5
    assert 0 < np.count_nonzero(mixed != actions) < 64


def test_repeated_updates_on_a_fixed_batch_drive_the_loss_down() -> None:
    dqn = make_dqn(seed=5, hidden_sizes=[32], dqn__target_network_update_freq=10_000)
    batch = make_batch(rows=32)
    first, _ = update(dqn, batch)
    for _ in range(200):
        last, _ = update(dqn, batch)
    assert last["loss"] < 0.1 * first["loss"]


def test_flat_helpers_follow_the_spec_and_check_sizes() -> None:
    net = mlp(3, [5], 2)
    assert param_spec(net) == [("0.weight", (5, 3)), ("0.bias", (5,)), ("2.weight", (2, 5)),
                               ("2.bias", (2,))]  # fmt: skip
    flat = np.arange(32, dtype=np.float32)
    set_flat(net, flat)
    np.testing.assert_array_equal(get_flat(net), flat)
    grads = FlatGrads(list(net.parameters()))
    np.testing.assert_array_equal(grads.vector(), np.zeros(32, np.float32))
    grads.load(flat * 2)
    np.testing.assert_array_equal(grads.vector(), flat * 2)
    np.testing.assert_array_equal(net[0].bias.grad.numpy(), flat[15:20] * 2)
    with pytest.raises(ValueError, match="needs"):
        grads.load(np.zeros(31, np.float32))
    with pytest.raises(ValueError, match="needs"):
        set_flat(net, np.zeros(31, np.float32))


def test_check_fits_wants_discrete_actions() -> None:
    assert algorithm_class("dqn") is DQN
    check_fits("dqn", gymnasium.spaces.Discrete(2))
    with pytest.raises(EnvError, match="Discrete"):
        check_fits("dqn", gymnasium.spaces.Box(-1.0, 1.0, (2,)))
    with pytest.raises(ConfigError, match="dqn"):
        check_fits("a2c", gymnasium.spaces.Discrete(2))


def test_backward_accumulates_into_the_flat_gradient_buffer() -> None:
    """The vector a group averages is the gradients' own memory: no gather, no scatter, and an
    average handed back in that memory is taken as it is."""
    net = mlp(3, [5], 2)
    grads = FlatGrads(list(net.parameters()))
    reference = mlp(3, [5], 2)
    reference.load_state_dict(net.state_dict())
    x = torch.randn(4, 3)
    for _ in range(2):  # the second pass must not add to the first
        grads.zero()
        net(x).pow(2).sum().backward()
        vector = grads.vector()
    reference(x).pow(2).sum().backward()
    expected = np.concatenate([p.grad.numpy().ravel() for p in reference.parameters()])
    np.testing.assert_allclose(vector, expected, rtol=1e-6)
    assert np.shares_memory(vector, grads.buffer.numpy())
    grads.load(vector.reshape(-1))  # its own memory: nothing to copy
    np.testing.assert_allclose(grads.vector(), expected, rtol=1e-6)
    net[0].weight.grad = None  # a caller that reset a gradient gets the buffer back
    grads.zero()
    assert all(p.grad is view for p, view in zip(grads.params, grads.views, strict=True))
    torch_norm = float(torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 0.5))
    grads.load(expected)
    assert grads.clip(0.5) == pytest.approx(torch_norm, rel=1e-5)
    clipped = np.concatenate([p.grad.numpy().ravel() for p in reference.parameters()])
    np.testing.assert_allclose(grads.vector(), clipped, rtol=1e-5)
