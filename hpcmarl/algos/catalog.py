"""The algorithm registry: every algorithm a job can name, declared once, with its own keys.

Each entry says where the algorithm lives, which `learner.<section>` holds its settings (the
dataclass and rules of its `<module>_config.py`, beside its code), whether it learns on-policy
(fragments through FIFO queues) or off-policy (replay), and presets: other names for it with
some of its keys fixed (`mappo` is PPO with a centralised critic). Validation,
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
from types import ModuleType
from typing import Any, TypeVar

from hpcmarl.algos import bc_config, dqn_config, ppo_config, r2d2_config, value_decomposition_config
from hpcmarl.errors import ConfigError

ENTRY_POINT_GROUP = "hpcmarl.algorithms"
"""The entry-point group in which an installed package names its algorithms."""

Keys = TypeVar("Keys")


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
    """key of its section -> `limits.Rule`: the limits of its keys."""
    ordered: tuple[tuple[str, str, str], ...] = ()
    """(smaller, larger, why): keys of its section where the first must not exceed the second
    (`eps_end <= eps_start`), checked by validation and listed by `--explain`."""
    psro_oracle: bool = False
    """It can be PSRO's best-response oracle (`psro.checks`): it trains online, and its actor,
    frozen, plays the policy it learned without a state carried between decisions (a
    feed-forward `epsilon_greedy` or `categorical` actor)."""
    continuous_actions: bool = False
    """It can act in `Box` action spaces (PPO's Gaussian actor); the others need `Discrete`."""

    @property
    def plugin(self) -> bool:
        """Named by `module:Class` or an entry point, outside the catalog."""
        return self.name not in CATALOG


def _built_in(name: str, summary: str, declared: ModuleType, **preset: Any) -> AlgoDecl:
    """A built-in algorithm as its `<module>_config.py` declares it (the attributes a plugin
    class declares, in capitals); `preset` fixes keys of its section."""
    return AlgoDecl(
        name,
        summary,
        declared.IMPL,
        getattr(declared, "SECTION", None),
        on_policy=getattr(declared, "ON_POLICY", False),
        items=getattr(declared, "ITEMS", "transition"),
        offline_only=getattr(declared, "OFFLINE_ONLY", False),
        preset=preset,
        config=getattr(declared, "CONFIG", None),
        rules=getattr(declared, "RULES", {}),
        ordered=tuple(getattr(declared, "ORDERED", ())),
        psro_oracle=getattr(declared, "PSRO_ORACLE", False),
        continuous_actions=getattr(declared, "CONTINUOUS_ACTIONS", False),
    )


CATALOG: dict[str, AlgoDecl] = {
    decl.name: decl
    for decl in (
        _built_in("dqn", "deep Q-learning (off-policy, replay)", dqn_config),
        _built_in("bc", "behaviour cloning of a dataset's actions (offline only)", bc_config),
        _built_in("ppo", "PPO with the critic learner.ppo.critic chooses (on-policy)", ppo_config),
        _built_in(
            "mappo",
            "PPO with a centralised critic on the global state",
            ppo_config,
            critic="central",
        ),
        _built_in(
            "ippo",
            "PPO with each agent's critic on its own observation",
            ppo_config,
            critic="local",
        ),
        _built_in(
            "qmix",
            "QMIX: recurrent agents, a monotonic mixer on the global state (episodes, replay)",
            value_decomposition_config,
        ),
        _built_in(
            "r2d2",
            "recurrent DQN on sequences with burn-in, n-step targets (prioritized replay)",
            r2d2_config,
        ),
        _built_in(
            "vdn",
            "VDN: recurrent agents whose Q-values add up (episodes, replay)",
            value_decomposition_config,
            mixer="vdn",
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


def sections() -> dict[str, tuple[type, str]]:
    """`learner.<section>` -> (its dataclass, its one-line help) of every built-in algorithm
    with keys of its own, in catalog order: the fields `config.schema.LearnerConfig` gets, so
    that a job may hold any of them whichever algorithm it names (a saved `config.yaml` holds
    them all). A plugin's section is read with its algorithm (`config.validate.build_job`)."""
    users: dict[str, list[str]] = {}
    configs: dict[str, type] = {}
    for decl in CATALOG.values():
        if decl.section is not None and decl.config is not None:
            users.setdefault(decl.section, []).append(decl.name)
            configs[decl.section] = decl.config
    return {
        section: (configs[section], f"The keys of learner.algo {' / '.join(names)}.")
        for section, names in users.items()
    }


def ordered_pairs(decl: AlgoDecl) -> list[tuple[str, str, str]]:
    """An algorithm's pairs of keys that must not exceed one another, as job paths
    (`learner.<section>.KEY`)."""
    path = f"learner.{decl.section}"
    return [(f"{path}.{small}", f"{path}.{large}", why) for small, large, why in decl.ordered]


def built_in_ordered() -> list[tuple[str, str, str]]:
    """The pairs of every built-in section, each once, in catalog order: every job holds every
    built-in section (`sections`), so each is checked whichever algorithm the job names."""
    pairs: dict[tuple[str, str, str], None] = {}
    for decl in CATALOG.values():
        if decl.section is not None:
            pairs.update(dict.fromkeys(ordered_pairs(decl)))
    return list(pairs)


def keys_of(learner: Any, config: type[Keys]) -> Keys:
    """The job's section (`learner.<section>`) that holds a `config`: an algorithm's code reads
    its keys by their class, never by a section name, which only the catalog (or a plugin's
    declaration) says. Every built-in section is in every job, so DQN's keys are there when PPO
    runs; a plugin's is where validation (or the caller) put it."""
    for keys in vars(learner).values():  # the schema's fields first, then a plugin's section
        if isinstance(keys, config):
            return keys
    raise LookupError(f"the job has no section of {config.__name__} (learner.algo {learner.algo})")


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
    `config`, `section`, `summary`, `on_policy`, `items`, `rules`, `ordered`, `offline_only`,
    `psro_oracle`)."""
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
    ordered = _ordered_of(name, attr, getattr(cls, "ordered", ()), fields)
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
        ordered=ordered,
        psro_oracle=bool(getattr(cls, "psro_oracle", False)),
        continuous_actions=bool(getattr(cls, "continuous_actions", False)),
    )


def _ordered_of(
    name: str, attr: str, declared: Any, fields: set[str]
) -> tuple[tuple[str, str, str], ...]:
    """A plugin's `ordered` pairs, checked when its class is read so that a wrong declaration
    is one line at start-up, not an error in the middle of validation."""
    fix = "set the class attribute ordered to (smaller_key, larger_key, why) triples of its keys"
    triples = isinstance(declared, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 3 and all(isinstance(s, str) for s in p)
        for p in declared
    )
    if not triples:
        raise ConfigError(
            f"learner.algo = {name}: {attr}.ordered is {declared!r:.60}, not (smaller, larger, "
            "why) triples",
            fix,
        )
    unknown = sorted({key for p in declared for key in p[:2]} - fields)
    if unknown:
        raise ConfigError(
            f"learner.algo = {name}: {attr}.ordered names {unknown}, not keys of its config", fix
        )
    return tuple((small, large, why) for small, large, why in declared)
