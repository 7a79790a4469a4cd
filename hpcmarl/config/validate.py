"""Turn plain data into a `JobConfig`, or say which key is wrong, what it holds and how to fix it.

Types come from the schema's annotations, so a new field is type-checked the day it is added;
allowed values come from `RULES`, one entry per key, so the limits of a job are read in one place
(and printed by `--explain`). Checks that relate two keys are in `ORDERED`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from hpcmarl.config.docs import EXPLAIN_HINT, default_of, show, unknown_key_fix
from hpcmarl.config.schema import JobConfig
from hpcmarl.errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """An allowed-value check on one key, with the words that explain it to the user.

    `advice` completes "set KEY to ..."; `{noun}` / `{a_noun}` become "integer" / "an integer"
    or "number" / "a number" after the key's type.
    """

    ok: Callable[[Any], bool]
    text: str
    advice: str
    problem: str = "is out of range"
    example: bool = True

    def fix(self, path: str, noun: str, example: Any) -> str:
        article = "an" if noun[0] in "aeiou" else "a"
        advice = self.advice.format(noun=noun, a_noun=f"{article} {noun}")
        return f"set {path} to {advice}" + (f" such as {show(example)}" if self.example else "")


def above(lo: float) -> Rule:
    advice = "a positive {noun}" if lo == 0 else "{a_noun} above " + str(lo)
    return Rule(lambda v: v > lo, f"must be > {lo}", advice)


def at_least(lo: float) -> Rule:
    advice = "a non-negative {noun}" if lo == 0 else "{a_noun} of at least " + str(lo)
    return Rule(lambda v: v >= lo, f"must be >= {lo}", advice)


def within(lo: float, hi: float, open_low: bool = False) -> Rule:
    low, left = (above(lo), "(") if open_low else (at_least(lo), "[")
    return Rule(
        lambda v: low.ok(v) and v <= hi,
        f"{low.text} and <= {hi}",
        f"{{a_noun}} in {left}{lo}, {hi}]",
    )


def one_of(*choices: str) -> Rule:
    listed = ", ".join(choices)
    return Rule(
        lambda v: v in choices,
        f"must be one of {listed}",
        f"one of {listed}",
        problem="is not a valid choice",
        example=False,
    )


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
WIDTHS = Rule(
    lambda v: all(w >= 1 for w in v), "every width must be >= 1", "a list of positive integers"
)

RULES: dict[str, Rule] = {
    "name": NAME,
    "seed": within(0, 2**32 - 1),
    "env.kind": one_of("gymnasium", "pettingzoo"),
    "env.id": Rule(bool, "must be non-empty", "an environment id", problem="is empty"),
    "env.num_envs": at_least(1),
    "agents.mapping": MAPPING,
    "agents.strategy_spec_id": NAME,
    "learner.algo": one_of("dqn", "bc"),
    "learner.lr": above(0),
    "learner.gamma": within(0, 1, open_low=True),
    "learner.batch_size": at_least(1),
    "learner.hidden_sizes": WIDTHS,
    "learner.huber_delta": above(0),
    "learner.grad_clip": at_least(0),
    "learner.target_network_update_freq": at_least(1),
    "learner.push_interval": at_least(1),
    "learner.updates_per_task": at_least(1),
    "learner.allreduce": one_of("auto", "mpi", "horovod"),
    "replay.table_capacity": at_least(1),
    "replay.learning_starts": at_least(0),
    "replay.alpha": at_least(0),
    "replay.beta": within(0, 1),
    "replay.eps": above(0),
    "replay.samples_per_insert": at_least(0),
    "replay.error_buffer": above(0),
    "replay.insert_credits": at_least(1),
    "collector.fragment_length": at_least(1),
    "collector.fragments_per_task": at_least(1),
    "collector.eps_start": within(0, 1),
    "collector.eps_end": within(0, 1),
    "collector.eps_decay_steps": at_least(1),
    "collector.weight_sync_fragments": at_least(1),
    "commander.max_env_steps": at_least(1),
    "commander.max_wall_time_s": at_least(0),
    "commander.eval_interval_s": above(0),
    "commander.eval_episodes": at_least(1),
    "commander.collector_task_space": at_least(0),
    "commander.progress_interval_s": above(0),
    "topology.param_servers": at_least(1),
    "topology.replay_shards": at_least(1),
    "topology.learners": at_least(1),
    "topology.collectors": at_least(1),
    "commander.max_updates": at_least(0),
    "commander.eval_every_rounds": at_least(1),
    "replay_log.flush_every_fragments": at_least(1),
    "learner.drift_check_interval": at_least(0),
    "checkpoint.interval_s": at_least(0),
    "checkpoint.every_updates": at_least(0),
    "checkpoint.keep": at_least(1),
    "checkpoint.timeout_s": above(0),
    "runtime.heartbeat_interval_s": above(0),
    "runtime.heartbeat_timeout_s": above(0),
    "runtime.torch_threads": at_least(1),
    "runtime.idle_sleep_max_s": at_least(0),
    "runtime.shutdown_timeout_s": above(0),
}

ORDERED: tuple[tuple[str, str, str], ...] = (
    ("collector.eps_end", "collector.eps_start", "epsilon decays from eps_start down to eps_end"),
    ("replay.learning_starts", "replay.table_capacity", "a table that never fills never serves"),
    ("learner.batch_size", "replay.table_capacity", "a batch cannot exceed what a table holds"),
    (
        "runtime.heartbeat_interval_s",
        "runtime.heartbeat_timeout_s",
        "a timeout shorter than the heartbeat interval aborts healthy jobs",
    ),
)
"""(smaller, larger, why): pairs of keys where the first must not exceed the second."""


def rule_texts() -> dict[str, str]:
    """Each constrained key's limit in words, for `--explain`."""
    return {path: rule.text for path, rule in RULES.items()}


class _Mismatch(Exception):
    """A value of the wrong type; the caller knows the key and words the ConfigError."""


@dataclass(frozen=True)
class _Ctx:
    """Where values came from, so an error blames the file or the override that set the key."""

    source: str
    origins: Mapping[str, str]

    def where(self, *paths: str) -> str:
        for key, text in self.origins.items():
            if any(path == key or path.startswith(key + ".") for path in paths):
                return f"override {text}"
        return self.source

    def fail(self, path: str, value: Any, problem: str, fix: str) -> NoReturn:
        shown = show(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ConfigError(f"{self.where(path)}: {path} = {shown} {problem}", fix)


def _to_int(v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Mismatch
    return v


def _to_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _Mismatch
    return float(v)


def _exact(kind: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, kind):
            raise _Mismatch
        return v

    return check


_SCALARS: dict[Any, tuple[Callable[[Any], Any], str]] = {
    int: (_to_int, "an integer"),
    float: (_to_float, "a finite number"),
    bool: (_exact(bool), "true or false"),
    str: (_exact(str), "a string"),
}


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_word(tp: Any) -> str:
    """The type as a user reads it: "a list of integers", "a finite number or null"."""
    if tp in _SCALARS:
        return _SCALARS[tp][1]
    if _is_optional(tp):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_word(a) for a in inner) + " or null"
    if typing.get_origin(tp) is list:
        return "a list of " + _type_word(typing.get_args(tp)[0]).split(" ", 1)[1] + "s"
    return "a mapping with string keys" if typing.get_origin(tp) is dict else "any value"


def _coerce(tp: Any, value: Any) -> Any:
    """The value converted to the annotated type (1e5 -> 100000 for an int), or `_Mismatch`."""
    if tp in _SCALARS:
        return _SCALARS[tp][0](value)
    if _is_optional(tp):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(inner[0], value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and isinstance(value, list):
        return [_coerce(args[0], item) for item in value]
    if origin is dict and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return copy.deepcopy(value)
    if tp is Any:
        return copy.deepcopy(value)
    raise _Mismatch


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Resolved field types; the schema's annotations are strings (postponed evaluation)."""
    return typing.get_type_hints(cls)


def _type_fix(path: str, tp: Any, example: Any, value: Any) -> str:
    fix = f"set {path} to {_type_word(tp)} such as {show(example)}"
    if tp is str and isinstance(value, int | float | bool):
        fix += f' (quote it so YAML reads a string: {path.rsplit(".", 1)[-1]}: "{value}")'
    return fix


def _key_value(cls: type, name: str, value: Any, path: str, ctx: _Ctx) -> Any:
    tp = _hints(cls)[name]
    if dataclasses.is_dataclass(tp):
        return _section(tp, value, path, ctx)  # type: ignore[arg-type]
    try:
        value = _coerce(tp, value)
    except _Mismatch:
        problem = f"has the wrong type: expected {_type_word(tp)}"
        ctx.fail(path, value, problem, _type_fix(path, tp, default_of(cls, name), value))
    rule = RULES.get(path)
    if rule is not None and not rule.ok(value):
        noun = "integer" if tp is int else "number"
        ctx.fail(
            path, value, f"{rule.problem}: {rule.text}", rule.fix(path, noun, default_of(cls, name))
        )
    return value


def _section(cls: type, data: Any, path: str, ctx: _Ctx) -> Any:
    """One dataclass from one mapping; an empty section (`learner:` alone) means its defaults."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        fix = f"write {path} as a mapping of its keys (indented under `{path}:`); {EXPLAIN_HINT}"
        ctx.fail(path, data, f"has the wrong type: expected a mapping of {path} keys", fix)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in known:
            ctx.fail(sub, value, "is not a known key", unknown_key_fix(sub))
        kwargs[key] = _key_value(cls, key, value, sub, ctx)
    return cls(**kwargs)


def _value_at(job: JobConfig, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), job)


def _check_order(job: JobConfig, ctx: _Ctx) -> None:
    for small, large, why in ORDERED:
        a, b = (_value_at(job, key) for key in (small, large))
        if a > b:
            where = ctx.where(small, large)
            raise ConfigError(
                f"{where}: {small} = {show(a)} is above {large} = {show(b)}: {why}",
                f"lower {small} to at most {show(b)} or raise {large}",
            )


def require_mapping(data: Any, source: str) -> dict:
    """The job's top level, which must be sections by name; a list or scalar cannot be a job."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level holds {show(data)[:60]}, not a mapping of sections",
            f"write sections such as `learner:` at the top level; {EXPLAIN_HINT}",
        )
    return data


def build_job(data: Any, source: str, origins: Mapping[str, str] | None = None) -> JobConfig:
    """A validated `JobConfig`; `origins` maps keys set by command-line overrides to their text."""
    ctx = _Ctx(source, origins or {})
    job = _section(JobConfig, require_mapping(data, source), "", ctx)
    _check_order(job, ctx)
    return job
