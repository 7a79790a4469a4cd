"""Deep Q-learning with RLlib's semantics and CleanRL's layout: the math reads top to bottom.

Semantics (RLlib DQN): double-Q targets, Huber loss weighted by prioritized-replay importance
weights, a hard target-network copy every `target_network_update_freq` updates, and the absolute
TD errors returned per row so replay can refresh priorities.

The update is split into `compute_gradients` and `apply_gradients` because data-parallel learners
average one flat gradient across ranks between the two; `update` is both in one process. Nothing
here imports MPI.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.networks import get_flat, get_flat_grad, mlp, set_flat, set_flat_grad
from hpcmarl.config.schema import LearnerConfig

Batch = dict[str, np.ndarray]


class DQN:
    """One policy's online and target Q-networks, its optimizer and its update counter."""

    def __init__(
        self, obs_dim: int, n_actions: int, cfg: LearnerConfig, seed: int, device: str = "cpu"
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.n_actions = n_actions
        with torch.random.fork_rng(devices=[]):  # seed the init without touching global RNG
            torch.manual_seed(seed)
            self.q = mlp(obs_dim, cfg.hidden_sizes, n_actions).to(self.device)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        self.updates = 0
        """Optimizer steps taken; drives the target-network schedule."""
        self.grad_norm = 0.0
        """Global gradient norm before clipping, of the last `apply_gradients`."""

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """Loss gradient on `batch` as a flat float32 vector, plus stats and per-row TD errors.

        `weights` are importance-sampling weights from prioritized replay (None means all ones).
        """
        obs, actions, rewards, next_obs, terminated = self._tensors(batch)
        q_taken = self.q(obs).gather(1, actions[:, None]).squeeze(1)
        with torch.no_grad():
            target = rewards + self.cfg.gamma * (1.0 - terminated) * self._next_value(next_obs)
        td = q_taken - target  # truncation does not cut the bootstrap; termination does
        per_row = F.huber_loss(q_taken, target, reduction="none", delta=self.cfg.huber_delta)
        if weights is not None:
            per_row = per_row * torch.as_tensor(weights, dtype=torch.float32, device=self.device)
        loss = per_row.mean()
        self.q.zero_grad(set_to_none=False)
        loss.backward()
        td_np = td.detach().cpu().numpy().astype(np.float32)
        stats = {
            "loss": loss.item(),
            "q_mean": q_taken.detach().mean().item(),
            "target_mean": target.mean().item(),
            "td_abs_mean": float(np.abs(td_np).mean()),
        }
        return get_flat_grad(self.q), stats, td_np

    def apply_gradients(self, flat_grad: np.ndarray) -> None:
        """Clip, take one Adam step, and copy online into target every N-th update."""
        set_flat_grad(self.q, flat_grad)
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.q.parameters(), max_norm))
        self.optimizer.step()
        self.updates += 1
        if self.updates % self.cfg.target_network_update_freq == 0:
            self.q_target.load_state_dict(self.q.state_dict())

    def update(
        self, batch: Batch, weights: np.ndarray | None = None
    ) -> tuple[dict[str, float], np.ndarray]:
        """One learner step in one process: the same two halves a data-parallel learner runs."""
        flat_grad, stats, td_errors = self.compute_gradients(batch, weights)
        self.apply_gradients(flat_grad)
        stats["grad_norm"] = self.grad_norm
        return stats, td_errors

    def get_weights(self) -> np.ndarray:
        """Online network as a fresh flat float32 vector (what collectors act with)."""
        return get_flat(self.q)

    def set_weights(self, flat: np.ndarray) -> None:
        """Load the online network; the target keeps its own schedule."""
        set_flat(self.q, flat)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume exactly, as plain numpy arrays (HDF5-ready, no pickles)."""
        state = {f"online/{k}": _np(v) for k, v in self.q.state_dict().items()}
        state |= {f"target/{k}": _np(v) for k, v in self.q_target.state_dict().items()}
        names = [name for name, _ in self.q.named_parameters()]
        for index, slots in self.optimizer.state_dict()["state"].items():
            state |= {f"optim/{names[index]}/{k}": _np(v) for k, v in slots.items()}
        state["updates"] = np.array(self.updates, dtype=np.int64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of `state_dict`: after it, updates continue bit for bit."""
        self.q.load_state_dict(_section(state, "online/", self.device))
        self.q_target.load_state_dict(_section(state, "target/", self.device))
        names = [name for name, _ in self.q.named_parameters()]
        optim_state = self.optimizer.state_dict()
        optim_state["state"] = {
            i: slots for i, name in enumerate(names) if (slots := _section(state, f"optim/{name}/"))
        }
        self.optimizer.load_state_dict(optim_state)
        self.updates = int(state["updates"])

    def _tensors(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        def as_t(key: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.asarray(batch[key]), dtype=dtype, device=self.device)

        return (
            as_t("observations", torch.float32),
            as_t("actions", torch.int64),
            as_t("rewards", torch.float32),
            as_t("next_observations", torch.float32),
            as_t("terminations", torch.float32),
        )

    def _next_value(self, next_obs: torch.Tensor) -> torch.Tensor:
        """Value of s': double Q scores the online argmax with the target net."""
        q_next_target = self.q_target(next_obs)
        if not self.cfg.double_q:
            return q_next_target.max(dim=1).values
        best = self.q(next_obs).argmax(dim=1, keepdim=True)
        return q_next_target.gather(1, best).squeeze(1)


class QActor:
    """What a collector holds per policy: the Q-network without optimizer, for batched acting.

    The forward pass calls `F.linear` on the layers' own tensors instead of `nn.Sequential`:
    the same arithmetic at about half the per-call overhead, which dominates for small batches.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: list[int]) -> None:
        self.n_actions = n_actions
        self.q = mlp(obs_dim, hidden_sizes, n_actions).requires_grad_(False)
        self._layers = [(m.weight, m.bias) for m in self.q if isinstance(m, torch.nn.Linear)]

    def set_weights(self, flat: np.ndarray) -> None:
        """Load weights pulled from the parameter server (in place: `_layers` stays valid)."""
        set_flat(self.q, flat)

    def act(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy int64 actions for a batch [B, obs_dim]; the forward pass is skipped when
        every row explores."""
        size = obs.shape[0]
        if epsilon <= 0:
            return self.greedy(obs)
        explore = rng.random(size) < epsilon
        n_explore = int(np.count_nonzero(explore))
        if n_explore == size:
            return np.asarray(rng.integers(self.n_actions, size=size, dtype=np.int64))
        actions = self.greedy(obs)
        if n_explore:
            actions[explore] = rng.integers(self.n_actions, size=n_explore, dtype=np.int64)
        return actions

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """argmax_a Q(obs, a) as int64 [B]."""
        with torch.inference_mode():
            h = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))
            for weight, bias in self._layers[:-1]:
                h = F.linear(h, weight, bias).relu_()
            return F.linear(h, *self._layers[-1]).argmax(dim=1).numpy()


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
