"""Behaviour cloning: the baseline every offline RL result is read against.

BC fits the dataset's actions by maximum likelihood (cross-entropy on the network's action
logits) and ignores rewards. It learns nothing from its own play, so it only runs from a dataset
(`offline.dataset`). Its greedy policy, argmax of the logits, acts through the same epsilon-greedy
actor as DQN's, with epsilon zero. If offline DQN does not beat BC on a dataset, the rewards in
it taught DQN nothing.

With prioritized replay the per-row cross-entropy serves as the priority, so rows the policy
still gets wrong are drawn more often.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.base import NetworkAlgorithm
from hpcmarl.algos.contract import Batch, GroupSpec, PolicySpec
from hpcmarl.algos.dqn import q_policy_spec, transition_item
from hpcmarl.algos.networks import policy_network
from hpcmarl.items.spec import ItemSpec


class BehaviourCloning(NetworkAlgorithm):
    """A softmax policy over discrete actions, trained to imitate the dataset."""

    name = "bc"

    @classmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        return transition_item(group, job)

    @classmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        return q_policy_spec(group, job, {"eps_start": 0.0, "eps_end": 0.0, "eps_decay": 1})

    def build_networks(self) -> dict[str, torch.nn.Module]:
        (spec,) = self.policy_specs(self.group, self.job).values()
        self.q = policy_network(spec)
        return {"online": self.q}

    def acting(self, policy: str) -> torch.nn.Module:
        return self.q

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
