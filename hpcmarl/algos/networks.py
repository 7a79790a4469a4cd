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


def mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int) -> nn.Sequential:
    """A ReLU MLP; the last layer is linear because Q-values are unbounded."""
    layers: list[nn.Module] = []
    width = in_dim
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


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


def get_flat_grad(module: nn.Module) -> np.ndarray:
    """All gradients as one fresh float32 vector (zeros where a parameter has no gradient yet),
    the fused buffer that data-parallel learners allreduce."""
    grads = [
        torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in module.parameters()
    ]
    return _gather(module, grads)


def set_flat_grad(module: nn.Module, flat: np.ndarray) -> None:
    """Install gradients from a flat vector (copied) so an optimizer step can use them."""
    for p, chunk in zip(module.parameters(), _split(module, flat), strict=True):
        p.grad = chunk.view_as(p).to(device=p.device, dtype=p.dtype, copy=True)


def _gather(module: nn.Module, tensors: list[torch.Tensor]) -> np.ndarray:
    out = np.empty(num_params(module), dtype=np.float32)
    offset = 0
    for t in tensors:
        n = t.numel()
        out[offset : offset + n] = t.reshape(-1).cpu().numpy()
        offset += n
    return out


def _split(module: nn.Module, flat: np.ndarray) -> list[torch.Tensor]:
    expected = num_params(module)
    flat = np.asarray(flat)
    if flat.ndim != 1 or flat.size != expected:
        raise ValueError(f"flat vector has shape {flat.shape}, the model needs ({expected},)")
    chunks = []
    offset = 0
    for p in module.parameters():
        n = p.numel()
        chunks.append(torch.from_numpy(np.ascontiguousarray(flat[offset : offset + n])))
        offset += n
    return chunks
