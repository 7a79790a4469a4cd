"""Actors: the acting half of a policy, built from its `PolicySpec`, for collectors and evals.

An actor owns its exploration. `EpsilonGreedyActor` (DQN, BC) takes a random action with
probability epsilon, which decays with the job's global env-step count; `CategoricalActor` (PPO)
samples from its softmax and records the log-probability of what it took; `GaussianActor` (PPO
on continuous actions) samples a diagonal Gaussian around its network's mean;
`RecurrentEpsilonGreedyActor` (VDN, QMIX) is epsilon-greedy over a GRU Q-network whose state the
collector carries from step to step. All take greedy
actions when asked (evaluation) and honour action masks: a masked action is never chosen, by
the greedy rule, by exploration or by sampling.

Forward passes call `F.linear` on the layers' own tensors instead of `nn.Sequential`: the same
arithmetic at about half the per-call overhead, which dominates for small batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hpcmarl.algos.contract import Actor, ActResult, PolicySpec
from hpcmarl.algos.masking import masked, masked_log_softmax
from hpcmarl.algos.networks import RecurrentQNet, param_spec, policy_network, set_flat
from hpcmarl.errors import ConfigError

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu_,
    "tanh": torch.tanh_,
}


def linear_epsilon(env_steps: int, start: float, end: float, decay_steps: float) -> float:
    """eps = start + (end - start) * min(1, env_steps / decay_steps)."""
    frac = min(1.0, env_steps / max(1.0, decay_steps))
    return start + (end - start) * frac


class FrozenActor:
    """The network the spec describes (`networks.policy_network`), loaded from flat vectors,
    without gradients; a spec whose parameters differ from the network's is refused."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.n_actions = spec.n_actions
        with torch.random.fork_rng(devices=[]):  # its weights come from the server anyway
            self.net = policy_network(spec)
        self.net.requires_grad_(False)
        held = tuple(param_spec(self.net))
        if held != spec.params:
            raise ValueError(f"policy {spec.key}: the spec lists {spec.params}, the actor {held}")
        self.agent_ids = spec.agent_ids
        """Width of the one-hot agent index the network takes (0: none)."""

    def set_weights(self, flat: np.ndarray) -> None:
        """Load weights pulled from the parameter server (in place: views of them stay valid)."""
        set_flat(self.net, flat)

    def inputs(self, obs: np.ndarray, agent_index: np.ndarray | None) -> torch.Tensor:
        """The network's input for a batch [B, obs_dim]: with the one-hot agent index
        appended for a spec with `agent_ids`."""
        if self.agent_ids:
            if agent_index is None:
                raise ValueError(f"policy {self.spec.key} needs each row's agent index")
            obs = with_agent_ids(obs, agent_index, self.agent_ids)
        return torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))


class NetworkActor(FrozenActor):
    """A feed-forward network; an MLP's forward pass on the layers' own tensors."""

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self._layers = []
        if isinstance(self.net, torch.nn.Sequential):  # the mlp torso
            self._layers = [(m.weight, m.bias) for m in self.net if isinstance(m, torch.nn.Linear)]
        self._activation = _ACTIVATIONS[spec.activation]

    def scores(self, obs: np.ndarray, agent_index: np.ndarray | None = None) -> torch.Tensor:
        """The network's outputs (Q-values or logits) for a batch [B, obs_dim]."""
        with torch.inference_mode():
            h = self.inputs(obs, agent_index)
            if not self._layers:
                return self.net(h)  # type: ignore[no-any-return]
            for weight, bias in self._layers[:-1]:
                h = self._activation(F.linear(h, weight, bias))
            return F.linear(h, *self._layers[-1])


class EpsilonGreedyActor(NetworkActor):
    """argmax of the scores, or with probability epsilon a uniformly random (legal) action."""

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.schedule = _eps(spec.exploration())
        """(start, end, decay steps) of epsilon, read once: `act` runs every env step."""

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        *,
        env_steps: int,
        greedy: bool,
        action_mask: np.ndarray | None = None,
        recurrent_state: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> ActResult:
        size = obs.shape[0]
        epsilon = 0.0 if greedy else linear_epsilon(env_steps, *self.schedule)
        if epsilon <= 0:
            return ActResult(self.greedy(obs, action_mask, agent_index))
        exploring = np.asarray(rng.random(size) < epsilon)
        if exploring.all():  # the forward pass is skipped when every row explores
            return ActResult(random_actions(rng, size, self.n_actions, action_mask))
        actions = self.greedy(obs, action_mask, agent_index)
        return ActResult(explore(actions, exploring, rng, self.n_actions, action_mask))

    def greedy(
        self,
        obs: np.ndarray,
        action_mask: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> np.ndarray:
        """argmax_a Q(obs, a) over the legal actions, as int64 [B]."""
        scores = masked(self.scores(obs, agent_index), _tensor(action_mask))
        return scores.argmax(dim=1).numpy()


class CategoricalActor(NetworkActor):
    """Samples from softmax(logits) over the legal actions and records `log_probs`."""

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        *,
        env_steps: int,
        greedy: bool,
        action_mask: np.ndarray | None = None,
        recurrent_state: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> ActResult:
        log_probs = self.log_probabilities(obs, action_mask, agent_index)
        if greedy:
            actions = log_probs.argmax(axis=1)
        else:  # inverse CDF with the collector's own generator: reproducible and checkpointed
            cdf = np.cumsum(np.exp(log_probs, dtype=np.float64), axis=1)
            u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
            actions = np.minimum((cdf <= u).sum(axis=1), self.n_actions - 1)
            if action_mask is not None:  # rounding can never land on a masked action
                actions = _nearest_legal(actions, action_mask)
        rows = np.arange(len(actions))
        taken = log_probs[rows, actions].astype(np.float32)
        return ActResult(actions.astype(np.int64), {"log_probs": taken})

    def log_probabilities(
        self,
        obs: np.ndarray,
        action_mask: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> np.ndarray:
        """log pi(a | obs) over the legal actions, [B, n_actions]."""
        logits = self.scores(obs, agent_index)
        return masked_log_softmax(logits, _tensor(action_mask)).numpy()

    def probabilities(
        self,
        obs: np.ndarray,
        action_mask: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> np.ndarray:
        """The distribution `act` samples from, float64 [B, n_actions] (0 on masked actions):
        the policy itself, for scoring it exactly (PSRO's exploitability)."""
        log_probs = self.log_probabilities(obs, action_mask, agent_index)
        probs = np.exp(log_probs.astype(np.float64))
        if action_mask is not None:
            probs[~action_mask] = 0.0
        return probs / probs.sum(axis=1, keepdims=True)


class GaussianActor(NetworkActor):
    """A diagonal Gaussian over continuous actions (`networks.GaussianPolicy`): samples
    mean + std * noise with the collector's own generator and records the log-density of
    the sample, summed over the action's dimensions; greedy, the mean. Actions are not clipped
    here: the env adapter clips what it steps with, and items keep the sample the log-density
    belongs to."""

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.log_std: torch.Tensor = self.net.get_parameter("log_std")
        mean = self.net.get_submodule("mean")
        if isinstance(mean, torch.nn.Sequential):  # the mlp torso: the fast forward pass
            self._layers = [(m.weight, m.bias) for m in mean if isinstance(m, torch.nn.Linear)]

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        *,
        env_steps: int,
        greedy: bool,
        action_mask: np.ndarray | None = None,
        recurrent_state: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> ActResult:
        mean = self.scores(obs, agent_index).numpy()
        log_std = self.log_std.detach().numpy().astype(np.float64)
        noise = np.zeros(mean.shape) if greedy else rng.standard_normal(mean.shape)
        actions = (mean + np.exp(log_std) * noise).astype(np.float32)
        density = -0.5 * noise**2 - log_std - 0.5 * LOG_2PI
        return ActResult(actions, {"log_probs": density.sum(axis=1).astype(np.float32)})


LOG_2PI = float(np.log(2.0 * np.pi))


class RecurrentEpsilonGreedyActor(FrozenActor):
    """Epsilon-greedy over a recurrent Q-network: every row advances its recurrent state, also
    the rows that explore, so the state always summarises what the agent has seen."""

    net: RecurrentQNet

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.schedule = _eps(spec.exploration())

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        *,
        env_steps: int,
        greedy: bool,
        action_mask: np.ndarray | None = None,
        recurrent_state: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> ActResult:
        size = obs.shape[0]
        if recurrent_state is None:
            recurrent_state = np.zeros((size, self.spec.recurrent), np.float32)
        with torch.inference_mode():
            x = self.inputs(obs, agent_index)
            q, h = self.net.step(x, torch.from_numpy(recurrent_state))
            actions = masked(q, _tensor(action_mask)).argmax(dim=1).numpy()
        epsilon = 0.0 if greedy else linear_epsilon(env_steps, *self.schedule)
        if epsilon > 0:
            exploring = np.asarray(rng.random(size) < epsilon)
            actions = explore(actions, exploring, rng, self.n_actions, action_mask)
        return ActResult(actions, recurrent_state=h.numpy())


def explore(
    actions: np.ndarray,
    exploring: np.ndarray,
    rng: np.random.Generator,
    n_actions: int,
    action_mask: np.ndarray | None,
) -> np.ndarray:
    """`actions` with the `exploring` rows' replaced by uniformly random legal ones."""
    n_explore = int(np.count_nonzero(exploring))
    if n_explore:
        mask = None if action_mask is None else action_mask[exploring]
        actions[exploring] = random_actions(rng, n_explore, n_actions, mask)
    return actions


def with_agent_ids(obs: np.ndarray, agent_index: np.ndarray, width: int) -> np.ndarray:
    """Each row of `obs` with the one-hot of its agent index appended."""
    one_hot = np.zeros((len(obs), width), np.float32)
    one_hot[np.arange(len(obs)), agent_index] = 1.0
    return np.concatenate([obs, one_hot], axis=1)


def random_actions(
    rng: np.random.Generator, size: int, n_actions: int, mask: np.ndarray | None
) -> np.ndarray:
    """Uniform actions, among the legal ones when a mask [size, n_actions] is given."""
    if mask is None:
        return np.asarray(rng.integers(n_actions, size=size, dtype=np.int64))
    legal = mask.sum(axis=1)
    pick = np.floor(rng.random(size) * legal).astype(np.int64)
    order = np.cumsum(mask, axis=1) - 1  # rank of each legal action in its row
    return np.argmax((order == pick[:, None]) & mask, axis=1).astype(np.int64)


class UniformActor:
    """Uniformly random legal actions for the agents of `spec`'s key: the random policy that
    a trained one is measured against on the same start states (`hpcmarl evaluate --random`).
    Feed-forward and without agent indices, whatever the trained policy's spec says."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = dataclasses.replace(spec, recurrent=0, agent_ids=0)
        self.box = tuple(np.asarray(b, np.float64) for b in spec.action_box)
        """A continuous policy's (low, high): actions are uniform within them (standard
        normal along an unbounded dimension)."""

    def set_weights(self, flat: np.ndarray) -> None:
        """Nothing to set: the uniform policy has no parameters."""

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        *,
        env_steps: int,
        greedy: bool,
        action_mask: np.ndarray | None = None,
        recurrent_state: np.ndarray | None = None,
        agent_index: np.ndarray | None = None,
    ) -> ActResult:
        if self.box:
            return ActResult(uniform_in_box(rng, len(obs), *self.box))
        return ActResult(random_actions(rng, len(obs), self.spec.n_actions, action_mask))


def uniform_in_box(
    rng: np.random.Generator, size: int, low: np.ndarray, high: np.ndarray
) -> np.ndarray:
    """float32 [size, dims] uniform within [low, high], standard normal where unbounded."""
    finite = np.isfinite(low) & np.isfinite(high)
    u = rng.random((size, len(low)))
    span = np.where(finite, high - low, 0.0)
    actions = np.where(finite, np.where(finite, low, 0.0) + u * span, rng.standard_normal(u.shape))
    return actions.astype(np.float32)


def _tensor(mask: np.ndarray | None) -> torch.Tensor | None:
    return None if mask is None else torch.from_numpy(np.asarray(mask, dtype=bool))


def _nearest_legal(actions: np.ndarray, mask: np.ndarray) -> np.ndarray:
    bad = ~mask[np.arange(len(actions)), actions]
    if bad.any():
        actions = actions.copy()
        actions[bad] = np.argmax(mask[bad], axis=1)
    return actions


def _eps(explore: dict[str, float]) -> tuple[float, float, float]:
    return explore.get("eps_start", 0.0), explore.get("eps_end", 0.0), explore.get("eps_decay", 1)


ACTOR_KINDS: dict[str, type[FrozenActor]] = {
    "epsilon_greedy": EpsilonGreedyActor,
    "categorical": CategoricalActor,
    "gaussian": GaussianActor,
    "recurrent_epsilon_greedy": RecurrentEpsilonGreedyActor,
}
"""Actor classes by `PolicySpec.actor`."""


def build_actor(spec: PolicySpec) -> Actor:
    """The actor a PolicySpec describes."""
    if spec.actor not in ACTOR_KINDS:
        raise ConfigError(
            f"policy {spec.key} needs actor kind {spec.actor!r}, which this hpcmarl lacks",
            f"use a policy whose actor is one of {sorted(ACTOR_KINDS)}",
        )
    return ACTOR_KINDS[spec.actor](spec)  # type: ignore[return-value]
