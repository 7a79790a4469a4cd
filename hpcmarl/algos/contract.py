"""The learning contract (DESIGN.md §7): what every algorithm declares and what roles drive.

The roles are generic shells. A collector fills items (`ItemSpec`) and acts through actors built
from a `PolicySpec`; a shard stores and serves items as the spec's `ReplaySpec` says; a learner
drives `Algorithm.update`, a generator that yields local vectors to average across the group
and receives the averages, and publishes one flat weight vector per policy key; a parameter
server versions what is published. Nothing here imports MPI or torch.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hpcmarl.items.spec import ItemSpec, obs_dtype

Batch = dict[str, np.ndarray]
ActionBox = tuple[tuple[float, ...], tuple[float, ...]] | tuple[()]
"""A continuous action space's flat (low, high) bounds; () for discrete actions."""


@dataclass(frozen=True)
class TorsoSpec:
    """Which torso a policy's network starts with (`learner.model`), and the observation space
    it was built for: what a rank needs to rebuild the same network (`algos.torsos`)."""

    name: str = "mlp"
    """`mlp`, `cnn`, or a user's factory `module:function`."""
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Keyword arguments of the factory (`learner.model.kwargs`)."""
    space: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The observation space the factory is called with, as JSON (`torsos.space_json`); empty
    for `mlp`, which reads only the observation width."""

    def to_plain(self) -> dict[str, Any]:
        return {"name": self.name, "kwargs": dict(self.kwargs), "space": dict(self.space)}


@dataclass(frozen=True)
class PolicySpec:
    """How to build the acting half of a policy from its published flat vector.

    Stored once in the parameter-server table of `key` and sent with the first weights reply,
    so a collector can act with a policy it has never heard of (a PSRO population grows while
    the job runs). Private parts (critics, target networks, optimizer) are not described here.
    """

    key: str
    """`{strategy_spec_id}/{policy_id}`."""
    actor: str
    """Actor kind (`algos.actors.ACTOR_KINDS`): `epsilon_greedy`, `categorical` or
    `recurrent_epsilon_greedy`."""
    obs_dim: int
    n_actions: int
    hidden_sizes: tuple[int, ...]
    activation: str = "relu"
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(name, shape) of every parameter, in the order of the flat vector."""
    dtype: str = "float32"
    explore: tuple[tuple[str, float], ...] = ()
    """The actor's exploration settings (DQN: eps_start, eps_end, eps_decay_steps)."""
    agent_ids: int = 0
    """Width of a one-hot agent index appended to each observation (0: none). An agent's index
    is its place among the agents that act with this key, in the environment's agent order."""
    recurrent: int = 0
    """Width of the recurrent state the actor carries from step to step within an episode
    (0: a feed-forward actor). Collectors keep one state per agent and env copy and zero it
    where an episode starts."""
    torso: TorsoSpec = TorsoSpec()
    """The network's torso; the default `mlp` is `hidden_sizes` with `activation`."""
    action_box: ActionBox = ()
    """A continuous (`gaussian`) policy's action bounds (low, high), flat, `n_actions` each:
    where `hpcmarl.load_policy(...).act` clips its actions, as the env adapters do. Empty for
    discrete actions."""

    @property
    def in_dim(self) -> int:
        """Width of the network's input: the observation and the agent index."""
        return self.obs_dim + self.agent_ids

    @property
    def size(self) -> int:
        """Length of the flat weight vector."""
        return sum(math.prod(shape) for _, shape in self.params)

    def exploration(self) -> dict[str, float]:
        return dict(self.explore)

    def to_json(self) -> str:
        plain = {
            "key": self.key,
            "actor": self.actor,
            "obs_dim": self.obs_dim,
            "n_actions": self.n_actions,
            "hidden_sizes": list(self.hidden_sizes),
            "activation": self.activation,
            "params": [[name, list(shape)] for name, shape in self.params],
            "dtype": self.dtype,
            "explore": dict(self.explore),
            "agent_ids": self.agent_ids,
            "recurrent": self.recurrent,
        }
        if self.torso.name != "mlp":  # an mlp's spec stays the text older runs wrote
            plain["torso"] = self.torso.to_plain()
        if self.action_box:  # a discrete policy's spec stays the text older runs wrote
            plain["action_box"] = [list(self.action_box[0]), list(self.action_box[1])]
        return json.dumps(plain, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PolicySpec:
        p = json.loads(text)
        return cls(
            key=p["key"],
            actor=p["actor"],
            obs_dim=int(p["obs_dim"]),
            n_actions=int(p["n_actions"]),
            hidden_sizes=tuple(p["hidden_sizes"]),
            activation=p["activation"],
            params=tuple((name, tuple(shape)) for name, shape in p["params"]),
            dtype=p["dtype"],
            explore=tuple(sorted(p["explore"].items())),
            agent_ids=int(p.get("agent_ids", 0)),
            recurrent=int(p.get("recurrent", 0)),
            torso=TorsoSpec(**p["torso"]) if "torso" in p else TorsoSpec(),
            action_box=_action_box(p.get("action_box")),
        )


def _action_box(plain: list[list[float]] | None) -> ActionBox:
    """The (low, high) bounds of a spec's JSON, () where it has none (discrete actions)."""
    if not plain:
        return ()
    low, high = plain
    return tuple(float(x) for x in low), tuple(float(x) for x in high)


@dataclass(frozen=True)
class GroupSpec:
    """A training group: the unit of learning (one algorithm instance, one optimizer) over one
    or more policies and the agents mapped to them (MALib's IndependentAgent is one group per
    policy, its TeamAgent one group per team)."""

    name: str
    agents: tuple[str, ...]
    """The group's agents, in the environment's agent order."""
    policy_of: Mapping[str, str]
    """agent -> policy id, for the group's agents."""
    keys: Mapping[str, str]
    """policy id -> parameter-server key."""
    obs_dims: Mapping[str, int]
    n_actions: Mapping[str, int]
    state_dim: int
    """Width of the environment's global state (PettingZoo `state()`)."""
    agent_ids: Mapping[str, int]
    """agent -> its index among all of the environment's agents (the `agent_id` column)."""
    action_masks: bool = False
    """The environment supplies legal-action masks: items carry them, actors and targets
    honour them."""
    obs_spaces: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """agent -> its observation space as JSON (`algos.torsos.space_json`), for torsos that
    read more than the width (empty: a flat vector of `obs_dims`)."""
    action_boxes: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict
    )
    """agent -> the flat (low, high) bounds of its `Box` action space, whose width is its
    `n_actions`; empty when the env's actions are `Discrete`."""

    @property
    def continuous(self) -> bool:
        """The group's agents act in `Box` spaces: float32 action vectors, a Gaussian actor."""
        return bool(self.action_boxes)

    @property
    def policies(self) -> list[str]:
        return sorted(set(self.policy_of.values()))

    def agents_of(self, policy: str) -> list[str]:
        return [a for a in self.agents if self.policy_of[a] == policy]

    @property
    def obs_dtype(self) -> str:
        """The dtype items keep observations in: `|u1` where every agent of the group observes
        a uint8 Box (images), else `<f4` (`items.spec.obs_dtype`)."""
        return obs_dtype(self.obs_spaces.get(a) for a in self.agents)

    def dims(self, policy: str) -> tuple[int, int]:
        """(observation width, action count or, for continuous actions, action width) of a
        policy's agents."""
        agent = self.agents_of(policy)[0]
        return self.obs_dims[agent], self.n_actions[agent]


@dataclass
class ActResult:
    """What an actor returns for a batch of observations."""

    actions: np.ndarray
    """int64 [B], or float32 [B, action_dim] for continuous actions (unclipped: the env
    adapter clips them to the space's bounds)."""
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    """Per-row values the algorithm's items record, e.g. `log_probs` for PPO."""
    recurrent_state: np.ndarray | None = None
    """The next recurrent state, for recurrent actors (None otherwise)."""


class Actor(Protocol):
    """The acting half of a policy: what collectors and evaluators hold. Owns its exploration."""

    spec: PolicySpec

    def set_weights(self, flat: np.ndarray) -> None: ...

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
        """Actions for `obs` [B, obs_dim]. `env_steps` is the job's global count (exploration
        schedules read it); `greedy` asks for the best action, as in evaluation;
        `action_mask` [B, n_actions] bool marks the legal actions; `agent_index` [B] is each
        row's agent index, for a spec with `agent_ids`."""
        ...


@dataclass
class UpdateResult:
    """What an update reports: statistics, and per-item priorities for prioritized replay."""

    stats: dict[str, float]
    priorities: np.ndarray | None = None


UpdateSteps = Generator[np.ndarray, np.ndarray, UpdateResult]
"""An update: yields local float32 vectors, receives each one averaged over the group."""


class Algorithm(ABC):
    """One training group's learning: pure, no MPI. The learner role drives `update`.

    `update(batch)` is a generator so that data-parallel learners stay nonblocking: the learner
    posts an allreduce of each yielded vector, keeps polling, and sends the average back in.
    Every member of a group yields the same number of vectors of the same sizes. DQN yields once
    per batch; PPO once for its value-normaliser moments, then epochs x minibatches gradients.
    """

    name = "algorithm"
    psro_oracle = False
    """Whether PSRO may train its new policies with this algorithm (`psro.enabled`): true only
    for an algorithm that learns online and whose actor, frozen, plays what it learned with no
    state carried between decisions (`epsilon_greedy` or `categorical`)."""
    continuous_actions = False
    """Whether it can act in `Box` action spaces (`GroupSpec.action_boxes`); an algorithm
    without it is refused a continuous-action env at start-up."""

    @abstractmethod
    def __init__(self, group: GroupSpec, job: Any, seed: int, device: str = "cpu") -> None:
        """Build the group's networks (seeded: every learner of a group starts alike)."""

    @classmethod
    @abstractmethod
    def item_spec(cls, group: GroupSpec, job: Any) -> ItemSpec:
        """The items this algorithm trains `group` on, under the whole job (`JobConfig`: the
        learner's keys, the collectors' fragment length, the replay settings)."""

    @classmethod
    @abstractmethod
    def policy_specs(cls, group: GroupSpec, job: Any) -> dict[str, PolicySpec]:
        """What the group publishes: policy key -> PolicySpec."""

    updates: int = 0
    """Completed updates (batches trained on)."""

    @abstractmethod
    def update(self, batch: Batch, weights: np.ndarray | None = None) -> UpdateSteps:
        """Train on one batch of items; `weights` are importance-sampling weights (or None)."""

    @abstractmethod
    def publish(self) -> dict[str, np.ndarray]:
        """Policy key -> fresh flat float32 vector of its acting network."""

    @abstractmethod
    def group_weights(self) -> np.ndarray:
        """Every network as one flat vector: what the learners of a group must hold alike."""

    @abstractmethod
    def load_group_weights(self, flat: np.ndarray) -> None: ...

    @abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume exactly, as plain numpy arrays."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...


def run_update(algo: Algorithm, batch: Batch, weights: np.ndarray | None = None) -> UpdateResult:
    """Drive one update in one process (a group of one): every average is the vector itself."""
    steps = algo.update(batch, weights)
    try:
        vector = next(steps)
        while True:
            vector = steps.send(vector)
    except StopIteration as done:
        return done.value
