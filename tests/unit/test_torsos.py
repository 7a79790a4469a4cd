"""Users' own networks (`learner.model.torso`): a factory outside the package trains, travels
with the policy's spec into the checkpoint and is rebuilt from it; the built-in `cnn` trains on
images; a factory that cannot serve ends start-up in one line.

The runs are tiny DQN jobs in this process (a few seconds each); PPO and the recurrent agents
are checked by one update on random items.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hpcmarl
from hpcmarl.__main__ import main as hpcmarl_main
from hpcmarl.algos.actors import build_actor
from hpcmarl.algos.contract import PolicySpec, run_update
from hpcmarl.algos.networks import param_spec, policy_network, set_flat
from hpcmarl.algos.ppo import PPO
from hpcmarl.algos.torsos import Torso, TorsoHead, space_json
from hpcmarl.algos.value_decomposition import ValueDecomposition
from hpcmarl.launch import run
from hpcmarl.policy_export import export_policy
from hpcmarl.storage.checkpoint import latest_checkpoint
from hpcmarl.storage.policies import policy_tables
from hpcmarl.testing.groups import group_of, job_with, random_items

from . import user_nets
from .conftest import TINY

SMALL = "tests.unit.user_nets:small_torso"
SHORT = [
    "commander.max_env_steps=5000",
    "commander.max_updates=20",
    "learner.updates_per_task=10",
    "learner.push_interval=1",
    "learner.batch_size=16",
    "topology.replay_shards=1",
    "topology.learners=1",
]
"""Twenty updates of one learner, every one published: the checkpoint's policy is the
learner's network."""
SMALL_CNN = "{channels: [4, 8], kernels: [3, 3], strides: [2, 1], features: 16}"


def learner_online(run_dir: Path) -> dict[str, torch.Tensor]:
    """The state dict of the learner's online network in the run's newest checkpoint."""
    ckpt, _ = latest_checkpoint(run_dir)
    assert ckpt is not None
    state = ckpt.read_role("learner0")["groups"]["shared"]["algo"]["online"]  # type: ignore[index]
    return {name: torch.as_tensor(np.asarray(v)) for name, v in state.items()}


def same_outputs(a: torch.nn.Module, b: torch.nn.Module, rows: np.ndarray) -> bool:
    x = torch.as_tensor(rows, dtype=torch.float32)
    with torch.no_grad():
        return torch.equal(a(x), b(x))


def test_a_user_torso_trains_dqn_and_its_checkpoint_rebuilds_the_same_network(
    tmp_path: Path,
) -> None:
    overrides = [f"learner.model.torso={SMALL}", "learner.model.kwargs={width: 12}", *SHORT]
    trained = hpcmarl.train(TINY, overrides, run_dir=tmp_path / "run")
    assert trained.final["updates"] >= 20
    ckpt, _ = latest_checkpoint(trained.run_dir)
    assert ckpt is not None
    (entry,) = policy_tables(ckpt).values()
    saved = json.loads(entry.spec_json)["torso"]
    assert saved["name"] == SMALL and saved["kwargs"] == {"width": 12}
    assert saved["space"]["shape"] == [4]  # CartPole's observation space, bounds included

    policy = hpcmarl.load_policy(trained.run_dir)
    assert isinstance(policy.module, TorsoHead)
    assert isinstance(policy.module.torso.net, torch.nn.Sequential)  # the user's own module
    rebuilt = policy_network(policy.spec)
    rebuilt.load_state_dict(learner_online(trained.run_dir))
    rows = np.random.default_rng(0).normal(size=(64, 4))
    assert same_outputs(rebuilt, policy.module, rows)
    fresh = policy_network(policy.spec)
    assert not same_outputs(fresh, policy.module, rows)  # trained, not the initial weights

    resumed = hpcmarl.train(TINY, [*overrides, "commander.max_updates=30"], trained.run_dir)
    assert resumed.final["updates"] >= 30  # the same network, resumed from its checkpoint


def test_cnn_trains_dqn_on_image_observations(tmp_path: Path) -> None:
    overrides = [
        f"env.id=tests.unit.user_nets:{user_nets.IMAGE_ENV}",
        "learner.model.torso=cnn",
        f"learner.model.kwargs={SMALL_CNN}",
        *SHORT,
    ]
    trained = hpcmarl.train(TINY, overrides, run_dir=tmp_path / "run")
    assert trained.final["updates"] >= 20
    policy = hpcmarl.load_policy(trained.run_dir)
    space = policy.spec.torso.space
    assert space["shape"] == list(user_nets.IMAGE_SHAPE) and space["dtype"] == "uint8"
    rebuilt = policy_network(policy.spec)
    rebuilt.load_state_dict(learner_online(trained.run_dir))
    env = user_nets.TinyImageEnv()
    images = np.stack([env.reset(seed=i)[0] for i in range(8)])  # [8, 12, 12, 3] uint8
    assert same_outputs(rebuilt, policy.module, images.reshape(8, -1))
    assert policy.act(images).shape == (8,)
    onnxruntime = pytest.importorskip("onnxruntime")
    export_policy(policy, "onnx", tmp_path / "cnn.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "cnn.onnx"))
    rows = images.reshape(8, -1).astype(np.float32)
    with torch.no_grad():
        expected = policy.module(torch.as_tensor(rows)).numpy()
    np.testing.assert_allclose(session.run(None, {"observations": rows})[0], expected, atol=1e-5)


ERRORS = [
    ("tests.unit.user_nets:nothing_here", "has no nothing_here"),
    ("no_such_module_here:make", "module no_such_module_here cannot be imported"),
    ("tests.unit.user_nets:NOT_CALLABLE", "is not callable"),
    ("tests.unit.user_nets:returns_a_list", "returned list, not a torch.nn.Module"),
    ("tests.unit.user_nets:one_feature_per_batch", "to a 1-D torch.float32 tensor"),
    ("tests.unit.user_nets:raises", "ValueError: no network for this space"),
    ("cnn", "cnn needs image observations"),
    ("mlpp", "neither a built-in torso nor module:function"),
]


@pytest.mark.parametrize(("torso", "says"), ERRORS, ids=[e[0] for e in ERRORS])
def test_a_torso_that_cannot_serve_ends_start_up_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    torso: str,
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = run.run_job(None, [f"learner.model.torso={torso}", "commander.max_env_steps=200"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hpcmarl: error: ")]
    assert code == 2 and len(lines) == 1, err
    assert says in lines[0] and "; fix: " in lines[0] and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # refused before the run directory


def test_explain_documents_the_torso_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert hpcmarl_main(["--explain", "learner.model.torso"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("    learner.model.torso: str = 'mlp'") and "module:function" in text
    assert "learner.lr" not in text
    assert hpcmarl_main(["--explain", "learner.model.tors"]) == 2
    assert "did you mean learner.model.torso" in capsys.readouterr().err


def test_mlp_takes_no_kwargs_and_its_spec_is_the_text_older_runs_wrote(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = run.run_job(None, ["learner.model.kwargs={width: 3}", "commander.max_env_steps=200"])
    assert code == 2 and "the mlp torso takes none" in capsys.readouterr().err
    (spec,) = PPO.policy_specs(group_of(4, 2), job_with(hidden_sizes=[8])).values()
    assert "torso" not in json.loads(spec.to_json())
    assert PolicySpec.from_json(spec.to_json()) == spec


def image_group(agents: int = 1):  # type: ignore[no-untyped-def]
    """A group whose agents observe `user_nets`' images."""
    group = group_of(int(np.prod(user_nets.IMAGE_SHAPE)), 2, agents=agents)
    plain = space_json(user_nets.TinyImageEnv.observation_space, group.obs_dims["a0"])
    return type(group)(**{**vars(group), "obs_spaces": dict.fromkeys(group.agents, plain)})


def test_ppo_with_a_user_torso_updates_and_its_actor_matches_the_learner() -> None:
    job = job_with(hidden_sizes=[8], collector__fragment_length=4, ppo__critic="local")
    job.learner.model.torso = SMALL
    group = group_of(4, 3)
    ppo = PPO(group, job, seed=0)
    assert isinstance(ppo.networks["critic"].torso, Torso)  # a local critic reads observations
    stats = run_update(ppo, random_items(PPO.item_spec(group, job), 4, 3)).stats
    assert np.isfinite(stats["policy_loss"])
    (spec,) = PPO.policy_specs(group, job).values()
    actor = build_actor(PolicySpec.from_json(spec.to_json()))
    actor.set_weights(ppo.publish()[spec.key])
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    with torch.no_grad():
        expected = ppo.acting("shared")(torch.as_tensor(obs))
    assert torch.equal(actor.scores(obs), expected)  # type: ignore[attr-defined]


def test_recurrent_agents_with_the_cnn_torso_update_on_image_episodes() -> None:
    job = job_with(hidden_sizes=[8], qmix__rnn_hidden=8, qmix__episode_limit=3, algo="vdn")
    job.learner.qmix.mixer = "vdn"
    job.learner.model.torso = "cnn"
    job.learner.model.kwargs = {"channels": [4], "kernels": [3], "strides": [2], "features": 8}
    group = image_group(agents=2)
    vdn = ValueDecomposition(group, job, seed=0)
    (spec,) = ValueDecomposition.policy_specs(group, job).values()
    assert spec.params == tuple(param_spec(vdn.agent)) and spec.agent_ids == 2
    stats = run_update(vdn, random_items(vdn.item_spec(group, job), 2, 2)).stats
    assert np.isfinite(stats["loss"])
    actor = build_actor(spec)
    actor.set_weights(vdn.publish()[spec.key])
    rows = np.random.default_rng(2).integers(0, 255, (3, spec.obs_dim)).astype(np.float32)
    index = np.array([0, 1, 0])
    result = actor.act(rows, np.random.default_rng(0), env_steps=0, greedy=True, agent_index=index)
    assert result.recurrent_state is not None and result.recurrent_state.shape == (3, 8)
    copy = policy_network(spec)
    set_flat(copy, vdn.publish()[spec.key])
    assert same_outputs(copy.torso, vdn.agent.torso, np.c_[rows, np.eye(2)[index]])
