"""Policy networks built from their specs, and the flat-weight view that moves them between
ranks.

`policy_network(spec)` is the one place a `PolicySpec` becomes a network: the learner's acting
network, every collector's actor, evaluations, PSRO matchups and checkpoint readers all build it
there, so a torso named in the spec (`algos.torsos`) is honoured everywhere alike.

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

from hpcmarl.algos.contract import PolicySpec, TorsoSpec
from hpcmarl.algos.torsos import TorsoHead, make_torso

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


def policy_network(spec: PolicySpec) -> nn.Module:
    """The network `spec` describes, with freshly initialised weights (drawn from torch's
    global generator: the caller seeds or forks it): a `RecurrentQNet` for a recurrent actor,
    else its torso and a head of one output per action."""
    if spec.recurrent:
        torso = None if spec.torso.name == "mlp" else spec.torso
        return RecurrentQNet(spec.in_dim, spec.recurrent, spec.n_actions, torso, spec.agent_ids)
    net = feedforward(
        spec.in_dim, spec.n_actions, spec.hidden_sizes, spec.activation, spec.torso, spec.agent_ids
    )
    return GaussianPolicy(net, spec.n_actions) if spec.actor == "gaussian" else net


class GaussianPolicy(nn.Module):
    """A diagonal Gaussian policy for continuous actions: the network gives the mean, and one
    log standard deviation per action dimension is a parameter of its own, independent of the
    observation (as in the PPO papers and CleanRL's `ppo_continuous_action.py`: a state-
    dependent one is less stable on small budgets). `forward` returns the mean, which is also
    the greedy action; the flat vector holds `log_std` (the module's own parameter comes
    first in `named_parameters`) then `mean.*`."""

    def __init__(self, mean: nn.Module, action_dim: int) -> None:
        super().__init__()
        self.mean = mean
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean(x)  # type: ignore[no-any-return]


def feedforward(
    in_dim: int,
    out_dim: int,
    hidden_sizes: Sequence[int],
    activation: str,
    torso: TorsoSpec | None = None,
    agent_ids: int = 0,
) -> nn.Module:
    """A feed-forward network from rows of `in_dim` values (the last `agent_ids` of them a
    one-hot agent index) to `out_dim` outputs: the `mlp` of `hidden_sizes`, or `torso` and a
    linear head."""
    if torso is None or torso.name == "mlp":
        return mlp(in_dim, hidden_sizes, out_dim, activation)
    return TorsoHead(make_torso(torso, agent_ids), out_dim)


def policy_layout(spec: PolicySpec) -> list[tuple[str, tuple[int, ...]]]:
    """`param_spec` of `policy_network(spec)` (whatever `spec.params` says), without drawing
    from torch's global generator."""
    with torch.random.fork_rng(devices=[]):
        return param_spec(policy_network(spec))


def orthogonal_init(net: nn.Module, hidden_gain: float, out_gain: float) -> nn.Module:
    """Orthogonal weights and zero biases (the PPO implementations' initialisation); a small
    `out_gain` starts a policy near uniform. A torso's own layers keep their initialisation:
    only its head is set. A Gaussian policy's mean network is set; its log-std stays 0."""
    if isinstance(net, GaussianPolicy):
        orthogonal_init(net.mean, hidden_gain, out_gain)
        return net
    modules = [net.head] if isinstance(net, TorsoHead) else list(net.children())
    linears = [m for m in modules if isinstance(m, nn.Linear)]
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
    `fc1.*`, `rnn.*_l0`, `fc2.*`; with a `torso` (`algos.torsos`) in place of the ReLU layer,
    `torso.*`, `rnn.*_l0`, `fc2.*`."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        torso: TorsoSpec | None = None,
        agent_ids: int = 0,
    ) -> None:
        super().__init__()
        self.hidden = hidden
        if torso is None:
            self.fc1 = nn.Linear(in_dim, hidden)
            width = hidden
        else:
            self.torso = make_torso(torso, agent_ids)
            width = self.torso.width
        self.rnn = nn.GRU(width, hidden, batch_first=True)
        self.fc2 = nn.Linear(hidden, out_dim)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The GRU's inputs from observation rows `x` [..., in]."""
        if hasattr(self, "fc1"):
            return torch.relu(self.fc1(x))
        return self.torso(x)  # type: ignore[no-any-return]

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [B, T, out] of sequences `x` [B, T, in] from states `h0` [B, hidden] (zeros
        when None), and the final states [B, hidden]."""
        z = self.encode(x)
        out, h = self.rnn(z, None if h0 is None else h0[None].contiguous())
        return self.fc2(out), h[0]

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: Q-values [B, out] of inputs `x` [B, in] in states `h` [B, hidden]."""
        z = self.encode(x)
        w_ih, w_hh, b_ih, b_hh = self.rnn.all_weights[0]  # the one layer's, in nn.GRU's order
        h = torch.gru_cell(z, h, w_ih, w_hh, b_ih, b_hh)
        return self.fc2(h), h


def recurrent_layout(in_dim: int, hidden: int, out_dim: int) -> list[tuple[str, tuple[int, ...]]]:
    """`param_spec` of the `RecurrentQNet` these arguments build, without drawing from torch's
    global generator."""
    with torch.random.fork_rng(devices=[]):
        return param_spec(RecurrentQNet(in_dim, hidden, out_dim))
