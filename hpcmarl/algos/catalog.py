"""The algorithm registry: every algorithm a job can name, declared once, with its own keys.

Each entry says where the algorithm lives, which `learner.<section>` holds its settings, whether
it learns on-policy (fragments through FIFO queues) or off-policy (replay), and presets: other
names for it with some of its keys fixed (`mappo` is PPO with a centralised critic). Validation,
`--explain` and the allowed values of `learner.algo` all read this table; it imports no torch, so
reading a job stays fast. The implementations are imported by `algos.registry` when a role needs
them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcmarl.errors import ConfigError

ENTRY_POINT_GROUP = "hpcmarl.algorithms"
"""The entry-point group in which an installed package names its algorithms."""


@dataclass
class DQNConfig:
    """DQN's own keys (`learner.algo: dqn`): double-Q targets, Huber loss, a hard-copied target
    network, and epsilon-greedy exploration owned by its actor."""

    double_q: bool = True
    """Use double Q-learning targets (online net picks the action, target net scores it)."""
    huber_delta: float = 1.0
    """Huber loss threshold on the TD error."""
    target_network_update_freq: int = 100
    """Learner updates between hard copies of the online network into the target network."""
    target_tau: float = 0.0
    """Soft target updates: after every update the target moves this fraction of the way to
    the online network (Polyak averaging; 0.005 is usual); 0 keeps the hard copies."""
    eps_start: float = 1.0
    """Initial epsilon of the actor's epsilon-greedy schedule."""
    eps_end: float = 0.04
    """Final epsilon."""
    eps_decay_steps: int = 8_000
    """Global env steps over which epsilon decays linearly from eps_start to eps_end."""
    n_step: int = 1
    """Steps of reward each transition sums before it bootstraps (n-step returns, truncated
    at the episode's end); collectors build them, replay files keep one-step rows."""


@dataclass
class PPOConfig:
    """PPO's own keys (`learner.algo: ppo`, or the presets `mappo` and `ippo`): clipped
    surrogate, GAE(lambda), value normalisation, epochs x minibatches per batch, an entropy
    bonus; on-policy fragments served once from FIFO queues."""

    critic: str = "central"
    """`central`: the critic sees the environment's global state (MAPPO); `local`: each agent's
    critic sees only its own observation (IPPO)."""
    actor_agent_id: bool = False
    """Append a one-hot agent index (its place among the agents sharing its policy) to each
    actor's input, so agents that share parameters can still act differently."""
    critic_agent_id: bool = True
    """Append a one-hot agent index to the critic's input, so a shared critic can tell agents
    with different rewards apart."""
    critic_heads: bool = False
    """With the central critic: one pass per env step on the global state, with a value head
    per agent, in place of one pass per agent with its one-hot index (`critic_agent_id`). The
    same inputs, so the same values can be learned, at 1/agents of the critic's compute."""
    batch_fragments: int = 32
    """Fragments (collector.fragment_length steps of one env copy, every agent of the group)
    per update, over all learners of the group; env steps per update = this x fragment_length."""
    epochs: int = 10
    """Passes over each batch."""
    minibatches: int = 1
    """Minibatches per epoch (each one optimizer step)."""
    clip: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    value_clip: float = 0.2
    """Clip range of the value change in the value loss; 0 disables value clipping."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte Carlo."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    value_coef: float = 1.0
    """Weight of the value loss."""
    value_huber_delta: float = 10.0
    """Huber threshold of the value loss (on normalised returns); 0 means squared error."""
    value_norm: bool = True
    """Train the critic on normalised returns (running mean and variance of the targets)."""
    normalize_advantages: bool = True
    """Standardise advantages over each batch."""
    activation: str = "tanh"
    """Hidden activation of actor and critic: `tanh` or `relu`."""
    max_policy_lag: int = 1
    """Versions a fragment may be older than the policy it trains: collectors run ahead of the
    learners by at most this many updates, and older fragments are dropped (and counted)."""


@dataclass
class QMIXConfig:
    """Value decomposition's own keys (`learner.algo: qmix`, or the preset `vdn`): a team of
    recurrent agents with shared parameters trained through a mixer of their Q-values, on whole
    episodes from replay (Rashid et al. 2018; Sunehag et al. 2018; EPyMARL's defaults)."""

    mixer: str = "qmix"
    """`qmix`: a monotonic hypernetwork over the global state mixes the agents' Q-values;
    `vdn`: their sum."""
    rnn_hidden: int = 64
    """Width of each agent network's GRU (and of the layer before it)."""
    agent_id: bool = True
    """Append a one-hot agent index to each agent's observation, so agents that share
    parameters can still act differently."""
    mixing_embed: int = 32
    """QMIX: width of the mixing network's hidden layer."""
    hypernet_embed: int = 64
    """QMIX: width of the hidden layer of the hypernetworks that make the mixing weights."""
    double_q: bool = True
    """The online agents pick the next actions, the target agents score them."""
    standardize_rewards: bool = True
    """Train on the team reward less its running mean, over its running standard deviation
    (EPyMARL's default): Q-values stay near 0 and of unit scale whatever the env's reward
    units, which is where the mixing network's ELU and its initial weights work as designed.
    Centring also changes what ending an episode early is worth; set false where episodes end
    by termination and that matters."""
    td_lambda: float = 0.0
    """TD(lambda) targets over the episode (0: one-step targets)."""
    bootstrap_truncated: bool = True
    """A truncated episode's last step bootstraps from the state after it, as a time limit the
    agents cannot see should; false ends the team's return there, as EPyMARL does (its runner
    treats a time limit as the episode's end): a finite horizon, which keeps QMIX's mixer from
    compounding its own overestimates through the bootstrap on tasks that only ever end by a
    time limit (measured on simple_spread: with the bootstrap, Q_tot climbed to 80 against
    true values near 6 and the team return fell back)."""
    target_network_update_freq: int = 200
    """Updates between hard copies of the agents and the mixer into their targets."""
    target_tau: float = 0.0
    """Soft target updates: after every update the target moves this fraction of the way to
    the online network (Polyak averaging; 0.005 is usual); 0 keeps the hard copies."""
    episode_limit: int = 25
    """Steps per episode item (T_max): shorter episodes are padded (the `filled` mask marks
    their steps), a longer one goes on in the next item."""
    eps_start: float = 1.0
    """Initial epsilon of the agents' epsilon-greedy schedule."""
    eps_end: float = 0.05
    """Final epsilon."""
    eps_decay_steps: int = 50_000
    """Global env steps over which epsilon decays linearly from eps_start to eps_end."""


@dataclass
class R2D2Config:
    """Recurrent DQN's own keys (`learner.algo: r2d2`; Kapturowski et al. 2019): a GRU
    Q-network trained on sequences from prioritized replay (`replay.sequence_length`,
    `replay.burn_in`, `replay.sequence_overlap`, `replay.zero_init_states`), n-step double-Q
    targets under value rescaling, priorities per sequence."""

    rnn_hidden: int = 64
    """Width of the GRU (and of the layer before it)."""
    n_step: int = 3
    """Steps of reward each target sums before it bootstraps (cut at the sequence's and the
    episode's end)."""
    priority_eta: float = 0.9
    """A sequence's priority: eta max_t |delta_t| + (1 - eta) mean_t |delta_t|."""
    value_rescaling: bool = True
    """Learn h(Q) with h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, which keeps targets of long
    episodes in a small range."""
    double_q: bool = True
    """The online network picks the next action, the target network scores it."""
    target_network_update_freq: int = 200
    """Updates between hard copies of the online network into the target network."""
    target_tau: float = 0.0
    """Soft target updates: after every update the target moves this fraction of the way to
    the online network (Polyak averaging; 0.005 is usual); 0 keeps the hard copies."""
    eps_start: float = 1.0
    """Initial epsilon of the actor's epsilon-greedy schedule."""
    eps_end: float = 0.02
    """Final epsilon."""
    eps_decay_steps: int = 20_000
    """Global env steps over which epsilon decays linearly from eps_start to eps_end."""


@dataclass(frozen=True)
class AlgoDecl:
    """One algorithm a job can name in `learner.algo`."""

    name: str
    summary: str
    impl: str
    """`module:Class` of the implementation (an `algos.contract.Algorithm`)."""
    section: str | None
    """The `learner.<section>` that holds its own keys, if any."""
    on_policy: bool = False
    items: str = "transition"
    """The kind of item it trains on (`items.spec.ITEM_KINDS`); offline datasets hold
    transitions."""
    offline_only: bool = False
    """It learns only from a dataset (`offline.dataset`)."""
    preset: dict[str, Any] = field(default_factory=dict)
    """Keys of its section this name fixes."""
    config: type | None = None
    """The dataclass of `learner.<section>`: its keys, defaults and docstrings."""
    rules: Mapping[str, Any] = field(default_factory=dict)
    """key of its section -> `config.rules.Rule`, for a plugin (the built-in sections' rules
    are in `config.rules.RULES`)."""

    @property
    def plugin(self) -> bool:
        """Named by `module:Class` or an entry point, outside the catalog."""
        return self.name not in CATALOG


CATALOG: dict[str, AlgoDecl] = {
    decl.name: decl
    for decl in (
        AlgoDecl(
            "dqn",
            "deep Q-learning (off-policy, replay)",
            "hpcmarl.algos.dqn:DQN",
            "dqn",
            config=DQNConfig,
        ),
        AlgoDecl(
            "bc",
            "behaviour cloning of a dataset's actions (offline only)",
            "hpcmarl.algos.bc:BehaviourCloning",
            None,
            offline_only=True,
        ),
        AlgoDecl(
            "ppo",
            "PPO with the critic learner.ppo.critic chooses (on-policy)",
            "hpcmarl.algos.ppo:PPO",
            "ppo",
            config=PPOConfig,
            on_policy=True,
            items="fragment",
        ),
        AlgoDecl(
            "mappo",
            "PPO with a centralised critic on the global state",
            "hpcmarl.algos.ppo:PPO",
            "ppo",
            config=PPOConfig,
            on_policy=True,
            items="fragment",
            preset={"critic": "central"},
        ),
        AlgoDecl(
            "ippo",
            "PPO with each agent's critic on its own observation",
            "hpcmarl.algos.ppo:PPO",
            "ppo",
            config=PPOConfig,
            on_policy=True,
            items="fragment",
            preset={"critic": "local"},
        ),
        AlgoDecl(
            "qmix",
            "QMIX: recurrent agents, a monotonic mixer on the global state (episodes, replay)",
            "hpcmarl.algos.value_decomposition:ValueDecomposition",
            "qmix",
            config=QMIXConfig,
            items="episode",
        ),
        AlgoDecl(
            "r2d2",
            "recurrent DQN on sequences with burn-in, n-step targets (prioritized replay)",
            "hpcmarl.algos.r2d2:R2D2",
            "r2d2",
            config=R2D2Config,
            items="sequence",
        ),
        AlgoDecl(
            "vdn",
            "VDN: recurrent agents whose Q-values add up (episodes, replay)",
            "hpcmarl.algos.value_decomposition:ValueDecomposition",
            "qmix",
            config=QMIXConfig,
            items="episode",
            preset={"mixer": "vdn"},
        ),
    )
}
"""Every algorithm by its `learner.algo` name."""


def describe() -> str:
    """The registry as text for `--explain`: each name, what it is, and where its keys are."""
    lines = ["Algorithms (learner.algo):"]
    for decl in CATALOG.values():
        keys = f"keys in learner.{decl.section}" if decl.section else "no keys of its own"
        preset = ", ".join(f"{k}={v}" for k, v in decl.preset.items())
        lines.append(
            f"  {decl.name:<6} {decl.summary}; {keys}" + (f" (fixes {preset})" if preset else "")
        )
    lines += [
        f"  {name:<6} installed: an entry point of the {ENTRY_POINT_GROUP} group"
        for name in plugin_names()
    ]
    lines.append(
        "  module:Class  your own algorithm, a subclass of hpcmarl.algos.contract.Algorithm; "
        "--explain module:Class lists its keys"
    )
    return "\n".join(lines)


def own_keys(learner: Any) -> Any:
    """The job's algorithm's own section (`learner.<section>`), or None where it has none."""
    decl = resolve_algorithm(learner.algo)
    return getattr(learner, decl.section) if decl.section else None


def on_policy_window(learner: Any) -> tuple[int, int]:
    """(fragments per update, versions a fragment may lag) of an on-policy algorithm: the
    `batch_fragments` and `max_policy_lag` keys its section must have."""
    keys = own_keys(learner)
    return int(keys.batch_fragments), int(keys.max_policy_lag)


def plugin_names() -> tuple[str, ...]:
    """The algorithms installed packages name in the `hpcmarl.algorithms` entry-point group."""
    return tuple(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def is_algorithm_name(name: str) -> bool:
    """A catalog name, `module:Class`, or an installed entry point (resolved later)."""
    return name in CATALOG or ":" in name or name in plugin_names()


@functools.cache
def resolve_algorithm(name: str) -> AlgoDecl:
    """What `learner.algo = name` is: the one place every role, check and validation asks.

    A catalog name is its entry; `module:Class` or an entry point of `hpcmarl.algorithms` is
    imported and described by the class itself (`algos.contract.Algorithm`'s class attributes
    `config`, `section`, `summary`, `on_policy`, `items`, `rules`, `offline_only`)."""
    if name in CATALOG:
        return CATALOG[name]
    if ":" in name:
        return _plugin_decl(name, name)
    entry = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if name in entry:
        return _plugin_decl(name, entry[name])
    raise ConfigError(
        f"learner.algo is {name!r}, which is not an algorithm",
        f"use one of {sorted(CATALOG)}, module:Class of your own algorithm, or an entry point "
        f"in the {ENTRY_POINT_GROUP} group",
    )


def _plugin_decl(name: str, target: str) -> AlgoDecl:
    """The declaration a user's algorithm class makes of itself."""
    from hpcmarl.algos.contract import Algorithm  # numpy only: reading a job stays light
    from hpcmarl.items.spec import ITEM_KINDS

    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of a user's module is one line
        raise ConfigError(
            f"learner.algo = {name}: module {module_name!r} cannot be imported "
            f"({type(err).__name__}: {err})",
            "put the module on PYTHONPATH (or install its package) and fix the error above",
        ) from None
    cls = getattr(module, attr, None)
    if not (inspect.isclass(cls) and issubclass(cls, Algorithm)):
        if cls is None:
            what = "has no such name"
        elif inspect.isclass(cls):
            what = "is a class that does not subclass hpcmarl.algos.contract.Algorithm"
        else:
            what = f"holds a {type(cls).__name__}"
        raise ConfigError(
            f"learner.algo = {name}: {module_name}.{attr} {what}",
            "name a subclass of hpcmarl.algos.contract.Algorithm (or of "
            "hpcmarl.algos.base.NetworkAlgorithm) as module:Class",
        )
    config: Any = getattr(cls, "config", None)
    section = getattr(cls, "section", None) or cls.name
    if config is not None and not (inspect.isclass(config) and dataclasses.is_dataclass(config)):
        raise ConfigError(
            f"learner.algo = {name}: {attr}.config is {config!r:.60}, not a dataclass",
            "set the class attribute config to a @dataclass of your algorithm's keys, or None",
        )
    items = getattr(cls, "items", "transition")
    if items not in ITEM_KINDS:
        raise ConfigError(
            f"learner.algo = {name}: {attr}.items is {items!r}, not an item kind",
            f"set the class attribute items to one of {', '.join(ITEM_KINDS)}",
        )
    needed = {"batch_fragments", "max_policy_lag"}
    fields = {f.name for f in dataclasses.fields(config)} if config is not None else set()
    if getattr(cls, "on_policy", False) and not needed <= fields:
        raise ConfigError(
            f"learner.algo = {name}: an on-policy algorithm's config needs the keys "
            f"{sorted(needed)}, which the scheduler reads; {attr}.config lacks "
            f"{sorted(needed - fields)}",
            "add batch_fragments: int (fragments per update) and max_policy_lag: int to it",
        )
    doc = (inspect.getdoc(cls) or attr).split("\n")[0]
    return AlgoDecl(
        name=name,
        summary=getattr(cls, "summary", doc),
        impl=target,
        section=section if config is not None else None,
        on_policy=bool(getattr(cls, "on_policy", False)),
        items=items,
        offline_only=bool(getattr(cls, "offline_only", False)),
        config=config,
        rules=dict(getattr(cls, "rules", {})),
    )
