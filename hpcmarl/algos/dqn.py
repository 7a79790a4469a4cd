"""Deep Q-learning with RLlib's semantics and CleanRL's layout: the math reads top to bottom.

Semantics (RLlib DQN): double-Q targets, Huber loss weighted by prioritized-replay importance
weights, a hard target-network copy every `target_network_update_freq` updates, and the absolute
TD errors returned per row so replay can refresh priorities. One difference: the importance
weights are divided by the largest weight of the batch (Schaul et al. 2016, Algorithm 1), where
RLlib divides by the weight of the least likely item in the whole buffer; ours are never
smaller than RLlib's, so a batch of likely items takes larger steps. Exploration is the actor's: an
epsilon that decays with the job's global env-step count (`algos.actors.EpsilonGreedyActor`).
Where the env has legal-action masks, the value of s' is a max over its legal actions only
(double Q: the online net's masked argmax, scored by the target net).

A DQN group trains one policy on transition items: rows of every agent mapped to it. Its
update is the contract's one-yield generator (in `NetworkAlgorithm`): the gradient is averaged
across the group's learners between `compute_gradients` and `apply_gradients`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.base import NetworkAlgorithm
from hpcmarl.algos.catalog import keys_of
from hpcmarl.algos.contract import Batch, GroupSpec, PolicySpec
from hpcmarl.algos.dqn_config import DQNConfig
from hpcmarl.algos.masking import masked_argmax, masked_max
from hpcmarl.algos.networks import policy_layout, policy_network
from hpcmarl.algos.torsos import torso_spec
from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec
from hpcmarl.replay.columns import mask_columns, transition_columns


def transition_item(group: GroupSpec, job: Any, n_step: int = 1) -> ItemSpec:
    """One agent's step, as DQN and BC learn from it (DESIGN.md §3 column names), with the
    legal-action masks when the env has them; or, for n > 1, its n-step transition."""
    obs_dim, n_actions = group.dims(group.policies[0])
    columns = transition_columns(obs_dim, group.obs_dtype, n_actions if group.continuous else None)
    if group.action_masks:
        columns += mask_columns(n_actions)
    selector = "prioritized" if job.replay.prioritized else "uniform"
    if n_step > 1:
        columns += (Column("discounts", "<f4"),)
    replay = ReplaySpec(selector)
    return ItemSpec("transition", columns, replay=replay, n_step=n_step, gamma=job.learner.gamma)


def q_policy_spec(group: GroupSpec, job: Any, explore: dict[str, float]) -> dict[str, PolicySpec]:
    """The published Q-network of the group's one policy, acting epsilon-greedily."""
    policy = group.policies[0]
    obs_dim, n_actions = group.dims(policy)
    spec = PolicySpec(
        key=group.keys[policy],
        actor="epsilon_greedy",
        obs_dim=obs_dim,
        n_actions=n_actions,
        hidden_sizes=tuple(job.learner.hidden_sizes),
        activation="relu",
        explore=tuple(sorted(explore.items())),
        torso=torso_spec(job, group, policy),
    )
    return {spec.key: dataclasses.replace(spec, params=tuple(policy_layout(spec)))}


class DQN(NetworkAlgorithm):
    """One policy's online and target Q-networks, its optimizer and its update counter."""

    name = "dqn"

    @classmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        return transition_item(group, job, keys_of(job.learner, DQNConfig).n_step)

    @classmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        d = keys_of(job.learner, DQNConfig)
        explore = {"eps_start": d.eps_start, "eps_end": d.eps_end, "eps_decay": d.eps_decay_steps}
        return q_policy_spec(group, job, explore)

    @functools.cached_property
    def dqn_keys(self) -> DQNConfig:
        """The job's DQN section, looked up once (`keys_of` scans the sections; every update
        reads it)."""
        return keys_of(self.cfg, DQNConfig)

    def build_networks(self) -> dict[str, torch.nn.Module]:
        (spec,) = self.policy_specs(self.group, self.job).values()
        self.q = policy_network(spec)
        return {"online": self.q}

    def build_extra_networks(self) -> dict[str, torch.nn.Module]:
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        return {"target": self.q_target}

    def acting(self, policy: str) -> torch.nn.Module:
        return self.q

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """Loss gradient on `batch` as a flat float32 vector, plus stats and per-row TD errors.

        `weights` are importance-sampling weights from prioritized replay (None means all ones).
        """
        d = self.dqn_keys
        obs = self.tensor(batch, "observations", torch.float32)
        actions = self.tensor(batch, "actions", torch.int64)
        rewards = self.tensor(batch, "rewards", torch.float32)
        next_obs = self.tensor(batch, "next_observations", torch.float32)
        terminated = self.tensor(batch, "terminations", torch.float32)
        next_mask = None
        if "next_action_masks" in batch:
            next_mask = self.tensor(batch, "next_action_masks", torch.bool)
        discount = self.cfg.gamma  # an n-step transition carries its own gamma^m
        if "discounts" in batch:
            discount = self.tensor(batch, "discounts", torch.float32)
        q_taken = self.q(obs).gather(1, actions[:, None]).squeeze(1)
        with torch.no_grad():
            next_value = self._next_value(next_obs, next_mask)
            target = rewards + discount * (1.0 - terminated) * next_value
        td = q_taken - target  # truncation does not cut the bootstrap; termination does
        per_row = F.huber_loss(q_taken, target, reduction="none", delta=d.huber_delta)
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
        d = self.dqn_keys
        self.follow_targets([(self.q, self.q_target)], d.target_network_update_freq, d.target_tau)

    def _next_value(self, next_obs: torch.Tensor, next_mask: torch.Tensor | None) -> torch.Tensor:
        """Value of s' over its legal actions: double Q scores the online argmax with the
        target net; a row with no legal action is worth 0."""
        q_next_target = self.q_target(next_obs)
        if not self.dqn_keys.double_q:
            return masked_max(q_next_target, next_mask)
        best = masked_argmax(self.q(next_obs), next_mask)
        value = q_next_target.gather(1, best).squeeze(1)
        return value if next_mask is None else torch.where(next_mask.any(dim=1), value, 0.0)
