"""What every learner algorithm shares: one acting network trained by Adam on flat gradients.

A learner role does not know which algorithm it runs. It asks for a flat gradient on a batch
(`compute_gradients`), averages it across its group, hands it back (`apply_gradients`), pushes
`get_weights()` to the parameter server, and checkpoints `state_dict()`. Subclasses supply the
loss and any networks beyond the acting one (DQN's target network); the clip, the Adam step, the
update counter and the exact-resume state live here once.
"""

from __future__ import annotations

import numpy as np
import torch

from hpcmarl.algos.networks import get_flat, get_flat_grad, mlp, num_params, set_flat, set_flat_grad
from hpcmarl.config.schema import LearnerConfig

Batch = dict[str, np.ndarray]


class NetworkAlgorithm:
    """The acting network `q` (action scores: Q-values or logits), its optimizer and counter.

    Collectors act greedily on `q`'s scores (`QActor`), whatever the algorithm trained them as.
    """

    def __init__(
        self, obs_dim: int, n_actions: int, cfg: LearnerConfig, seed: int, device: str = "cpu"
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.n_actions = n_actions
        with torch.random.fork_rng(devices=[]):  # seed the init without touching global RNG
            torch.manual_seed(seed)
            self.q = mlp(obs_dim, cfg.hidden_sizes, n_actions).to(self.device)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        self.updates = 0
        """Optimizer steps taken."""
        self.grad_norm = 0.0
        """Global gradient norm before clipping, of the last `apply_gradients`."""

    # -- what subclasses define -------------------------------------------------------------
    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """Loss gradient on `batch` as a flat float32 vector, stats, and a per-row error that
        prioritized replay turns into priorities. `weights` are importance-sampling weights
        (None means all ones)."""
        raise NotImplementedError

    def extra_networks(self) -> dict[str, torch.nn.Module]:
        """Networks besides `q` that a checkpoint and a learner group must hold, by name."""
        return {}

    def after_step(self) -> None:
        """Called after every optimizer step (DQN copies its target network here)."""

    # -- shared machinery -------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> np.ndarray:
        """Gradients of `loss` on `q` as one flat vector (what a group allreduces)."""
        self.q.zero_grad(set_to_none=False)
        loss.backward()
        return get_flat_grad(self.q)

    def apply_gradients(self, flat_grad: np.ndarray) -> None:
        """Clip, take one Adam step, count it."""
        set_flat_grad(self.q, flat_grad)
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.q.parameters(), max_norm))
        self.optimizer.step()
        self.updates += 1
        self.after_step()

    def update(
        self, batch: Batch, weights: np.ndarray | None = None
    ) -> tuple[dict[str, float], np.ndarray]:
        """One learner step in one process: the same two halves a data-parallel learner runs."""
        flat_grad, stats, errors = self.compute_gradients(batch, weights)
        self.apply_gradients(flat_grad)
        stats["grad_norm"] = self.grad_norm
        return stats, errors

    def get_weights(self) -> np.ndarray:
        """The acting network as a fresh flat float32 vector (what collectors act with)."""
        return get_flat(self.q)

    def set_weights(self, flat: np.ndarray) -> None:
        """Load the acting network; other networks keep their own schedule."""
        set_flat(self.q, flat)

    def group_weights(self) -> np.ndarray:
        """Every network as one flat vector: what the learners of a group must hold identically."""
        nets = [self.q, *self.extra_networks().values()]
        return np.concatenate([get_flat(net) for net in nets])

    def load_group_weights(self, flat: np.ndarray) -> None:
        offset = 0
        for net in [self.q, *self.extra_networks().values()]:
            n = num_params(net)
            set_flat(net, flat[offset : offset + n])
            offset += n

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume exactly, as plain numpy arrays (HDF5-ready, no pickles)."""
        state = {f"online/{k}": _np(v) for k, v in self.q.state_dict().items()}
        for name, net in self.extra_networks().items():
            state |= {f"{name}/{k}": _np(v) for k, v in net.state_dict().items()}
        names = [name for name, _ in self.q.named_parameters()]
        for index, slots in self.optimizer.state_dict()["state"].items():
            state |= {f"optim/{names[index]}/{k}": _np(v) for k, v in slots.items()}
        state["updates"] = np.array(self.updates, dtype=np.int64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of `state_dict`: after it, updates continue bit for bit."""
        self.q.load_state_dict(_section(state, "online/", self.device))
        for name, net in self.extra_networks().items():
            net.load_state_dict(_section(state, f"{name}/", self.device))
        names = [name for name, _ in self.q.named_parameters()]
        optim_state = self.optimizer.state_dict()
        optim_state["state"] = {
            i: slots for i, name in enumerate(names) if (slots := _section(state, f"optim/{name}/"))
        }
        self.optimizer.load_state_dict(optim_state)
        self.updates = int(state["updates"])

    def tensor(self, batch: Batch, key: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(batch[key]), dtype=dtype, device=self.device)


def _np(value: torch.Tensor | float | int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    return np.asarray(value)


def _section(
    state: dict[str, np.ndarray], prefix: str, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """Entries under `prefix`, prefix stripped, as tensors."""
    return {
        k[len(prefix) :]: torch.as_tensor(np.array(v), device=device)
        for k, v in state.items()
        if k.startswith(prefix)
    }
