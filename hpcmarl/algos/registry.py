"""From a `learner.algo` name to its implementation, and the checks that it fits the job.

The checks run on rank 0 at job start, so that a misfit (DQN on continuous actions, behaviour
cloning without a dataset, PPO offline) ends with one message naming the fix rather than an
exception deep inside a role.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

from hpcmarl.algos.catalog import AlgoDecl, own_keys, resolve_algorithm
from hpcmarl.algos.contract import Algorithm, GroupSpec, PolicySpec
from hpcmarl.errors import ConfigError, EnvError
from hpcmarl.items.spec import ItemSpec


def decl_of(name: str) -> AlgoDecl:
    """What `learner.algo = name` is (`catalog.resolve_algorithm`)."""
    return resolve_algorithm(name)


def algorithm_class(name: str) -> type[Algorithm]:
    """The implementation class of `learner.algo = name`."""
    module, _, cls = decl_of(name).impl.partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def item_spec(cfg: Any, group: GroupSpec) -> ItemSpec:
    """The items `cfg.learner.algo` trains `group` on (`cfg` is the whole `JobConfig`)."""
    return algorithm_class(cfg.learner.algo).item_spec(group, cfg)


def policy_specs(cfg: Any, group: GroupSpec) -> dict[str, PolicySpec]:
    """What `group` publishes under `cfg.learner.algo`: key -> PolicySpec."""
    return algorithm_class(cfg.learner.algo).policy_specs(group, cfg)


def check_fits(
    algo_name: str, action_space: gymnasium.Space, psro: bool = False, offline: bool = False
) -> None:
    """Raise `EnvError` when `algo_name` cannot act in `action_space`: every algorithm takes
    `Discrete` actions, only those declaring `continuous_actions` (PPO) take a `Box`, and
    PSRO's meta-game (`psro`) is over discrete actions whatever trains it. An `offline` job
    cannot turn to PPO, which learns online: its fix says so."""
    decl = decl_of(algo_name)
    name = algo_name if decl.plugin else algo_name.upper()
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return
    if isinstance(action_space, gymnasium.spaces.Box):
        if not decl.continuous_actions:
            raise EnvError(
                f"{name} needs a Discrete action space, the environment has continuous actions "
                f"{action_space}",
                "offline training (learner.algo=bc or dqn) takes Discrete actions only: train "
                "this env online with learner.algo=ppo"
                if offline
                else "use learner.algo=ppo (or ippo/mappo), which trains a Gaussian policy on "
                "Box actions",
            )
        if psro:
            raise EnvError(
                f"PSRO needs Discrete action spaces, the environment has {action_space}",
                "drop psro.enabled, or pick a game with discrete actions (e.g. kuhn_poker)",
            )
        return
    raise EnvError(
        f"{name} needs a Discrete action space, the environment has {action_space}",
        "pick an environment with discrete actions (e.g. CartPole-v1, mpe2.simple_spread_v3 "
        "with continuous_actions=False), or discretise the actions with a wrapper",
    )


def check_job(cfg: Any, groups: dict[str, list[str]]) -> None:
    """Refuse an algorithm that cannot train this job's groups or data source."""
    decl = decl_of(cfg.learner.algo)
    offline = bool(cfg.offline.dataset)
    if decl.offline_only and not offline:
        raise ConfigError(
            f"learner.algo = {decl.name} imitates a dataset, and the job has no offline.dataset",
            "set offline.dataset=RUN_DIR_OR_FILE, or use learner.algo=dqn",
        )
    if decl.on_policy and offline:
        raise ConfigError(
            f"learner.algo = {decl.name} learns on-policy, from its own fresh experience; "
            "offline.dataset holds old data",
            "use learner.algo=dqn or bc for offline training, or drop offline.dataset",
        )
    n_step = getattr(own_keys(cfg.learner), "n_step", 1) if offline else 1
    if decl.items == "transition" and n_step > 1:
        key = f"learner.{decl.section}.n_step"
        raise ConfigError(
            f"{key} = {n_step}: n-step transitions are built by collectors, and "
            "offline.dataset holds one-step transitions",
            f"drop {key} (1) for offline training",
        )
    if offline and decl.items != "transition":
        raise ConfigError(
            f"learner.algo = {decl.name} trains on {decl.items}s of a team, and "
            "offline.dataset holds per-agent transitions",
            "use learner.algo=dqn or bc for offline training, or drop offline.dataset",
        )
    if not decl.on_policy:
        several = {g: p for g, p in groups.items() if len(p) > 1}
        if several:
            group, policies = next(iter(several.items()))
            raise ConfigError(
                f"learner.algo = {decl.name} trains one policy per group; group {group!r} "
                f"holds {policies}",
                "leave agents.groups empty (one group per policy), or map the team's agents "
                "to one shared policy",
            )
