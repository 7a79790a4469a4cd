"""`python -m hpcmarl export-policy`: each format, read back by plain torch or onnxruntime,
takes the loaded policy's greedy actions on 1,000 observations.

The trained policy is the tiny in-process run's (conftest.py); a recurrent policy (built from
a real spec, random weights) is exported as TorchScript and ONNX and stepped with its state.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import hpcmarl
from hpcmarl.__main__ import main
from hpcmarl.algos.actors import build_actor
from hpcmarl.launch.signals import CAUGHT
from hpcmarl.policy_export import export_policy

from .test_api import recurrent_policy

OBSERVATIONS = np.random.default_rng(7).normal(scale=2.0, size=(1000, 4)).astype(np.float32)


def command(*args: str) -> int:
    """`python -m hpcmarl ARGS` in this process, leaving the signal handlers as they were."""
    handlers = {sig: signal.getsignal(sig) for sig in CAUGHT}
    try:
        return main(list(args))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def exported(run_dir: Path, fmt: str, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = command("export-policy", str(run_dir), "--format", fmt, "--out", str(out))
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert out.is_file()
    return printed.out


def test_each_format_read_by_plain_torch_or_onnxruntime_acts_as_the_policy(
    tiny_run: hpcmarl.Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = hpcmarl.load_policy(tiny_run.run_dir)
    greedy = policy.act(OBSERVATIONS)
    assert 0 < greedy.sum() < len(greedy)  # both actions occur: the match means something
    line = exported(tiny_run.run_dir, "torchscript", tmp_path / "p.pt", capsys)
    assert "observations [B, 4] -> scores [B, 2]" in line and "main/shared" in line
    scripted = torch.jit.load(str(tmp_path / "p.pt"))
    assert np.array_equal(scripted(torch.from_numpy(OBSERVATIONS)).argmax(1).numpy(), greedy)

    exported(tiny_run.run_dir, "state_dict", tmp_path / "p.state", capsys)
    fresh = build_actor(policy.spec).net  # the same module class, its own random weights
    fresh.load_state_dict(torch.load(tmp_path / "p.state", weights_only=True))
    with torch.no_grad():
        assert np.array_equal(fresh(torch.from_numpy(OBSERVATIONS)).argmax(1).numpy(), greedy)

    exported(tiny_run.run_dir, "onnx", tmp_path / "p.onnx", capsys)
    session = onnxruntime.InferenceSession(str(tmp_path / "p.onnx"))
    (scores,) = session.run(["scores"], {"observations": OBSERVATIONS})
    assert np.array_equal(scores.argmax(1), greedy)


def test_a_recurrent_policy_exports_one_step_with_its_state(tmp_path: Path) -> None:
    policy = recurrent_policy()
    obs = np.random.default_rng(3).normal(size=(3, 1000, 4)).astype(np.float32)
    state = None
    expected = []
    for t in range(3):
        actions, state = policy.act(obs[t], state=state)
        expected.append(actions)
    export_policy(policy, "torchscript", tmp_path / "r.pt")
    export_policy(policy, "onnx", tmp_path / "r.onnx")
    scripted = torch.jit.load(str(tmp_path / "r.pt"))
    session = onnxruntime.InferenceSession(str(tmp_path / "r.onnx"))
    h_torch = h_onnx = np.zeros((1000, 8), np.float32)
    for t in range(3):
        scores, h = scripted(torch.from_numpy(obs[t]), torch.from_numpy(h_torch))
        h_torch = h.numpy()
        assert np.array_equal(scores.argmax(1).numpy(), expected[t])
        scores, h_onnx = session.run(None, {"observations": obs[t], "state": h_onnx})
        assert np.array_equal(scores.argmax(1), expected[t])
    assert np.allclose(h_onnx, state, atol=1e-5) and np.allclose(h_torch, state, atol=1e-5)


def test_a_wrong_policy_or_run_is_one_line_and_exit_2(
    tiny_run: hpcmarl.Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "p.pt")
    run_dir = str(tiny_run.run_dir)
    code = command("export-policy", run_dir, "--format", "onnx", "--out", out, "--policy", "p9")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no policy 'p9' (it holds: main/shared)" in err
    code = command("export-policy", str(tmp_path), "--format", "torchscript", "--out", out)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hpcmarl: error: ") and "not a run directory" in err
    assert not (tmp_path / "p.pt").exists()


class PlainPython(torch.nn.Module):
    """A network `torch.jit.script` cannot compile (a lambda attribute), as a user's torso
    written in plain Python may be; tracing records it."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.post = lambda x: x * 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.inner(x))


def test_a_network_torchscript_cannot_compile_is_traced_instead(
    tiny_run: hpcmarl.Run, tmp_path: Path
) -> None:
    policy = hpcmarl.load_policy(tiny_run.run_dir)
    greedy = policy.act(OBSERVATIONS)
    policy.actor.net = PlainPython(policy.module)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the compiler raises
        torch.jit.script(policy.module)
    export_policy(policy, "torchscript", tmp_path / "p.pt")
    traced = torch.jit.load(str(tmp_path / "p.pt"))
    assert np.array_equal(traced(torch.from_numpy(OBSERVATIONS)).argmax(1).numpy(), greedy)
