"""Behaviour cloning: the baseline every offline RL result is read against.

BC fits the dataset's actions by maximum likelihood (cross-entropy on the network's action
logits) and ignores rewards. It learns nothing from its own play, so it only runs from a dataset
(`offline.dataset`). Its greedy policy, argmax of the logits, acts through the same `QActor` as
DQN's. If offline DQN does not beat BC on a dataset, the rewards in it taught DQN nothing.

With prioritized replay the per-row cross-entropy serves as the priority, so rows the policy
still gets wrong are drawn more often.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.base import Batch, NetworkAlgorithm


class BehaviourCloning(NetworkAlgorithm):
    """A softmax policy over discrete actions, trained to imitate the dataset."""

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        obs = self.tensor(batch, "observations", torch.float32)
        actions = self.tensor(batch, "actions", torch.int64)
        logits = self.q(obs)
        per_row = F.cross_entropy(logits, actions, reduction="none")
        weighted = per_row
        if weights is not None:
            weighted = per_row * torch.as_tensor(weights, dtype=torch.float32, device=self.device)
        loss = weighted.mean()
        flat_grad = self.backward(loss)
        with torch.no_grad():
            accuracy = (logits.argmax(dim=1) == actions).float().mean().item()
        errors = per_row.detach().cpu().numpy().astype(np.float32)
        return flat_grad, {"loss": loss.item(), "accuracy": accuracy}, errors
