"""`python -m hpcmarl export-policy RUN_DIR --format torchscript|onnx|state_dict --out PATH`.

A trained policy leaves hpcmarl as a file that plain torch or onnxruntime reads: TorchScript
(`torch.jit.load`), ONNX (`onnxruntime.InferenceSession`) or a state dict (`load_state_dict`
into the same module, `hpcmarl.load_policy(...).module` or the class `describe` names). The
exported network maps a batch of observations (flattened, with the one-hot agent index
appended where the policy's spec has `agent_ids`) to one score per action: Q-values or logits,
whose argmax over the legal actions is the greedy action; a continuous (Gaussian) policy's to
its mean action, which clipped to the action bounds is the greedy action. A recurrent policy's
network takes and returns its state too: `(observations, state) -> (scores, next_state)`, one
step.
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import UserError
from .policy import Policy, load_policy

__all__ = ["FORMATS", "RecurrentStep", "export_policy", "export_policy_main"]

FORMATS = ("torchscript", "onnx", "state_dict")
ONNX_OPSET = 17
"""The ONNX operator set written: read by every onnxruntime since 1.14."""


class RecurrentStep(nn.Module):
    """One step of a recurrent Q-network as a plain `forward`, the form exporters take:
    observations [B, in] and states [B, hidden] to scores [B, actions] and next states."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, observations: torch.Tensor, state: torch.Tensor) -> Any:
        scores, next_state = self.net(observations[:, None], state)
        return scores[:, 0], next_state


def acting_network(policy: Policy) -> tuple[nn.Module, tuple[torch.Tensor, ...], list[str]]:
    """The network to export, example inputs for tracing and the names of its inputs."""
    rows = torch.zeros(2, policy.spec.in_dim)
    if policy.recurrent:
        step = RecurrentStep(policy.module).eval()
        return step, (rows, torch.zeros(2, policy.recurrent)), ["observations", "state"]
    return policy.module.eval(), (rows,), ["observations"]


def export_policy(policy: Policy, fmt: str, out: str | Path) -> str:
    """Write `policy` to `out` in format `fmt`; returns the line saying what was written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "state_dict":
        torch.save(policy.module.state_dict(), out)
    elif fmt == "torchscript":
        with quiet_exporters():
            torch.jit.save(_scripted(policy), str(out))
    elif fmt == "onnx":
        with quiet_exporters():
            _export_onnx(policy, out)
    else:
        raise UserError(f"unknown export format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    return f"hpcmarl: wrote {out} ({fmt}): {describe(policy)}"


@contextmanager
def quiet_exporters() -> Iterator[None]:
    """Without torch's warnings that say nothing about this export: TorchScript and the
    TorchScript-based ONNX exporter are deprecated (the formats asked for need them); the ONNX
    exporter's tracing of `nn.GRU` warns of its input checks, and of a batch size fixed unless
    the state is an input, as it is here (tests/unit/test_policy_export.py steps another)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", "Exporting a model to ONNX with a batch_size other")
        yield


def _scripted(policy: Policy) -> torch.jit.ScriptModule:
    """The network compiled by `torch.jit.script`, which keeps every branch; a network it
    cannot compile (a user's torso in plain Python) is traced on example inputs instead."""
    net, example, _ = acting_network(policy)
    try:
        return torch.jit.script(net)
    except Exception:  # noqa: BLE001 - the compiler's reasons are many; tracing may do
        pass
    try:
        return torch.jit.trace(net, example)
    except Exception as err:  # noqa: BLE001
        raise UserError(
            f"policy {policy.key} ({type(net).__name__}) cannot be exported to TorchScript: "
            f"{_first_line(err)}",
            "export it as state_dict or onnx",
        ) from None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _export_onnx(policy: Policy, out: Path) -> None:
    if importlib.util.find_spec("onnx") is None:  # torch writes the file through it
        raise UserError(
            "ONNX export needs the onnx package, which is not installed",
            "pip install onnx, or export as torchscript",
        )
    net, example, inputs = acting_network(policy)
    outputs = ["scores", "next_state"] if policy.recurrent else ["scores"]
    batch = {name: {0: "batch"} for name in [*inputs, *outputs]}
    try:
        torch.onnx.export(
            net,
            example,
            str(out),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=batch,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    except Exception as err:  # noqa: BLE001 - the exporter's own reasons are many
        out.unlink(missing_ok=True)
        raise UserError(
            f"policy {policy.key} ({type(net).__name__}) cannot be exported to ONNX: "
            f"{_first_line(err)}",
            "export it as torchscript or state_dict",
        ) from None


def describe(policy: Policy) -> str:
    """The policy and the exported network's inputs and outputs, in one clause."""
    spec = policy.spec
    inputs = f"observations [B, {spec.in_dim}]"
    outputs, greedy = f"scores [B, {spec.n_actions}]", "argmax"
    if spec.actor == "gaussian":  # log_std is in the state dict, not an output
        outputs, greedy = f"mean [B, {spec.n_actions}]", "the mean clipped to the action bounds"
    if policy.recurrent:
        inputs += f", state [B, {policy.recurrent}]"
        outputs += f", next_state [B, {policy.recurrent}]"
    return (
        f"policy {policy.key} (version {policy.version}, checkpoint {policy.checkpoint}, "
        f"{type(policy.module).__name__}): {inputs} -> {outputs}; greedy action = {greedy}"
    )


def export_policy_main(argv: list[str]) -> int:
    """The command: one line naming what was written, or one error line and exit code 2."""
    from .analysis.cli import guarded

    args = _parser().parse_args(argv)

    def run() -> int:
        policy = load_policy(args.run_dir, args.policy, args.checkpoint)
        print(export_policy(policy, args.format, args.out))
        return 0

    return guarded(run)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpcmarl export-policy",
        description="Write a run's trained policy as a file plain torch or onnxruntime reads.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, metavar="PATH", help="the file to write")
    p.add_argument("--policy", help="policy id or key (needed where the run has several)")
    p.add_argument("--checkpoint", help="checkpoint id such as 000005 (default: the newest)")
    return p
