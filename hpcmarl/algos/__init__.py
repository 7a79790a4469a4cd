"""Algorithms by name, and the check that an algorithm fits an environment's action space.

The check runs at job start so that a mismatch (DQN on a continuous action space) ends with one
message naming the fix, rather than an exception deep inside a collector.
"""

from __future__ import annotations

import gymnasium

from hpcmarl.algos.base import NetworkAlgorithm
from hpcmarl.algos.bc import BehaviourCloning
from hpcmarl.algos.dqn import DQN, QActor
from hpcmarl.algos.mapping import check_policy_spaces, policies_of, resolve_mapping
from hpcmarl.errors import ConfigError, EnvError

ALGORITHMS: dict[str, type[NetworkAlgorithm]] = {"dqn": DQN, "bc": BehaviourCloning}
"""Learner algorithm classes by the `learner.algo` name of a job."""

ACTORS: dict[str, type[QActor]] = {"dqn": QActor, "bc": QActor}
"""The acting half of each algorithm, what collectors and evaluators hold."""


def check_fits(algo_name: str, action_space: gymnasium.Space) -> None:
    """Raise `EnvError` when `algo_name` cannot act in `action_space` (and `ConfigError` for an
    unknown algorithm)."""
    if algo_name not in ALGORITHMS:
        raise ConfigError(
            f"learner.algo is {algo_name!r}, which is not an algorithm",
            f"use one of {sorted(ALGORITHMS)}",
        )
    if not isinstance(action_space, gymnasium.spaces.Discrete):
        raise EnvError(
            f"{algo_name.upper()} needs a Discrete action space, the environment has "
            f"{action_space}",
            "pick an environment with discrete actions (e.g. CartPole-v1, mpe2.simple_spread_v3 "
            "with continuous_actions=False), or discretise the actions with a wrapper",
        )


__all__ = [
    "ACTORS",
    "ALGORITHMS",
    "DQN",
    "BehaviourCloning",
    "NetworkAlgorithm",
    "QActor",
    "check_fits",
    "check_policy_spaces",
    "policies_of",
    "resolve_mapping",
]
