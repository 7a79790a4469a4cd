"""The Python API: `hpcmarl.train(job) -> Run` and `hpcmarl.load_policy(run_dir) -> Policy`.

One tiny CartPole DQN run in this process (a few hundred env steps) serves every test: its
`Run` reads back what the run recorded, and the policy loaded from its checkpoint acts as its
own network says, honouring masks. A recurrent policy is built from a real spec and layout.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hpcmarl
from hpcmarl.algos.contract import PolicySpec
from hpcmarl.algos.networks import recurrent_layout
from hpcmarl.errors import ConfigError, UserError
from hpcmarl.storage.policies import PolicyEntry

from .conftest import TINY


def test_train_runs_a_job_mapping_in_this_process_and_reads_back_its_rows(tiny_run) -> None:
    rows = tiny_run.metrics()
    assert tiny_run.run_dir.is_absolute() and (tiny_run.run_dir / "config.yaml").is_file()
    assert [r["kind"] for r in rows].count("finished") == 1
    assert tiny_run.metrics("progress") and all(
        r["kind"] == "progress" for r in tiny_run.metrics("progress")
    )
    final = tiny_run.final
    assert final["env_steps"] >= 400 and final["reason"].startswith("step budget reached")
    assert final["episodes"] == tiny_run.metrics("progress")[-1]["episodes"] > 0
    saved = (tiny_run.run_dir / "config.yaml").read_text()
    assert "max_env_steps: 400" in saved and "batch_size: 16" in saved  # mapping + override


def test_train_refused_at_start_raises_its_line_and_gives_back_the_signal_handlers(
    tmp_path: Path,
) -> None:
    """The env cannot be made: the refusal comes from the launch path's planning (exit 2 in the
    command), as the exception's message; the caller's SIGINT handler is back afterwards."""

    def mine(signum: int, frame: object) -> None: ...

    before = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(UserError, match="NoSuchEnv-v0") as raised:
            hpcmarl.train(TINY, ["env.id=NoSuchEnv-v0"], run_dir=tmp_path / "run")
        assert "fix: " in str(raised.value) and "exit code" not in str(raised.value)
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
    assert not (tmp_path / "run").exists()


def test_a_job_file_trains_too_and_a_bad_key_raises_before_anything_is_written(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(TINY | {"learner": {"lr": "fast"}}))
    with pytest.raises(ConfigError, match=r"learner\.lr"):
        hpcmarl.train(job, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match="not a run directory"):
        hpcmarl.load_policy(tmp_path)


def test_the_loaded_policy_acts_greedily_as_its_network_scores(tiny_run) -> None:
    policy = hpcmarl.load_policy(tiny_run.run_dir)
    assert policy.key == "main/shared" and policy.version >= 1 and not policy.recurrent
    assert isinstance(policy.module, torch.nn.Module)
    obs = np.random.default_rng(0).normal(size=(1000, 4)).astype(np.float32)
    with torch.no_grad():
        scores = policy.module(torch.from_numpy(obs)).numpy()
    assert np.array_equal(policy.act(obs), scores.argmax(axis=1))
    assert policy.act(obs[0]) == scores[0].argmax()  # one observation, one action
    only_1 = np.zeros((1000, 2), bool)
    only_1[:, 1] = True
    assert (policy.act(obs, legal_mask=only_1) == 1).all()
    assert (policy.act(obs, legal_mask=only_1, sample=True) == 1).all()
    with pytest.raises(ValueError, match="takes observations of 4 values"):
        policy.act(np.zeros((3, 5)))


def test_a_policy_or_checkpoint_the_run_lacks_is_refused_naming_what_it_holds(tiny_run) -> None:
    assert hpcmarl.load_policy(tiny_run.run_dir, "shared", "000001").key == "main/shared"
    assert hpcmarl.load_policy(tiny_run.run_dir, "main/shared").checkpoint == "000001"
    with pytest.raises(UserError, match=r"no policy 'p9' \(it holds: main/shared\)"):
        hpcmarl.load_policy(tiny_run.run_dir, "p9")
    with pytest.raises(UserError, match=r"no checkpoint '000042' \(it has: 000001\)"):
        hpcmarl.load_policy(tiny_run.run_dir, checkpoint="000042")


def recurrent_policy() -> hpcmarl.Policy:
    """A GRU Q-network policy (VDN's, R2D2's) with random weights: 4 inputs, 3 actions."""
    layout = tuple(recurrent_layout(4, 8, 3))
    spec = PolicySpec("main/p", "recurrent_epsilon_greedy", 4, 3, (), params=layout, recurrent=8)
    weights = np.random.default_rng(1).normal(size=spec.size).astype(np.float32)
    return hpcmarl.Policy(PolicyEntry(spec.key, spec.to_json(), weights, 3), "000001")


def test_a_recurrent_policy_takes_and_returns_its_state() -> None:
    policy = recurrent_policy()
    obs = np.random.default_rng(2).normal(size=(2, 16, 4)).astype(np.float32)
    first, state = policy.act(obs[0])
    second, state = policy.act(obs[1], state=state)
    with torch.no_grad():
        q, h = policy.module(torch.from_numpy(obs.transpose(1, 0, 2)))  # [B, T=2, in]
    assert np.array_equal(first, q[:, 0].argmax(1).numpy())
    assert np.array_equal(second, q[:, 1].argmax(1).numpy())
    assert np.allclose(state, h.numpy(), atol=1e-5)


def test_importing_hpcmarl_and_naming_train_import_neither_torch_nor_mpi4py() -> None:
    code = (
        "import sys, hpcmarl; hpcmarl.train, hpcmarl.Run;"
        "print(sorted({'torch', 'mpi4py'} & set(sys.modules)));"
        "hpcmarl.load_policy; print(sorted({'torch', 'mpi4py'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout == "[]\n['torch']\n", out.stderr
