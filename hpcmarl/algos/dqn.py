"""Deep Q-learning with RLlib's semantics and CleanRL's layout: the math reads top to bottom.

Semantics (RLlib DQN): double-Q targets, Huber loss weighted by prioritized-replay importance
weights, a hard target-network copy every `target_network_update_freq` updates, and the absolute
TD errors returned per row so replay can refresh priorities.

The update is split into `compute_gradients` and `apply_gradients` (in `NetworkAlgorithm`)
because data-parallel learners average one flat gradient across ranks between the two; `update`
is both in one process. Nothing here imports MPI.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.base import Batch, NetworkAlgorithm
from hpcmarl.algos.networks import mlp, set_flat
from hpcmarl.config.schema import LearnerConfig


class DQN(NetworkAlgorithm):
    """One policy's online and target Q-networks, its optimizer and its update counter."""

    def __init__(
        self, obs_dim: int, n_actions: int, cfg: LearnerConfig, seed: int, device: str = "cpu"
    ) -> None:
        super().__init__(obs_dim, n_actions, cfg, seed, device)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)

    def extra_networks(self) -> dict[str, torch.nn.Module]:
        return {"target": self.q_target}

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """Loss gradient on `batch` as a flat float32 vector, plus stats and per-row TD errors.

        `weights` are importance-sampling weights from prioritized replay (None means all ones).
        """
        obs = self.tensor(batch, "observations", torch.float32)
        actions = self.tensor(batch, "actions", torch.int64)
        rewards = self.tensor(batch, "rewards", torch.float32)
        next_obs = self.tensor(batch, "next_observations", torch.float32)
        terminated = self.tensor(batch, "terminations", torch.float32)
        q_taken = self.q(obs).gather(1, actions[:, None]).squeeze(1)
        with torch.no_grad():
            target = rewards + self.cfg.gamma * (1.0 - terminated) * self._next_value(next_obs)
        td = q_taken - target  # truncation does not cut the bootstrap; termination does
        per_row = F.huber_loss(q_taken, target, reduction="none", delta=self.cfg.huber_delta)
        if weights is not None:
            per_row = per_row * torch.as_tensor(weights, dtype=torch.float32, device=self.device)
        loss = per_row.mean()
        flat_grad = self.backward(loss)
        td_np = td.detach().cpu().numpy().astype(np.float32)
        stats = {
            "loss": loss.item(),
            "q_mean": q_taken.detach().mean().item(),
            "target_mean": target.mean().item(),
            "td_abs_mean": float(np.abs(td_np).mean()),
        }
        return flat_grad, stats, td_np

    def after_step(self) -> None:
        """The hard target update: copy online into target every N-th update."""
        if self.updates % self.cfg.target_network_update_freq == 0:
            self.q_target.load_state_dict(self.q.state_dict())

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
