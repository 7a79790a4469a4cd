"""PPO for teams of agents: MAPPO (a centralised critic on the global state) and IPPO (each
agent's critic on its own observation), after Yu et al. (2022) and CleanRL's `ppo.py`.

A PPO group trains one actor per policy (agents mapped to one policy share it) and one critic,
on fragments: T steps of one env copy with every agent of the group, `[T, agents, ...]`. The
central critic sees the global state with the agent's one-hot index, one pass per agent, or
with `critic_heads` one pass per env step ending in a value head per agent: the same inputs at
1/agents of the passes. An update, on one batch of fragments:

1. values V(s_t) and V(s'_t) from the critic, in return units (denormalised);
2. advantages by GAE(lambda) and targets R_t = A_t + V(s_t) (`algos.returns`);
3. the value normaliser learns the targets' moments, averaged over the group's learners
   (the first vector the update yields), so every member normalises alike;
4. `epochs` passes, each in `minibatches` shuffled minibatches of the agents' active steps:
   clipped surrogate  L = -min(r A, clip(r, 1-eps, 1+eps) A),  r = pi(a|o) / pi_old(a|o),
   value loss on normalised targets with the change of the value clipped, minus an entropy
   bonus; one averaged gradient and one Adam step per minibatch.

Steps where an agent is not active (it finished before its episode did, or it is another
player's turn) carry no loss, and its advantages run over its own decisions (`algos.returns`).
Where the env has legal-action masks, fragments carry them and the loss scores the same masked
policy the actor sampled from. The actor the collectors run is `algos.actors.CategoricalActor`;
the critic stays here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.base import NetworkAlgorithm, on_device
from hpcmarl.algos.catalog import keys_of
from hpcmarl.algos.contract import (
    ActionBox,
    Batch,
    GroupSpec,
    PolicySpec,
    TorsoSpec,
    UpdateResult,
    UpdateSteps,
)
from hpcmarl.algos.masking import entropy_of, masked_log_softmax
from hpcmarl.algos.networks import feedforward, orthogonal_init, policy_layout, policy_network
from hpcmarl.algos.ppo_config import PPOConfig
from hpcmarl.algos.returns import ValueNorm, gae
from hpcmarl.algos.torsos import torso_spec
from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec, fragment_columns
from hpcmarl.rng import rng_from_words, rng_to_words

HIDDEN_GAIN = float(np.sqrt(2.0))
POLICY_GAIN = 0.01
"""A small last layer starts every policy near uniform."""


def fragment_item(group: GroupSpec, job: Any) -> ItemSpec:
    """A fragment of the group's agents; the critic's inputs decide what else it holds."""
    ppo = keys_of(job.learner, PPOConfig)
    obs_dim, n_actions = group.dims(group.policies[0])
    columns = fragment_columns(obs_dim, group.obs_dtype, n_actions if group.continuous else None)
    if ppo.critic == "central":
        columns += [
            Column("state", "<f4", (group.state_dim,), per="group"),
            Column("next_state", "<f4", (group.state_dim,), per="group"),
        ]
    else:
        columns.append(Column("next_observations", group.obs_dtype, (obs_dim,)))
    if group.action_masks:
        columns.append(Column("action_masks", "|b1", (n_actions,)))
    replay = ReplaySpec("fifo", max_policy_lag=ppo.max_policy_lag)
    return ItemSpec(
        "fragment", tuple(columns), len(group.agents), job.collector.fragment_length, replay
    )


class PPO(NetworkAlgorithm):
    """Actors per policy and one critic for a group, with clipped-surrogate updates."""

    name = "ppo"

    @classmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        return fragment_item(group, job)

    @classmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        specs = {}
        ppo = keys_of(job.learner, PPOConfig)
        hidden, activation = tuple(job.learner.hidden_sizes), ppo.activation
        for policy in group.policies:
            obs_dim, n_actions = group.dims(policy)
            ids = len(group.agents_of(policy)) if ppo.actor_agent_id else 0
            key = group.keys[policy]
            torso = torso_spec(job, group, policy)
            actor, box = "categorical", cast(ActionBox, ())
            if group.continuous:
                actor, box = "gaussian", group.action_boxes[group.agents_of(policy)[0]]
            spec = PolicySpec(key, actor, obs_dim, n_actions, hidden, activation, (), agent_ids=ids)
            spec = dataclasses.replace(spec, torso=torso, action_box=box)
            specs[key] = dataclasses.replace(spec, params=tuple(policy_layout(spec)))
        return specs

    def __init__(self, group: GroupSpec, job: Any, seed: int, device: str = "cpu") -> None:
        self.ppo = keys_of(job.learner, PPOConfig)
        super().__init__(group, job, seed, device)
        self.value_norm = ValueNorm()
        self.rng = np.random.default_rng(seed)
        """Shuffles minibatches; checkpointed, so a resumed update draws the same ones."""
        self.agent_policy = [group.policy_of[a] for a in group.agents]
        self.index_in_policy = np.array(
            [group.agents_of(group.policy_of[a]).index(a) for a in group.agents], np.int64
        )
        """Each group agent's place among its policy's agents: the actor's agent index."""

    # -- networks ---------------------------------------------------------------------------
    def build_networks(self) -> dict[str, torch.nn.Module]:
        hidden, act = self.cfg.hidden_sizes, self.ppo.activation
        nets: dict[str, torch.nn.Module] = {}
        specs = self.policy_specs(self.group, self.job)
        for policy in self.group.policies:
            net = policy_network(specs[self.group.keys[policy]])
            nets[f"actor.{policy}"] = orthogonal_init(net, HIDDEN_GAIN, POLICY_GAIN)
        outputs = len(self.group.agents) if self.heads else 1
        ids = len(self.group.agents) if self.ppo.critic_agent_id else 0
        torso = TorsoSpec()  # a central critic reads the global state, which no torso is for
        if self.ppo.critic == "local":
            torso = torso_spec(self.job, self.group, self.group.policies[0])
        critic = feedforward(self.critic_width(), outputs, hidden, act, torso, ids)
        nets["critic"] = orthogonal_init(critic, HIDDEN_GAIN, 1.0)
        return nets

    @property
    def heads(self) -> bool:
        """One critic pass per env step, a value head per agent (`critic_heads`)."""
        return self.ppo.critic == "central" and self.ppo.critic_heads

    def critic_width(self) -> int:
        ppo, g = self.ppo, self.group
        if self.heads:
            return g.state_dim
        width = g.state_dim if ppo.critic == "central" else g.dims(g.policies[0])[0]
        return width + (len(g.agents) if ppo.critic_agent_id else 0)

    def acting(self, policy: str) -> torch.nn.Module:
        return self.networks[f"actor.{policy}"]

    # -- the update -------------------------------------------------------------------------
    def update(self, batch: Batch, weights: np.ndarray | None = None) -> UpdateSteps:
        data = self.prepare(batch)
        if self.ppo.value_norm:
            self.value_norm.update_from((yield self.value_norm.moments(data["returns"])))
        data["targets"] = self.value_norm.normalize(data["returns"])
        data["old_values"] = self.value_norm.normalize(data["values"])
        stats: list[dict[str, float]] = []
        count = len(data["returns"])
        for _ in range(self.ppo.epochs):
            for rows in self.minibatch_rows(data):
                flat_grad, row = self.minibatch_gradient(data, rows)
                self.apply_gradients((yield flat_grad))
                stats.append(row | {"grad_norm": self.grad_norm})
        self.updates += 1
        summary = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
        summary |= {
            "return_mean": float(data["returns"].mean()) if count else 0.0,
            "explained_variance": explained_variance(data["values"], data["returns"]),
        }
        return UpdateResult(summary)

    def minibatch_rows(self, data: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One epoch's minibatches of active rows, shuffled: of single rows, or, with critic
        heads, of whole env steps (every active agent of a step in the same minibatch, so the
        critic runs once per step)."""
        if not self.heads:
            order = self.rng.permutation(len(data["returns"]))
            return np.array_split(order, self.ppo.minibatches)
        steps = np.array_split(self.rng.permutation(len(data["state"])), self.ppo.minibatches)
        return [np.flatnonzero(np.isin(data["step_of_row"], chosen)) for chosen in steps]

    def prepare(self, batch: Batch) -> dict[str, np.ndarray]:
        """Values, advantages and targets of every step, then the active steps flattened."""
        values, next_values = self.values_of(batch)
        ended = batch["terminations"] | batch["truncations"]
        advantages = gae(
            batch["rewards"].astype(np.float32),
            values,
            next_values,
            batch["terminations"],
            ended,
            self.cfg.gamma,
            self.ppo.gae_lambda,
            batch["active"],
        )
        active = batch["active"].reshape(-1)
        n_items, steps, agents = batch["rewards"].shape
        agent_index = np.broadcast_to(np.arange(agents), (n_items, steps, agents)).reshape(-1)
        actions = batch["actions"]
        flat = {
            "observations": rows(self.actor_inputs(batch["observations"])),
            "actions": rows(actions) if self.group.continuous else actions.reshape(-1),
            "log_probs": batch["log_probs"].reshape(-1),
            "agent": agent_index,
            "advantages": advantages.reshape(-1),
            "values": values.reshape(-1),
            "returns": (advantages + values).reshape(-1),
        }
        if "action_masks" in batch:
            flat["action_masks"] = rows(batch["action_masks"])
        if self.heads:
            flat["step_of_row"] = np.arange(n_items * steps * agents) // agents
        else:
            flat["critic_in"] = rows(self.critic_inputs(batch, "state", "observations"))
        data = {k: v[active] for k, v in flat.items()}
        if self.heads:
            data["state"] = rows(batch["state"]).astype(np.float32)
        if self.ppo.normalize_advantages and len(data["advantages"]) > 1:
            adv = data["advantages"]
            data["advantages"] = ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)
        return data

    def values_of(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """V(s_t) and V(s'_t), [items, T, agents], in return units."""
        critic = self.networks["critic"]
        with torch.no_grad():
            if self.heads:
                now = critic(self.as_tensor(batch["state"].astype(np.float32)))
                after = critic(self.as_tensor(batch["next_state"].astype(np.float32)))
            else:
                now = critic(self.as_tensor(self.critic_inputs(batch, "state", "observations")))
                after = critic(
                    self.as_tensor(self.critic_inputs(batch, "next_state", "next_observations"))
                )
                now, after = now.squeeze(-1), after.squeeze(-1)
        denorm = self.value_norm.denormalize
        return denorm(now.cpu().numpy()), denorm(after.cpu().numpy())

    def actor_inputs(self, obs: np.ndarray) -> np.ndarray:
        """[items, T, agents, obs(+ids)]: with `actor_agent_id`, each agent's observation with
        the one-hot of its index among its policy's agents appended (as its actor sees it)."""
        if not self.ppo.actor_agent_id:
            return obs
        n_items, steps, agents, _ = obs.shape
        width = max(len(self.group.agents_of(p)) for p in self.group.policies)
        one_hot = np.eye(width, dtype=np.float32)[self.index_in_policy]
        one_hot = np.broadcast_to(one_hot, (n_items, steps, agents, width))
        return np.concatenate([obs, one_hot], axis=-1)

    def critic_inputs(self, batch: Batch, state: str, obs: str) -> np.ndarray:
        """[items, T, agents, width]: the global state (or each agent's observation), with a
        one-hot agent index appended when `critic_agent_id` is set."""
        n_items, steps, agents = batch["rewards"].shape
        if self.ppo.critic == "central":
            x = np.broadcast_to(
                batch[state][:, :, None, :], (n_items, steps, agents, batch[state].shape[-1])
            )
        else:
            x = batch[obs]
        if self.ppo.critic_agent_id:
            one_hot = np.broadcast_to(
                np.eye(agents, dtype=np.float32), (n_items, steps, agents, agents)
            )
            x = np.concatenate([x, one_hot], axis=-1)
        return np.ascontiguousarray(x, dtype=np.float32)

    def minibatch_gradient(
        self, data: dict[str, np.ndarray], rows: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """The loss gradient of one minibatch (zero, with zero stats, if it is empty)."""
        if len(rows) == 0:
            nothing = torch.stack([p.sum() for p in self.params]).sum() * 0.0
            return self.backward(nothing), _EMPTY_STATS.copy()
        mb = {k: self.as_tensor(v[rows]) for k, v in data.items() if k != "state"}  # per step
        log_probs, entropy = self.evaluate_actions(
            mb["observations"], mb["actions"], mb["agent"], mb.get("action_masks")
        )
        ratio = torch.exp(log_probs - mb["log_probs"])
        policy_loss = clipped_surrogate(ratio, mb["advantages"], self.ppo.clip)
        values = self.critic_values(data, rows, mb)
        value_loss = clipped_value_loss(
            values, mb["old_values"], mb["targets"], self.ppo.value_clip, self.ppo.value_huber_delta
        )
        entropy_mean = entropy.mean()
        loss = policy_loss + self.ppo.value_coef * value_loss - self.ppo.entropy_coef * entropy_mean
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"PPO diverged in update {self.updates + 1} of group {self.group.name}: the loss "
                f"is {loss.item()} (policy {policy_loss.item()}, value {value_loss.item()}); "
                "lower learner.lr or raise learner.ppo.entropy_coef"
            )
        flat_grad = self.backward(loss)
        with torch.no_grad():
            log_ratio = log_probs - mb["log_probs"]
            approx_kl = ((ratio - 1) - log_ratio).mean().item()
            clip_frac = ((ratio - 1).abs() > self.ppo.clip).float().mean().item()
        row = {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy_mean.item(),
            "approx_kl": approx_kl,
            "clip_frac": clip_frac,
        }
        return flat_grad, row

    def critic_values(
        self, data: dict[str, np.ndarray], rows: np.ndarray, mb: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The critic's value of each row of the minibatch; with heads, one pass over the
        minibatch's env steps, each row reading its agent's head."""
        critic = self.networks["critic"]
        if not self.heads:
            return critic(mb["critic_in"]).squeeze(-1)
        steps, where = np.unique(data["step_of_row"][rows], return_inverse=True)
        per_step = critic(self.as_tensor(data["state"][steps]))
        return per_step[self.as_tensor(where), mb["agent"]]

    def evaluate_actions(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        agent: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a|o) and the entropy of pi(.|o) of each row, by the actor of its agent, over
        the legal actions when there is a `mask`."""
        if len(self.group.policies) == 1:
            return self.policy_log_prob(self.group.policies[0], obs, actions, mask)
        log_probs = torch.empty_like(agent, dtype=torch.float32)
        entropy = torch.empty_like(log_probs)
        for policy in self.group.policies:
            agents = [i for i, p in enumerate(self.agent_policy) if p == policy]
            rows = torch.isin(agent, torch.as_tensor(agents, device=agent.device))
            obs_dim, _ = self.group.dims(policy)
            ids = len(self.group.agents_of(policy)) if self.ppo.actor_agent_id else 0
            width = obs_dim + ids  # the one-hot is padded to the widest policy's
            lp, ent = self.policy_log_prob(
                policy, obs[rows][:, :width], actions[rows], None if mask is None else mask[rows]
            )
            log_probs[rows], entropy[rows] = lp, ent
        return log_probs, entropy

    def policy_log_prob(
        self, policy: str, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a|o) and the entropy of one policy's rows: softmax over (legal) actions, or
        for continuous actions a diagonal Gaussian, both summed over the action's dimensions."""
        actor = self.acting(policy)
        if not self.group.continuous:
            return _log_prob_entropy(actor(obs), actions, mask)
        normal = torch.distributions.Normal(actor(obs), actor.get_parameter("log_std").exp())
        return normal.log_prob(actions).sum(-1), normal.entropy().sum(-1)

    def as_tensor(self, array: np.ndarray) -> torch.Tensor:
        """`array` on the learner's device; uint8 observations move as uint8 and are cast to
        float32 there (`base.on_device`)."""
        return on_device(np.ascontiguousarray(array), self.device)

    # -- resume -----------------------------------------------------------------------------
    def extra_state(self) -> dict[str, np.ndarray]:
        return {"value_norm": self.value_norm.state(), "rng": rng_to_words(self.rng)}

    def load_extra_state(self, state: dict[str, np.ndarray]) -> None:
        self.value_norm.load_state(state["value_norm"])
        self.rng.bit_generator.state = rng_from_words(state["rng"])


_EMPTY_STATS = dict.fromkeys(
    ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac"), 0.0
)


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """1 - Var(R - V) / Var(R): how much of the targets' spread the critic predicted (1 is all,
    0 no better than their mean)."""
    spread = float(np.var(returns)) if len(returns) > 1 else 0.0
    return 1.0 - float(np.var(returns - values)) / spread if spread > 0 else 0.0


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """-E[min(r A, clip(r, 1 - clip, 1 + clip) A)]: the PPO policy loss."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    return -torch.min(unclipped, clipped).mean()


def clipped_value_loss(
    values: torch.Tensor, old: torch.Tensor, targets: torch.Tensor, clip: float, delta: float
) -> torch.Tensor:
    """max(L(V), L(V_old + clip(V - V_old))) with L Huber(delta) or, for delta 0, half the
    squared error; no clip when `clip` is 0."""

    def loss(v: torch.Tensor) -> torch.Tensor:
        if delta > 0:
            return F.huber_loss(v, targets, reduction="none", delta=delta)
        return 0.5 * (v - targets) ** 2

    if clip <= 0:
        return loss(values).mean()
    clipped = old + torch.clamp(values - old, -clip, clip)
    return torch.max(loss(values), loss(clipped)).mean()


def rows(x: np.ndarray) -> np.ndarray:
    """[items, T, agents, width] -> [items * T * agents, width] (also for zero items)."""
    return x.reshape(-1, x.shape[-1])


def _log_prob_entropy(
    logits: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    log_softmax = masked_log_softmax(logits, mask)
    taken = log_softmax.gather(-1, actions[:, None]).squeeze(-1)
    return taken, entropy_of(log_softmax)
