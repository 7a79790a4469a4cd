"""The allowed values of every constrained job key, one entry per key, in words a user reads.

`RULES` holds a check per key (its limit printed by `--explain` and quoted in errors); `ORDERED`
holds the checks that relate two keys. `validate` applies both after the types are right.
"""

from __future__ import annotations

from typing import Any

from hpcmarl.algos.catalog import CATALOG, built_in_ordered, is_algorithm_name
from hpcmarl.config.schema import ENV_FAMILIES
from hpcmarl.limits import Rule, above, at_least, one_of, within
from hpcmarl.loggers import LOGGERS


def _is_name(value: str) -> bool:
    return bool(value) and "/" not in value


def _is_mapping(value: Any) -> bool:
    if isinstance(value, dict):
        return all(
            isinstance(k, str) and isinstance(p, str) and _is_name(p) for k, p in value.items()
        )
    return value in ("shared", "independent")


NAME = Rule(
    _is_name,
    "must be non-empty and contain no '/'",
    "a non-empty name without '/'",
    problem="is not a valid name",
)
MAPPING = Rule(
    _is_mapping,
    "must be shared, independent or a mapping {agent_id: policy_id} of "
    "strings (policy ids without '/')",
    "shared, independent or a mapping such as {{agent_0: p0, agent_1: p1}}",
    problem="is not a valid agent mapping",
    example=False,
)


def _is_groups(value: dict) -> bool:
    return all(
        isinstance(members, list) and members and all(isinstance(p, str) for p in members)
        for members in value.values()
    ) and all(_is_name(g) for g in value)


GROUPS = Rule(
    _is_groups,
    "must map group names (no '/') to non-empty lists of policy ids",
    "a mapping such as {{team: [p0, p1]}}, or {{}} for one group per policy",
    problem="is not a valid group mapping",
    example=False,
)
WIDTHS = Rule(
    lambda v: all(w >= 1 for w in v),
    "every width must be >= 1",
    "a list of positive integers",
    bounds=(1,),
)

LOGGER_NAMES = Rule(
    lambda v: set(v) <= set(LOGGERS) and len(set(v)) == len(v),
    f"each must be one of {', '.join(LOGGERS)}, named once",
    f"a list of {', '.join(LOGGERS)} (or [] for none), such as [tensorboard, wandb]",
    problem="names an unknown logger or one twice",
    example=False,
)

RULES: dict[str, Rule] = {
    "name": NAME,
    "seed": within(0, 2**32 - 1),
    "env.kind": one_of(*ENV_FAMILIES),
    "env.id": Rule(bool, "must be non-empty", "an environment id", problem="is empty"),
    "env.num_envs": at_least(1),
    "agents.mapping": MAPPING,
    "agents.strategy_spec_id": NAME,
    "agents.groups": GROUPS,
    "learner.algo": Rule(
        is_algorithm_name,
        f"must be one of {', '.join(CATALOG)}, module:Class, or an hpcmarl.algorithms entry point",
        f"one of {', '.join(CATALOG)}, or module:Class of your own algorithm",
        problem="is not an algorithm",
        example=False,
    ),
    "learner.lr": above(0),
    "learner.gamma": within(0, 1, open_low=True),
    "learner.batch_size": at_least(1),
    "learner.hidden_sizes": WIDTHS,
    "learner.model.torso": Rule(
        bool, "must be non-empty", "mlp, cnn or module:function", problem="is empty"
    ),
    "learner.grad_clip": at_least(0),
    "replay.sequence_length": at_least(2),
    "replay.burn_in": at_least(0),
    "replay.sequence_overlap": at_least(0),
    "learner.push_interval": at_least(1),
    "learner.updates_per_task": at_least(1),
    "learner.allreduce": one_of("auto", "mpi", "horovod", "torch"),
    "learner.device": one_of("auto", "cpu", "cuda"),
    "replay.table_capacity": at_least(1),
    "replay.learning_starts": at_least(0),
    "replay.alpha": at_least(0),
    "replay.beta": within(0, 1),
    "replay.eps": above(0),
    "replay.samples_per_insert": at_least(0),
    "replay.error_buffer": above(0),
    "replay.insert_credits": at_least(1),
    "replay.stack_num": at_least(1),
    "collector.fragment_length": at_least(1),
    "collector.fragments_per_task": at_least(1),
    "collector.weight_sync_fragments": at_least(1),
    "commander.max_env_steps": at_least(1),
    "commander.max_wall_time_s": at_least(0),
    "commander.eval_interval_s": above(0),
    "commander.eval_episodes": at_least(1),
    "commander.eval_max_episode_steps": Rule(
        lambda v: v is None or v >= 1,
        "must be >= 1 or null",
        "a positive integer or null",
        bounds=(1,),
    ),
    "commander.stop_evals": at_least(1),
    "commander.collector_task_space": at_least(0),
    "commander.progress_interval_s": above(0),
    "topology.param_servers": at_least(1),
    "topology.replay_shards": at_least(1),
    "topology.learners": at_least(1),
    "topology.collectors": Rule(
        lambda v: v == "auto" or v >= 1,
        'must be "auto" or >= 1',
        "auto or an integer >= 1",
        bounds=(1,),
    ),
    "commander.max_updates": at_least(0),
    "commander.eval_every_rounds": at_least(1),
    "replay_log.flush_every_fragments": at_least(1),
    "learner.drift_check_interval": at_least(0),
    "checkpoint.interval_s": at_least(0),
    "checkpoint.every_updates": at_least(0),
    "checkpoint.keep": at_least(1),
    "checkpoint.timeout_s": Rule(
        lambda v: v >= 10,
        "must be >= 10 (a healthy job's checkpoint waits seconds for the tasks in flight)",
        "{a_noun} of at least 10",
        bounds=(10,),
    ),
    "runtime.heartbeat_interval_s": above(0),
    "runtime.heartbeat_timeout_s": above(0),
    "runtime.stall_timeout_s": Rule(
        lambda v: v is None or v >= 30,
        "must be >= 30 or null (a large job makes no env step for tens of seconds as it starts)",
        "null or a number of at least 30",
        bounds=(30,),
    ),
    "runtime.torch_threads": at_least(1),
    "runtime.idle_sleep_max_s": at_least(0),
    "runtime.idle_wait_s": at_least(0),
    "runtime.shutdown_timeout_s": above(0),
    "runtime.loggers": LOGGER_NAMES,
    "psro.iterations": at_least(0),
    "psro.steps_per_iteration": at_least(1),
    "psro.updates_per_iteration": at_least(1),
    "psro.meta_solver": one_of("nash", "uniform", "prd"),
    "psro.eval_episodes": at_least(2),
    "psro.stop_exploitability": Rule(
        lambda v: v is None or v >= 0,
        "must be >= 0 or null",
        "a non-negative number or null",
        bounds=(0,),
    ),
}

RULES.update(
    (f"learner.{decl.section}.{key}", rule)
    for decl in CATALOG.values()
    if decl.section
    for key, rule in decl.rules.items()
)
"""Each built-in algorithm's rules, kept beside its code (`algos/<name>_config.py`)."""

ORDERED: tuple[tuple[str, str, str], ...] = (
    ("replay.learning_starts", "replay.table_capacity", "a table that never fills never serves"),
    ("learner.batch_size", "replay.table_capacity", "a batch cannot exceed what a table holds"),
    (
        "runtime.heartbeat_interval_s",
        "runtime.heartbeat_timeout_s",
        "a timeout shorter than the heartbeat interval aborts healthy jobs",
    ),
    *built_in_ordered(),
)
"""(smaller, larger, why): pairs of keys where the first must not exceed the second: the shared
keys', then each built-in algorithm's, declared beside its code (`ORDERED` of
`algos/<name>_config.py`), in catalog order. A plugin's pairs are checked with its section
(`validate.build_job`)."""


def rule_texts() -> dict[str, str]:
    """Each constrained key's limit in words, for `--explain`."""
    return {path: rule.text for path, rule in RULES.items()}
