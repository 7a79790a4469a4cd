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
    return _gather([p.detach() for p in module.parameters()])


def set_flat(module: nn.Module, flat: np.ndarray) -> None:
    """Load parameters from a flat vector (copied, so the caller may reuse its buffer)."""
    params = list(module.parameters())
    with torch.no_grad():
        for p, chunk in zip(params, _split(module, flat), strict=True):
            p.copy_(chunk.view_as(p))


class FlatGrads:
    """The gradients of a list of parameters kept in one contiguous float32 buffer: every
    `p.grad` is a view into it, so `loss.backward()` accumulates straight into the vector a
    group averages, and an average that comes back in that same memory (one learner, Horovod's
    in-place allreduce) costs no copy. Gathering a dozen tensors into a fresh vector and
    scattering the average back cost more than the optimizer step for the small networks RL
    trains (issue 13's profile)."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = list(params)
        first = self.params[0]
        self.buffer = torch.zeros(sum(p.numel() for p in self.params), device=first.device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in self.params:
            self.views.append(self.buffer[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.install()
        self.host = self.buffer.numpy() if self.buffer.device.type == "cpu" else None
        """The buffer's own memory as numpy, where it lives on the host."""

    def install(self) -> None:
        """Point every parameter's gradient at its slice of the buffer."""
        for p, view in zip(self.params, self.views, strict=True):
            p.grad = view

    def zero(self) -> None:
        self.buffer.zero_()
        if any(p.grad is not v for p, v in zip(self.params, self.views, strict=True)):
            self.install()  # someone set a gradient to None or replaced it

    def vector(self) -> np.ndarray:
        """The gradients as one float32 vector after a backward: the buffer itself on the host
        (valid until the next `zero`), a copy from an accelerator."""
        for p, view in zip(self.params, self.views, strict=True):
            if p.grad is not view:  # autograd replaced it instead of accumulating in place
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        return self.host if self.host is not None else self.buffer.cpu().numpy()

    def load(self, flat: np.ndarray) -> None:
        """Install `flat` as the gradients (a no-op when it is the buffer's own memory)."""
        flat = np.asarray(flat)
        if self.host is not None and _same_memory(flat, self.host):
            return
        if flat.shape != (self.buffer.numel(),):
            raise ValueError(
                f"gradient vector has shape {np.shape(flat)}, the model needs "
                f"({self.buffer.numel()},)"
            )
        source = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32))
        self.buffer.copy_(source)

    def clip(self, max_norm: float) -> float:
        """Scale the gradients to at most `max_norm` in global L2 norm (as torch's
        `clip_grad_norm_`, in one norm over the whole vector); returns the norm before."""
        norm = float(torch.linalg.vector_norm(self.buffer))
        if norm > max_norm:
            self.buffer.mul_(max_norm / (norm + 1e-6))
        return norm


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes and a.dtype == b.dtype


def _gather(tensors: list[torch.Tensor]) -> np.ndarray:
    out = np.empty(sum(t.numel() for t in tensors), dtype=np.float32)
    offset = 0
    for t in tensors:
        n = t.numel()
        out[offset : offset + n] = t.reshape(-1).cpu().numpy()
        offset += n
    return out


def _split(module: nn.Module, flat: np.ndarray) -> list[torch.Tensor]:
    params = list(module.parameters())
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
