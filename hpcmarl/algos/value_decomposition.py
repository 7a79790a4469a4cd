"""Value decomposition for teams: VDN (Sunehag et al. 2018) and QMIX (Rashid et al. 2018), with
EPyMARL's recurrent agents and defaults.

A team is one training group whose agents share one recurrent Q-network (GRU), told apart by a
one-hot agent index on their observations. The team's value is a mix of the agents' chosen
Q-values: VDN adds them; QMIX mixes them through a network whose weights a hypernetwork makes
from the global state, made non-negative so that Q_tot rises with every agent's Q (each agent's
greedy action is then the team's). One optimizer trains the agents and the mixer on the team
reward (the sum of the agents' rewards; with `standardize_rewards`, less its running mean and
over its running standard deviation, moments the group averages before every update); a
target copy of both is refreshed every `target_network_update_freq` updates, or follows them
by Polyak averaging (`target_tau`).

Items are whole episodes, `[T_max, agents, ...]` padded after the last step (`filled` marks the
real steps; `items.writers.EpisodeWriter`), sampled uniformly from replay. The update runs the
agents' GRU over each episode from a zero state, along the observations followed by the final
next observation, so step t + 1's Q-values are those of s_{t+1} with the memory of s_0..s_t:

    y_t = r_t + gamma (1 - terminated_t) Q_tot'(s_{t+1}, argmax_a Q(s_{t+1}, a))   (double Q)
    L = sum_t filled_t (Q_tot(s_t, a_t) - y_t)^2 / sum_t filled_t

or TD(lambda) targets over the episode when `td_lambda` > 0. Where the env has legal-action
masks, the next actions are the best legal ones. An agent that is no longer active adds nothing
to Q_tot. A time limit (truncation) is bootstrapped unless `bootstrap_truncated` is false: then
it ends the return like a termination, a finite horizon on which the mixer's overestimates
cannot compound from one episode's end into the next state's value.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcmarl.algos.base import NetworkAlgorithm, on_device
from hpcmarl.algos.catalog import keys_of
from hpcmarl.algos.contract import Batch, GroupSpec, PolicySpec, UpdateSteps
from hpcmarl.algos.masking import masked_argmax
from hpcmarl.algos.networks import RecurrentQNet, policy_layout, policy_network
from hpcmarl.algos.returns import ValueNorm
from hpcmarl.algos.torsos import torso_spec
from hpcmarl.algos.value_decomposition_config import QMIXConfig
from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec


def team_columns(group: GroupSpec, extra: list[Column]) -> tuple[Column, ...]:
    """A step of every agent of the group, as recurrent Q-learners train on it (episodes,
    sequences): the transition columns per agent, who was `active`, which steps are `filled`,
    the algorithm's `extra` columns, and the legal-action masks when the env has them."""
    obs_dim, n_actions = group.dims(group.policies[0])
    obs = group.obs_dtype
    columns = [
        Column("observations", obs, (obs_dim,)),
        Column("actions", "<i8"),
        Column("rewards", "<f4"),
        Column("next_observations", obs, (obs_dim,)),
        Column("terminations", "|b1"),
        Column("truncations", "|b1"),
        Column("active", "|b1"),
        Column("filled", "|b1", per="group"),
        Column("episode_id", "<i8", per="group"),
        Column("step", "<i4", per="group"),
        Column("policy_version", "<i8", per="group"),
        *extra,
    ]
    if group.action_masks:
        columns += [
            Column("action_masks", "|b1", (n_actions,)),
            Column("next_action_masks", "|b1", (n_actions,)),
        ]
    return tuple(columns)


def episode_item(group: GroupSpec, job: Any) -> ItemSpec:
    """A whole episode of the team; the global state only where the mixer reads it."""
    qmix = keys_of(job.learner, QMIXConfig)
    state = [
        Column("state", "<f4", (group.state_dim,), per="group"),
        Column("next_state", "<f4", (group.state_dim,), per="group"),
    ]
    columns = team_columns(group, state if qmix.mixer == "qmix" else [])
    selector = "prioritized" if job.replay.prioritized else "uniform"
    return ItemSpec("episode", columns, len(group.agents), qmix.episode_limit, ReplaySpec(selector))


class VDNMixer(nn.Module):
    """Q_tot = sum_i Q_i."""

    def forward(self, qs: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        return qs.sum(dim=-1)


class QMIXMixer(nn.Module):
    """Q_tot = w2(s)^T elu(W1(s)^T q + b1(s)) + V(s) with W1, w2 >= 0 (absolute values of the
    hypernetworks' outputs): monotonic in every agent's Q."""

    def __init__(self, agents: int, state_dim: int, embed: int, hypernet_embed: int) -> None:
        super().__init__()
        self.agents, self.embed = agents, embed
        self.hyper_w1 = nn.Sequential(
            nn.Linear(state_dim, hypernet_embed),
            nn.ReLU(),
            nn.Linear(hypernet_embed, agents * embed),
        )
        self.hyper_w2 = nn.Sequential(
            nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, embed)
        )
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.value = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, qs: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """`qs` [..., agents], `state` [..., state_dim] -> Q_tot [...]."""
        assert state is not None
        lead = qs.shape[:-1]
        q = qs.reshape(-1, self.agents, 1)
        s = state.reshape(-1, state.shape[-1])
        w1 = self.hyper_w1(s).abs().view(-1, self.agents, self.embed)
        # A sum of products, not bmm: bmm over thousands of 1 x agents matrices costs ten times
        # as much on a CPU.
        hidden = nn.functional.elu((q * w1).sum(dim=1) + self.hyper_b1(s))
        w2 = self.hyper_w2(s).abs()
        total = (hidden * w2).sum(dim=1) + self.value(s).view(-1)
        return total.view(lead)


class ValueDecomposition(NetworkAlgorithm):
    """A team's shared recurrent agent network and its mixer, with their targets."""

    name = "qmix"

    @classmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        return episode_item(group, job)

    @classmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        q = keys_of(job.learner, QMIXConfig)
        ids = len(group.agents_of(group.policies[0])) if q.agent_id else 0
        return recurrent_q_spec(group, job, q, ids)

    def __init__(self, group: GroupSpec, job: Any, seed: int, device: str = "cpu") -> None:
        self.q = keys_of(job.learner, QMIXConfig)
        super().__init__(group, job, seed, device)
        self.n_agents = len(group.agents)
        self.agent_ids = len(group.agents_of(group.policies[0])) if self.q.agent_id else 0
        self.reward_norm = ValueNorm()
        """Running moments of the team reward (`standardize_rewards`), the same on every
        member of the group: each update averages its batch's moments over the group first."""

    # -- networks ---------------------------------------------------------------------------
    def build_networks(self) -> dict[str, nn.Module]:
        (spec,) = self.policy_specs(self.group, self.job).values()
        agent = policy_network(spec)
        assert isinstance(agent, RecurrentQNet)
        self.agent = agent
        nets: dict[str, nn.Module] = {"agent": self.agent}
        if self.q.mixer == "qmix":
            agents = len(self.group.agents)
            nets["mixer"] = QMIXMixer(
                agents, self.group.state_dim, self.q.mixing_embed, self.q.hypernet_embed
            )
        self.mixer = nets.get("mixer", VDNMixer())
        return nets

    def build_extra_networks(self) -> dict[str, nn.Module]:
        self.agent_target = copy.deepcopy(self.agent).requires_grad_(False)
        self.mixer_target = copy.deepcopy(self.mixer).requires_grad_(False)
        extras: dict[str, nn.Module] = {"agent_target": self.agent_target}
        if self.q.mixer == "qmix":
            extras["mixer_target"] = self.mixer_target
        return extras

    def acting(self, policy: str) -> nn.Module:
        return self.agent

    def after_step(self) -> None:
        pairs = [(self.agent, self.agent_target), (self.mixer, self.mixer_target)]
        self.follow_targets(pairs, self.q.target_network_update_freq, self.q.target_tau)

    # -- the update (the base's one gradient per batch) ---------------------------------------
    def update(self, batch: Batch, weights: np.ndarray | None = None) -> UpdateSteps:
        if self.q.standardize_rewards:
            filled = np.asarray(batch["filled"])
            team = np.asarray(batch["rewards"], np.float64).sum(axis=-1)[filled]
            self.reward_norm.update_from((yield self.reward_norm.moments(team)))
        return (yield from super().update(batch, weights))

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """The loss gradient, stats, and each episode's mean |TD error| over its steps."""
        t = tensors_of(batch, self.device)
        filled = t["filled"]
        inputs = sequence_inputs(t["observations"], t["next_observations"], self.agent_ids)
        q_all, _ = unroll(self.agent, inputs)  # [B, T+1, N, A], from zero states
        q_taken = q_all[:, :-1].gather(-1, t["actions"][..., None]).squeeze(-1)
        q_taken = q_taken * t["active"]
        q_tot = self.mixer(q_taken, t.get("state"))  # [B, T]
        with torch.no_grad():
            target = self.targets(t, q_all.detach(), inputs)
        td = (q_tot - target) * filled
        per_item = (td**2).sum(dim=1)
        if weights is not None:
            per_item = per_item * torch.as_tensor(weights, dtype=torch.float32, device=self.device)
        count = filled.sum().clamp(min=1.0)
        loss = per_item.sum() / count
        flat_grad = self.backward(loss)
        steps = filled.sum(dim=1).clamp(min=1.0)
        errors = (td.detach().abs().sum(dim=1) / steps).cpu().numpy().astype(np.float32)
        real = filled.bool()
        stats = {
            "loss": loss.item(),
            "q_tot_mean": q_tot.detach()[real].mean().item() if real.any() else 0.0,
            "target_mean": target[real].mean().item() if real.any() else 0.0,
            "td_abs_mean": float(td.detach().abs().sum().item() / count.item()),
        }
        if self.q.standardize_rewards:
            stats["reward_mean"], stats["reward_std"] = self.reward_norm.stats()
        return flat_grad, stats, errors

    def targets(
        self, t: dict[str, torch.Tensor], q_online: torch.Tensor, inputs: torch.Tensor
    ) -> torch.Tensor:
        """y_t per episode step, [B, T]: one-step or TD(lambda) targets from the target agents
        and mixer at s_{t+1}."""
        q_next_target = unroll(self.agent_target, inputs)[0][:, 1:]  # [B, T, N, A]
        chooser = q_online[:, 1:] if self.q.double_q else q_next_target
        q_next = next_values(chooser, q_next_target, t.get("next_action_masks"))
        q_next = q_next * (1.0 - t["terminations"]) * t["active"]  # a done agent adds nothing
        next_tot = self.mixer_target(q_next, t.get("next_state"))  # [B, T]
        reward = t["rewards"].sum(dim=-1)  # the team reward
        if self.q.standardize_rewards:
            mean, std = self.reward_norm.stats()
            reward = (reward - mean) / std
        ended = t["terminations"] + (1.0 - t["active"])
        if not self.q.bootstrap_truncated:
            ended = ended + t["truncations"]
        done = ended.clamp(max=1.0).min(dim=-1).values
        gamma = self.cfg.gamma
        if self.q.td_lambda <= 0:
            return reward + gamma * (1.0 - done) * next_tot
        return lambda_returns(reward, next_tot, done, t["filled"], gamma, self.q.td_lambda)

    # -- resume -----------------------------------------------------------------------------
    def extra_state(self) -> dict[str, np.ndarray]:
        return {"reward_norm": self.reward_norm.state()}

    def load_extra_state(self, state: dict[str, np.ndarray]) -> None:
        if "reward_norm" in state:  # absent from checkpoints written before it existed
            self.reward_norm.load_state(state["reward_norm"])


def next_values(
    chooser: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """`target`'s value [...] of the best legal action by `chooser` ([..., A] both: the online
    network's for double Q, else the target's own); 0 where no action is legal."""
    actions = chooser.shape[-1]
    flat_mask = None if mask is None else mask.reshape(-1, actions)
    best = masked_argmax(chooser.reshape(-1, actions), flat_mask)
    value = target.reshape(-1, actions).gather(1, best).view(chooser.shape[:-1])
    return value if mask is None else torch.where(mask.any(dim=-1), value, 0.0)


def recurrent_q_spec(
    group: GroupSpec, job: Any, settings: Any, agent_ids: int
) -> dict[str, PolicySpec]:
    """The published recurrent Q-network of the group's one policy, acting epsilon-greedily:
    `settings` is the algorithm's section (rnn_hidden and the epsilon schedule)."""
    policy = group.policies[0]
    obs_dim, n_actions = group.dims(policy)
    s = settings
    explore = {"eps_start": s.eps_start, "eps_end": s.eps_end, "eps_decay": s.eps_decay_steps}
    spec = PolicySpec(
        key=group.keys[policy],
        actor="recurrent_epsilon_greedy",
        obs_dim=obs_dim,
        n_actions=n_actions,
        hidden_sizes=(s.rnn_hidden,),
        activation="relu",
        explore=tuple(sorted(explore.items())),
        agent_ids=agent_ids,
        recurrent=s.rnn_hidden,
        torso=torso_spec(job, group, policy),
    )
    return {spec.key: dataclasses.replace(spec, params=tuple(policy_layout(spec)))}


def sequence_inputs(obs: torch.Tensor, next_obs: torch.Tensor, agent_ids: int) -> torch.Tensor:
    """[B, T+1, N, in]: o_0, then o'_0..o'_{T-1} (each o_{t+1}, and the final observation
    where the episode ends), with the agents' one-hot indices appended when `agent_ids`."""
    seq = torch.cat([obs[:, :1], next_obs], dim=1)
    if not agent_ids:
        return seq
    b, steps, n, _ = seq.shape
    one_hot = torch.eye(agent_ids, device=seq.device)[:n]
    return torch.cat([seq, one_hot.expand(b, steps, n, agent_ids)], dim=-1)


def unroll(
    net: RecurrentQNet, inputs: torch.Tensor, h0: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q-values [B, T, N, A] of every agent along `inputs` [B, T, N, in], from states `h0`
    [B, N, H] (zeros when None), and the final states [B, N, H]."""
    b, steps, n, width = inputs.shape
    per_agent = inputs.permute(0, 2, 1, 3).reshape(b * n, steps, width)
    start = None if h0 is None else h0.reshape(b * n, -1)
    q, h = net(per_agent, start)
    return q.view(b, n, steps, -1).permute(0, 2, 1, 3), h.view(b, n, -1)


_FLOATS = {"observations", "next_observations", "rewards", "state", "next_state"}
_FLAGS = {"terminations", "truncations", "active", "filled"}


def tensors_of(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's columns a recurrent Q-learner reads, as tensors cast on `device` (uint8
    observations move as uint8): values and flags as float32, actions as int64, masks as bool,
    stored recurrent states as float32."""
    out: dict[str, torch.Tensor] = {}
    for name, array in batch.items():
        if name in _FLOATS or name in _FLAGS or name == "recurrent_state":
            out[name] = on_device(array, device, torch.float32)
        elif name == "actions":
            out[name] = on_device(array, device, torch.int64)
        elif name.endswith("action_masks"):
            out[name] = on_device(array, device, torch.bool)
    return out


def lambda_returns(
    reward: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    filled: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """TD(lambda) targets [B, T], backwards over each episode:
    G_t = r_t + gamma (1 - done_t) ((1 - lam) V_{t+1} + lam G_{t+1}), where the step after the
    episode's last filled one contributes V_{t+1} only (a truncated episode is bootstrapped
    unless its last step is `done`)."""
    steps = reward.shape[1]
    out = torch.zeros_like(reward)
    following = torch.zeros_like(reward[:, 0])
    for t in reversed(range(steps)):
        more = filled[:, t + 1] if t + 1 < steps else torch.zeros_like(following)
        mix = lam * more
        blended = (1.0 - mix) * next_value[:, t] + mix * following
        out[:, t] = reward[:, t] + gamma * (1.0 - done[:, t]) * blended
        following = out[:, t]
    return out * filled
