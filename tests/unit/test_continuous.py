"""Continuous (Box) actions: PPO's Gaussian actor and loss, the env adapters' clipping
(turn-based ones too), replay logs of float actions and what reads them, and the one-line
refusal of every algorithm that cannot act in a Box."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import gymnasium
import h5py
import numpy as np
import pytest
import torch

import hpcmarl
from hpcmarl.algos.actors import GaussianActor, UniformActor, build_actor
from hpcmarl.algos.contract import PolicySpec, run_update
from hpcmarl.algos.ppo import PPO
from hpcmarl.algos.registry import check_fits
from hpcmarl.analysis import analyze
from hpcmarl.analysis.cli import export_main
from hpcmarl.envs.adapters import GymnasiumCopy, StepBuffers
from hpcmarl.envs.aec import AECCopy
from hpcmarl.errors import EnvError, UserError
from hpcmarl.launch import run
from hpcmarl.testing.groups import group_of, job_with

from . import box_turns

torch.set_num_threads(1)
BOX = ((-1.0, -1.0), (1.0, 1.0))
SPREAD = [
    "env.kind=pettingzoo",
    "env.id=mpe2.simple_spread_v3",
    "env.kwargs={N: 2, max_cycles: 10, continuous_actions: true}",
]


def continuous_ppo(**settings: object) -> PPO:
    """PPO over one agent with 3 observations and 2-D actions in [-1, 1]^2."""
    group = dataclasses.replace(group_of(3, 2), action_boxes={"a0": BOX})
    job = job_with(hidden_sizes=[16], collector__fragment_length=5, **settings)
    return PPO(group, job, 0)


def test_the_gaussian_actor_records_the_density_of_what_it_sampled() -> None:
    ppo = continuous_ppo()
    (spec,) = PPO.policy_specs(ppo.group, ppo.job).values()
    assert spec.actor == "gaussian" and spec.action_box == BOX
    assert PolicySpec.from_json(spec.to_json()) == spec
    actor = build_actor(spec)
    assert isinstance(actor, GaussianActor)
    net = ppo.acting("shared")
    with torch.no_grad():
        net.log_std.fill_(-0.5)
    actor.set_weights(ppo.publish()[spec.key])
    obs = np.random.default_rng(1).standard_normal((500, 3)).astype(np.float32)
    sampled = actor.act(obs, np.random.default_rng(2), env_steps=0, greedy=False)
    assert sampled.actions.dtype == np.float32 and sampled.actions.shape == (500, 2)
    with torch.no_grad():
        mean = net(torch.from_numpy(obs))
        normal = torch.distributions.Normal(mean, net.log_std.exp())
        density = normal.log_prob(torch.from_numpy(sampled.actions)).sum(-1).numpy()
    np.testing.assert_allclose(sampled.extras["log_probs"], density, rtol=1e-4, atol=1e-4)
    assert np.abs(sampled.actions).max() > 1.0  # unclipped: the env adapter clips
    greedy = actor.act(obs, np.random.default_rng(2), env_steps=0, greedy=True)
    np.testing.assert_allclose(greedy.actions, mean.numpy(), rtol=1e-6)
    uniform = UniformActor(spec).act(obs, np.random.default_rng(3), env_steps=0, greedy=False)
    assert uniform.actions.shape == (500, 2) and np.abs(uniform.actions).max() <= 1.0


def test_fragments_hold_float_action_vectors_and_the_first_epoch_has_ratio_one() -> None:
    ppo = continuous_ppo(ppo__epochs=2, ppo__minibatches=2)
    spec = PPO.item_spec(ppo.group, ppo.job)
    assert spec.column("actions").dtype == "<f4" and spec.column("actions").shape == (2,)
    (policy,) = PPO.policy_specs(ppo.group, ppo.job).values()
    actor = build_actor(policy)
    actor.set_weights(ppo.publish()[policy.key])
    rng = np.random.default_rng(0)
    batch = {n: np.zeros(s, np.dtype(d)) for n, d, s in spec.batch_specs(4)}
    batch["observations"][:] = rng.standard_normal(batch["observations"].shape)
    batch["active"][:] = True
    acted = actor.act(batch["observations"].reshape(-1, 3), rng, env_steps=0, greedy=False)
    batch["actions"] = acted.actions.reshape(4, 5, 1, 2)
    batch["log_probs"] = acted.extras["log_probs"].reshape(4, 5, 1)
    stats = continuous_ppo(ppo__epochs=1, ppo__minibatches=1)
    assert run_update(stats, batch).stats["approx_kl"] == pytest.approx(0.0, abs=1e-5)
    assert run_update(ppo, batch).stats["entropy"] > 0


def test_ppo_moves_its_gaussian_mean_to_the_rewarded_action() -> None:
    """Reward -(a - 0.5)^2 summed over dims, each step an episode: the mean goes to 0.5."""
    ppo = continuous_ppo(lr=0.01, ppo__entropy_coef=0.0)
    (spec,) = PPO.policy_specs(ppo.group, ppo.job).values()
    actor = build_actor(spec)
    rng = np.random.default_rng(0)
    item = PPO.item_spec(ppo.group, ppo.job)
    for _ in range(40):
        actor.set_weights(ppo.publish()[spec.key])
        batch = {n: np.zeros(s, np.dtype(d)) for n, d, s in item.batch_specs(8)}
        batch["observations"][:] = rng.standard_normal(batch["observations"].shape)
        batch["active"][:] = batch["terminations"][:] = True
        acted = actor.act(batch["observations"].reshape(-1, 3), rng, env_steps=0, greedy=False)
        batch["actions"] = acted.actions.reshape(8, 5, 1, 2)
        batch["log_probs"] = acted.extras["log_probs"].reshape(8, 5, 1)
        clipped = np.clip(batch["actions"], -1.0, 1.0)
        batch["rewards"] = -((clipped - 0.5) ** 2).sum(-1).astype(np.float32)
        run_update(ppo, batch)
    actor.set_weights(ppo.publish()[spec.key])
    obs = rng.standard_normal((200, 3)).astype(np.float32)
    greedy = actor.act(obs, rng, env_steps=0, greedy=True).actions
    assert np.abs(greedy - 0.5).mean() < 0.15


def test_the_gymnasium_adapter_clips_actions_to_the_box() -> None:
    """Pendulum stepped with torque 50 is Pendulum stepped with its bound, 2."""
    rewards = []
    for torque in (50.0, 2.0):
        copy = GymnasiumCopy(gymnasium.make("Pendulum-v1"), "Pendulum-v1")
        out = StepBuffers.empty([3], 1, None)
        copy.reset_into(0, 0, out.obs)
        copy.step_into([np.array([torque], np.float32)], 0, out)
        rewards.append((out.rewards.copy(), out.obs[0].copy()))
        copy.check_api()
    np.testing.assert_array_equal(rewards[0][0], rewards[1][0])
    np.testing.assert_array_equal(rewards[0][1], rewards[1][1])


def test_ippo_trains_a_pettingzoo_env_with_box_actions_and_logs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mpe2's simple_spread with continuous actions, through collectors, shards and learner;
    its replay log holds the unclipped float32 samples, which `analyze` summarises per
    dimension, Minari reads back clipped to the recorded Box, and offline BC refuses."""
    import minari

    code = run.run_job(
        None,
        [
            *SPREAD,
            "learner.algo=ippo",
            "learner.ppo.batch_fragments=2",
            "collector.fragment_length=10",
            "commander.max_env_steps=200",
            "topology.collectors=1",
            "replay_log.enabled=true",
            f"runtime.run_dir={tmp_path / 'run'}",
        ],
    )
    assert code == 0
    policy = hpcmarl.load_policy(tmp_path / "run")
    actions = policy.act(np.zeros((4, policy.spec.obs_dim), np.float32), sample=True)
    assert actions.shape == (4, 5) and actions.min() >= 0.0 and actions.max() <= 1.0
    (log,) = (tmp_path / "run" / "replay").glob("*.h5")
    with h5py.File(log) as f:
        logged = f["agents/agent_0/actions"][()]
        space = json.loads(f.attrs["action_spaces"])["agent_0"]
    assert logged.dtype == np.float32 and logged.shape[1:] == (5,) and len(logged) >= 200
    assert (logged < 0).any() or (logged > 1).any()  # unclipped samples
    assert space == {"type": "Box", "dtype": "float32", "shape": [5], "low": [0.0] * 5} | {
        "high": [1.0] * 5
    }
    dims = analyze([log])["agents"]["agent_0"]["actions"]["dims"]
    assert len(dims) == 5 and dims[0]["count"] == len(logged)
    exported = tmp_path / "exported"
    assert (
        export_main([str(log), "--format", "minari", "--agent", "0", "--out", str(exported)]) == 0
    )
    dataset_id = json.loads((exported / "data" / "metadata.json").read_text())["dataset_id"]
    (tmp_path / "datasets" / dataset_id).parent.mkdir(parents=True)
    exported.rename(tmp_path / "datasets" / dataset_id)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    dataset = minari.load_dataset(dataset_id)
    assert dataset.action_space == gymnasium.spaces.Box(0.0, 1.0, (5,), np.float32)
    for episode in dataset.iterate_episodes():
        assert episode.actions.dtype == np.float32 and episode.actions.shape[1:] == (5,)
        assert episode.actions.min() >= 0.0 and episode.actions.max() <= 1.0  # as the env took
    offline = ["learner.algo=bc", f"offline.dataset={log}", "commander.max_updates=5"]
    with pytest.raises(UserError, match=r"continuous \(Box\) actions .* discrete actions only"):
        hpcmarl.train(None, offline, run_dir=tmp_path / "offline")


def test_the_turn_based_adapter_clips_box_actions() -> None:
    """A mover's unbounded sample reaches the AEC env clipped (it refuses moves outside)."""
    copy = AECCopy(box_turns.env(), "tests.unit.box_turns")
    out = StepBuffers.empty([2, 2], 1, None)
    copy.reset_into(0, 0, out.obs)
    for sample, moved in ((50.0, 1.0), (-0.25, -0.25), (-3.0, -1.0)):
        copy.step_into([np.array([sample], np.float32)] * 2, 0, out)
        assert copy.env.last_move[0] == np.float32(moved)


def test_ppo_trains_a_turn_based_env_with_box_actions(tmp_path: Path) -> None:
    """`box_turns`: random play earns about 1.9 a game (8 moves), the best 8; PPO's shared
    policy learns each player's target in 1,200 env steps (6.2 there, 12 s at load 12), and the
    turn-based replay log holds each player's unclipped float32 moves."""
    job = {"commander": {"max_env_steps": 1200, "eval_interval_s": 3600}}
    done = hpcmarl.train(
        job,
        [
            "env.kind=pettingzoo",
            "env.id=tests.unit.box_turns",
            "learner.algo=ppo",
            "learner.lr=0.003",
            "learner.ppo.entropy_coef=0.0",
            "learner.ppo.batch_fragments=2",
            "collector.fragment_length=16",
            "topology.collectors=1",
            "replay_log.enabled=true",
        ],
        run_dir=tmp_path / "run",
    )
    assert done.final["train_return"] > 4.5
    policy = hpcmarl.load_policy(done.run_dir)
    first, second = policy.act(np.array([[0.5, 0.0], [-0.5, 0.0]], np.float32))[:, 0]
    assert first > 0 > second
    moves = []
    for log in (tmp_path / "run" / "replay").glob("*.h5"):
        with h5py.File(log) as f:
            moves += [f[f"agents/{a}/actions"][()] for a in box_turns.AGENTS]
    assert all(m.dtype == np.float32 and m.shape[1:] == (1,) for m in moves)
    assert max(np.abs(m).max() for m in moves) > 1.0


REFUSED = [
    (["learner.algo=r2d2", "env.id=Pendulum-v1"], "R2D2 needs a Discrete action space"),
    (["learner.algo=vdn", *SPREAD], "VDN needs a Discrete action space"),
    (["learner.algo=qmix", *SPREAD], "QMIX needs a Discrete action space"),
]


def test_dqn_on_pendulum_ends_in_one_line_naming_ppo_with_exit_2(tmp_path: Path) -> None:
    """The command a user types, in its own process: exit 2, one line, no traceback."""
    args = ["learner.algo=dqn", "env.id=Pendulum-v1", f"runtime.run_dir={tmp_path}"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcmarl", *args], capture_output=True, text=True, timeout=120
    )
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(said) == 1, done.stderr
    assert said[0].startswith("hpcmarl: error: DQN needs a Discrete action space")
    assert "learner.algo=ppo" in said[0]


@pytest.mark.parametrize(("overrides", "says"), REFUSED, ids=[r[1][:4] for r in REFUSED])
def test_value_based_algorithms_refuse_box_actions_naming_ppo(
    tmp_path: Path, overrides: list[str], says: str
) -> None:
    job = {"commander": {"max_env_steps": 200}}
    with pytest.raises(UserError) as refused:
        hpcmarl.train(job, overrides, run_dir=tmp_path / "run")
    assert says in str(refused.value) and "learner.algo=ppo" in str(refused.value)


def test_psro_is_refused_box_actions_whatever_trains_it() -> None:
    box = gymnasium.spaces.Box(-1.0, 1.0, (2,))
    check_fits("ppo", box)
    with pytest.raises(EnvError, match="PSRO needs Discrete action spaces"):
        check_fits("ppo", box, psro=True)
