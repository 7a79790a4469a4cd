"""An algorithm from outside the package (`learner.algo: tests.unit.plugin_algos:Reinforce`),
written as a user would: its keys, their checks, its items and its update, with no edit of
hpcmarl. REINFORCE with a learned baseline on on-policy fragments: returns to go within each
fragment, bootstrapped from the baseline where a fragment stops before its episode does.

Its networks come from `networks.policy_network`, so `learner.model.torso` (a user's torso
included) shapes them as it does the built-in algorithms'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.base import NetworkAlgorithm
from hpcmarl.algos.catalog import keys_of
from hpcmarl.algos.contract import Batch, GroupSpec, PolicySpec
from hpcmarl.algos.networks import policy_layout, policy_network
from hpcmarl.algos.returns import gae
from hpcmarl.algos.torsos import torso_spec
from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec, fragment_columns
from hpcmarl.limits import at_least, one_of, within


@dataclass
class ReinforceConfig:
    """REINFORCE's own keys (`learner.reinforce`)."""

    batch_fragments: int = 8
    """Fragments per update, over all learners of the group."""
    max_policy_lag: int = 1
    """Versions a fragment may be older than the policy it trains."""
    baseline_coef: float = 0.5
    """Weight of the baseline's squared error in the loss."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    gae_lambda: float = 1.0
    """1 is REINFORCE's Monte Carlo return; below 1 it becomes an actor-critic."""


class Reinforce(NetworkAlgorithm):
    """REINFORCE with a learned baseline (on-policy fragments)."""

    name = "reinforce"
    config = ReinforceConfig
    section = "reinforce"
    on_policy = True
    items = "fragment"
    rules = {
        "batch_fragments": at_least(1),
        "max_policy_lag": at_least(0),
        "baseline_coef": at_least(0),
        "entropy_coef": at_least(0),
        "gae_lambda": within(0, 1),
    }

    @classmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        obs_dim, _ = group.dims(group.policies[0])
        columns = (*fragment_columns(obs_dim), Column("next_observations", "<f4", (obs_dim,)))
        lag = keys_of(job.learner, ReinforceConfig).max_policy_lag
        replay = ReplaySpec("fifo", max_policy_lag=lag)
        length = job.collector.fragment_length
        return ItemSpec("fragment", columns, len(group.agents), length, replay)

    @classmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        (policy,) = group.policies
        key, (obs_dim, n_actions) = group.keys[policy], group.dims(policy)
        hidden = tuple(job.learner.hidden_sizes)
        spec = PolicySpec(key, "categorical", obs_dim, n_actions, hidden, "tanh")
        spec = dataclasses.replace(spec, torso=torso_spec(job, group, policy))
        return {key: dataclasses.replace(spec, params=tuple(policy_layout(spec)))}

    def __init__(self, group: GroupSpec, job: Any, seed: int, device: str = "cpu") -> None:
        self.keys = keys_of(job.learner, ReinforceConfig)  # learner.reinforce, as built-ins read
        super().__init__(group, job, seed, device)

    def build_networks(self) -> dict[str, torch.nn.Module]:
        (spec,) = self.policy_specs(self.group, self.job).values()
        baseline = dataclasses.replace(spec, n_actions=1)  # the same torso, one output
        return {"policy": policy_network(spec), "baseline": policy_network(baseline)}

    def acting(self, policy: str) -> torch.nn.Module:
        return self.networks["policy"]

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        shape = batch["actions"].shape  # [items, T, agents]
        obs = self.rows(batch, "observations")
        with torch.no_grad():
            after = self.networks["baseline"](self.rows(batch, "next_observations"))
        values = self.networks["baseline"](obs).reshape(shape)
        ended = batch["terminations"] | batch["truncations"]
        advantages = gae(
            batch["rewards"].astype(np.float32),
            values.detach().cpu().numpy(),
            after.reshape(shape).cpu().numpy(),
            batch["terminations"],
            ended,
            self.cfg.gamma,
            self.keys.gae_lambda,
            batch["active"],
        )
        active = self.tensor(batch, "active", torch.bool).reshape(-1)
        adv = torch.as_tensor(advantages, device=self.device).reshape(-1)[active]
        values = values.reshape(-1)[active]
        log_softmax = F.log_softmax(self.networks["policy"](obs), dim=-1)[active]
        actions = self.tensor(batch, "actions", torch.int64).reshape(-1)[active]
        taken = log_softmax.gather(-1, actions[:, None]).squeeze(-1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1).mean()
        policy_loss = -(taken * adv).mean()
        baseline_loss = F.mse_loss(values, adv + values.detach())
        loss = policy_loss + self.keys.baseline_coef * baseline_loss
        loss = loss - self.keys.entropy_coef * entropy
        stats = {
            "policy_loss": policy_loss.item(),
            "baseline_loss": baseline_loss.item(),
            "entropy": entropy.item(),
        }
        return self.backward(loss), stats, np.zeros(len(batch["actions"]), np.float32)

    def rows(self, batch: Batch, key: str) -> torch.Tensor:
        """[items, T, agents, width] as rows [items * T * agents, width]."""
        array = np.asarray(batch[key], dtype=np.float32)
        return torch.as_tensor(array.reshape(-1, array.shape[-1]), device=self.device)


@dataclass
class BrittleConfig(ReinforceConfig):
    """REINFORCE's keys and the update at which the brittle variant breaks."""

    fail_at_update: int = 3
    """The update (1-based) that breaks."""
    failure: str = "raise"
    """How it breaks: raise (a bug: ValueError) or nan (its loss becomes NaN)."""


class BrittleReinforce(Reinforce):
    """REINFORCE that breaks at one update, as a user's plugin with a bug or a diverging loss
    would: the learner must report the failed task (cause, group, update count) to the
    commander before the job ends (`tests/faults/test_learner_failures.py`)."""

    name = "brittle_reinforce"
    config = BrittleConfig
    rules = {
        **Reinforce.rules,
        "fail_at_update": at_least(1),
        "failure": one_of("raise", "nan"),
    }

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        grads, stats, priorities = super().compute_gradients(batch, weights)
        if self.updates + 1 == self.keys.fail_at_update:
            if self.keys.failure == "raise":
                raise ValueError(f"brittle_reinforce broke in update {self.updates + 1}")
            stats["policy_loss"] = float("nan")
        return grads, stats, priorities
