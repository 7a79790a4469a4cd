"""Q-network builder and the flat-weight view that moves policies between ranks.

Weights and gradients cross MPI as one contiguous float32 vector per policy, described by a spec
of (name, shape) pairs, so that a transfer or an allreduce is a single buffer. These helpers are
the only place that knows how a module's parameters are laid out in that vector: the order is
`module.named_parameters()`, which is stable for a given architecture.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}


def mlp(
    in_dim: int, hidden_sizes: Sequence[int], out_dim: int, activation: str = "relu"
) -> nn.Sequential:
    """An MLP whose last layer is linear (Q-values, logits and values are unbounded). Parameter
    names are `0.weight`, `0.bias`, `2.weight`, ...: an actor with the same widths and activation
    lays out the same flat vector."""
    layers: list[nn.Module] = []
    width = in_dim
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), ACTIVATIONS[activation]()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def mlp_layout(
    in_dim: int, hidden_sizes: Sequence[int], out_dim: int, activation: str = "relu"
) -> list[tuple[str, tuple[int, ...]]]:
    """`param_spec` of the `mlp` these arguments build, without building it: initialising a
    network draws from torch's global generator, which a resumable rank must leave alone."""
    with torch.random.fork_rng(devices=[]):
        return param_spec(mlp(in_dim, hidden_sizes, out_dim, activation))


def orthogonal_init(net: nn.Sequential, hidden_gain: float, out_gain: float) -> nn.Sequential:
    """Orthogonal weights and zero biases (the PPO implementations' initialisation); a small
    `out_gain` starts a policy near uniform."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, gain=out_gain if i == len(linears) - 1 else hidden_gain)
        nn.init.zeros_(layer.bias)
    return net


def param_spec(module: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes in flat-vector order, so a receiver can check it holds the same model."""
    return [(name, tuple(p.shape)) for name, p in module.named_parameters()]


def num_params(module: nn.Module) -> int:
    """Length of the flat vector of `module`."""
    return sum(p.numel() for p in module.parameters())


def get_flat(module: nn.Module) -> np.ndarray:
    """A fresh float32 copy of all parameters: safe to hand to a nonblocking send while training
    goes on."""
    return _gather(module, [p.detach() for p in module.parameters()])


def set_flat(module: nn.Module, flat: np.ndarray) -> None:
    """Load parameters from a flat vector (copied, so the caller may reuse its buffer)."""
    params = list(module.parameters())
    with torch.no_grad():
        for p, chunk in zip(params, _split(module, flat), strict=True):
            p.copy_(chunk.view_as(p))


def get_flat_grad(module: nn.Module | Sequence[torch.nn.Parameter]) -> np.ndarray:
    """All gradients as one fresh float32 vector (zeros where a parameter has no gradient yet),
    the fused buffer that data-parallel learners allreduce. Takes a module or a parameter list
    (several networks trained by one optimizer)."""
    params = _params(module)
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in params]
    return _gather(params, grads)


def set_flat_grad(module: nn.Module | Sequence[torch.nn.Parameter], flat: np.ndarray) -> None:
    """Install gradients from a flat vector (copied) so an optimizer step can use them."""
    params = _params(module)
    for p, chunk in zip(params, _split(params, flat), strict=True):
        p.grad = chunk.view_as(p).to(device=p.device, dtype=p.dtype, copy=True)


def _params(module: nn.Module | Sequence[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return list(module.parameters()) if isinstance(module, nn.Module) else list(module)


def _gather(
    module: nn.Module | list[torch.nn.Parameter], tensors: list[torch.Tensor]
) -> np.ndarray:
    params = _params(module)
    out = np.empty(sum(p.numel() for p in params), dtype=np.float32)
    offset = 0
    for t in tensors:
        n = t.numel()
        out[offset : offset + n] = t.reshape(-1).cpu().numpy()
        offset += n
    return out


def _split(module: nn.Module | list[torch.nn.Parameter], flat: np.ndarray) -> list[torch.Tensor]:
    params = _params(module)
    expected = sum(p.numel() for p in params)
    flat = np.asarray(flat)
    if flat.ndim != 1 or flat.size != expected:
        raise ValueError(f"flat vector has shape {flat.shape}, the model needs ({expected},)")
    chunks = []
    offset = 0
    for p in params:
        n = p.numel()
        chunks.append(torch.from_numpy(np.ascontiguousarray(flat[offset : offset + n])))
        offset += n
    return chunks


class RecurrentQNet(nn.Module):
    """A recurrent Q-network (EPyMARL's RNN agent, R2D2's core): a ReLU layer, one GRU layer,
    a linear head. `forward` runs whole sequences (training); `step` advances one time step
    (acting), with the same weights and arithmetic. Parameter names, in flat-vector order:
    `fc1.*`, `rnn.*_l0`, `fc2.*`."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.fc1 = nn.Linear(in_dim, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [B, T, out] of sequences `x` [B, T, in] from states `h0` [B, hidden] (zeros
        when None), and the final states [B, hidden]."""
        z = torch.relu(self.fc1(x))
        out, h = self.rnn(z, None if h0 is None else h0[None].contiguous())
        return self.fc2(out), h[0]

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: Q-values [B, out] of inputs `x` [B, in] in states `h` [B, hidden]."""
        z = torch.relu(self.fc1(x))
        w_ih, w_hh, b_ih, b_hh = self.rnn.all_weights[0]  # the one layer's, in nn.GRU's order
        h = torch.gru_cell(z, h, w_ih, w_hh, b_ih, b_hh)
        return self.fc2(h), h


def recurrent_layout(in_dim: int, hidden: int, out_dim: int) -> list[tuple[str, tuple[int, ...]]]:
    """`param_spec` of the `RecurrentQNet` these arguments build, without drawing from torch's
    global generator."""
    with torch.random.fork_rng(devices=[]):
        return param_spec(RecurrentQNet(in_dim, hidden, out_dim))
