"""Recurrent DQN on sequences: R2D2 (Kapturowski et al. 2019) with RLlib's replay semantics
(`replay_sequence_length`, `replay_burn_in`, `replay_zero_init_states`).

A policy's agents share one recurrent Q-network (`algos.networks.RecurrentQNet`: ReLU layer,
GRU, linear head); the actor is the same network stepped one step at a time
(`algos.actors.RecurrentEpsilonGreedyActor`). Items are sequences of `replay.sequence_length`
steps of one episode (`items.writers.EpisodeWriter`): consecutive sequences share
`replay.sequence_overlap` steps, none crosses an episode's end, a short end is padded with
`filled` marking the real steps, and each step stores the state the actor acted from.

An update, on a batch of sequences drawn by priority:

1. both networks start from the state stored at the sequence's first step (or zeros with
   `replay.zero_init_states`), unroll over the first `replay.burn_in` steps without gradient
   (only to warm the state up), then over the rest along o_t and, one step ahead, o_{t+1};
2. n-step double-Q targets inside the sequence, cut where it ends (bootstrapping from its
   last next observation) or where the episode terminates, under value rescaling:
   y_t = h(sum_{k<m} gamma^k r_{t+k} + gamma^m h^-1(Q'(s_{t+m}, argmax_a Q(s_{t+m}, a))));
3. the loss is the importance-weighted mean of 0.5 delta^2 over the steps trained (filled and
   active, past the burn-in), and each sequence's priority is
   eta max|delta| + (1 - eta) mean|delta|, sent back to its shard with the sequence's id.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcmarl.algos.base import NetworkAlgorithm
from hpcmarl.algos.catalog import keys_of
from hpcmarl.algos.contract import Batch, GroupSpec, PolicySpec
from hpcmarl.algos.networks import RecurrentQNet, policy_network
from hpcmarl.algos.r2d2_config import R2D2Config
from hpcmarl.algos.value_decomposition import (
    next_values,
    recurrent_q_spec,
    sequence_inputs,
    team_columns,
    tensors_of,
    unroll,
)
from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec


def sequence_item(group: GroupSpec, job: Any) -> ItemSpec:
    """Sequences of the group's agents with the actor's recurrent state at every step."""
    hidden = keys_of(job.learner, R2D2Config).rnn_hidden
    columns = team_columns(group, [Column("recurrent_state", "<f4", (hidden,))])
    replay = job.replay
    return ItemSpec(
        "sequence",
        columns,
        len(group.agents),
        replay.sequence_length,
        ReplaySpec("prioritized" if replay.prioritized else "uniform"),
        overlap=replay.sequence_overlap,
    )


def rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def unrescale(y: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(y), exactly (Pohlen et al. 2018, Proposition A.2)."""
    inner = torch.sqrt(1.0 + 4.0 * eps * (y.abs() + 1.0 + eps)) - 1.0
    return torch.sign(y) * ((inner / (2.0 * eps)) ** 2 - 1.0)


class R2D2(NetworkAlgorithm):
    """One policy's recurrent online and target Q-networks."""

    name = "r2d2"

    @classmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        return sequence_item(group, job)

    @classmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        return recurrent_q_spec(group, job, keys_of(job.learner, R2D2Config), agent_ids=0)

    def __init__(self, group: GroupSpec, job: Any, seed: int, device: str = "cpu") -> None:
        self.r = keys_of(job.learner, R2D2Config)
        self.burn_in = job.replay.burn_in
        self.zero_init = job.replay.zero_init_states
        super().__init__(group, job, seed, device)

    def build_networks(self) -> dict[str, nn.Module]:
        (spec,) = self.policy_specs(self.group, self.job).values()
        q = policy_network(spec)
        assert isinstance(q, RecurrentQNet)
        self.q = q
        return {"online": self.q}

    def build_extra_networks(self) -> dict[str, nn.Module]:
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        return {"target": self.q_target}

    def acting(self, policy: str) -> nn.Module:
        return self.q

    def after_step(self) -> None:
        r = self.r
        self.follow_targets([(self.q, self.q_target)], r.target_network_update_freq, r.target_tau)

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """The loss gradient, stats and each sequence's priority."""
        t = tensors_of(batch, self.device)
        inputs = sequence_inputs(t["observations"], t["next_observations"], 0)  # [B, L+1, N, in]
        h0 = None if self.zero_init else t["recurrent_state"][:, 0]
        burn = min(self.burn_in, inputs.shape[1] - 2)
        q_online = self.unroll_after_burn_in(self.q, inputs, h0, burn)  # [B, L+1-burn, N, A]
        with torch.no_grad():
            q_target = self.unroll_after_burn_in(self.q_target, inputs, h0, burn)
            target = self.n_step_targets(t, q_online.detach(), q_target, burn)  # [B, L-burn, N]
        actions = t["actions"][:, burn:]
        q_taken = q_online[:, :-1].gather(-1, actions[..., None]).squeeze(-1)
        trained = self.trained_steps(t, burn)  # [B, L-burn, N]
        td = (q_taken - target) * trained
        per_item = 0.5 * (td**2).sum(dim=(1, 2)) / trained.sum(dim=(1, 2)).clamp(min=1.0)
        if weights is not None:
            per_item = per_item * torch.as_tensor(weights, dtype=torch.float32, device=self.device)
        loss = per_item.mean()
        flat_grad = self.backward(loss)
        abs_td = td.detach().abs()
        steps = trained.sum(dim=(1, 2)).clamp(min=1.0)
        eta = self.r.priority_eta
        peak = abs_td.amax(dim=(1, 2))
        priorities = eta * peak + (1.0 - eta) * abs_td.sum(dim=(1, 2)) / steps
        real = trained.bool()
        stats = {
            "loss": loss.item(),
            "q_mean": q_taken.detach()[real].mean().item() if real.any() else 0.0,
            "target_mean": target[real].mean().item() if real.any() else 0.0,
            "td_abs_mean": float(abs_td.sum().item() / max(1.0, real.sum().item())),
        }
        return flat_grad, stats, priorities.cpu().numpy().astype(np.float32)

    def unroll_after_burn_in(
        self, net: RecurrentQNet, inputs: torch.Tensor, h0: torch.Tensor | None, burn: int
    ) -> torch.Tensor:
        """Q-values along `inputs[:, burn:]`, the state warmed up over the first `burn` steps
        without gradient."""
        if burn:
            with torch.no_grad():
                _, h0 = unroll(net, inputs[:, :burn], h0)
        q, _ = unroll(net, inputs[:, burn:], h0)
        return q

    def trained_steps(self, t: dict[str, torch.Tensor], burn: int) -> torch.Tensor:
        """1 where a step carries loss, [B, L-burn, N]: filled and active, past the burn-in."""
        filled = t["filled"][:, burn:, None]
        return filled * t["active"][:, burn:]

    def n_step_targets(
        self,
        t: dict[str, torch.Tensor],
        q_online: torch.Tensor,
        q_target: torch.Tensor,
        burn: int,
    ) -> torch.Tensor:
        """y_t for the steps after the burn-in, [B, L-burn, N]."""
        gamma, n = self.cfg.gamma, self.r.n_step
        mask = t.get("next_action_masks")
        mask = None if mask is None else mask[:, burn:]
        chooser = q_online[:, 1:] if self.r.double_q else q_target[:, 1:]
        value = next_values(chooser, q_target[:, 1:], mask)
        if self.r.value_rescaling:
            value = unrescale(value)
        # value[:, j] is V(s_{t+1}) of step t = burn + j; fold n rewards on top of it
        rewards = t["rewards"][:, burn:]
        terminated = t["terminations"][:, burn:]
        filled = t["filled"][:, burn:, None].expand_as(rewards)
        steps = rewards.shape[1]
        ret = torch.zeros_like(rewards)
        discount = torch.ones_like(rewards)
        open_ = torch.ones_like(rewards)  # 1 while the window still extends
        boot = torch.zeros_like(rewards)
        for k in range(n):
            later = torch.arange(steps, device=rewards.device) + k
            inside = later < steps
            idx = later.clamp(max=steps - 1)
            r_k = rewards[:, idx] * inside[None, :, None]
            f_k = filled[:, idx] * inside[None, :, None]
            take = open_ * f_k
            ret = ret + take * discount * r_k
            discount = torch.where(take.bool(), discount * gamma, discount)
            boot = torch.where(take.bool(), value[:, idx] * (1.0 - terminated[:, idx]), boot)
            # the window stops after step t+k if that step ended the episode or the sequence
            after = (idx + 1).clamp(max=steps - 1)
            next_filled = filled[:, after] * (later + 1 < steps)[None, :, None]
            open_ = take * (1.0 - terminated[:, idx]) * next_filled
        target = ret + discount * boot
        return rescale(target) if self.r.value_rescaling else target
