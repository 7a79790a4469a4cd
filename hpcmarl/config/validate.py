"""Turn plain data into a `JobConfig`, or say which key is wrong, what it holds and how to fix it.

Types come from the schema's annotations, so a new field is type-checked the day it is added;
allowed values come from `RULES` (in `rules.py`), one entry per key, so the limits of a job are
read in one place (and printed by `--explain`). Checks that relate two keys are in `ORDERED`
(each algorithm's declared beside its code).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from hpcmarl.algos.catalog import (
    CATALOG,
    AlgoDecl,
    is_algorithm_name,
    ordered_pairs,
    resolve_algorithm,
)
from hpcmarl.config.docs import EXPLAIN_HINT, default_of, show, unknown_key_fix
from hpcmarl.config.rules import ORDERED, RULES
from hpcmarl.config.schema import JobConfig, LearnerConfig
from hpcmarl.errors import ConfigError


class _Mismatch(Exception):
    """A value of the wrong type; the caller knows the key and words the ConfigError."""


@dataclass(frozen=True)
class _Ctx:
    """Where values came from, so an error blames the file or the override that set the key."""

    source: str
    origins: Mapping[str, str]
    rules: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Rules of a plugin algorithm's keys, by dotted path, beside `RULES`."""

    def where(self, *paths: str) -> str:
        for key, text in self.origins.items():
            if any(p == key or p.startswith(key + ".") or key.startswith(p + ".") for p in paths):
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
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(show(a) for a in typing.get_args(tp))
    if _is_optional(tp):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        null = " or null" if len(inner) < len(typing.get_args(tp)) else ""
        return " or ".join(_type_word(a) for a in inner) + null
    if typing.get_origin(tp) is list:
        return "a list of " + _type_word(typing.get_args(tp)[0]).split(" ", 1)[1] + "s"
    return "a mapping with string keys" if typing.get_origin(tp) is dict else "any value"


def _coerce(tp: Any, value: Any) -> Any:
    """The value converted to the annotated type (1e5 -> 100000 for an int), or `_Mismatch`."""
    if tp in _SCALARS:
        return _SCALARS[tp][0](value)
    if typing.get_origin(tp) is typing.Literal:
        if value not in typing.get_args(tp) or not isinstance(value, str):
            raise _Mismatch
        return value
    if _is_optional(tp):
        if value is None and type(None) in typing.get_args(tp):
            return None
        return _coerce_first([a for a in typing.get_args(tp) if a is not type(None)], value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and isinstance(value, list):
        return [_coerce(args[0], item) for item in value]
    if origin is dict and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return copy.deepcopy(value)
    if tp is Any:
        return copy.deepcopy(value)
    raise _Mismatch


def _coerce_first(types_: list[Any], value: Any) -> Any:
    """The value as the first of a union's types that takes it (`int | Literal["auto"]`)."""
    for tp in types_:
        try:
            return _coerce(tp, value)
        except _Mismatch:
            continue
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
    rule = RULES.get(path) or ctx.rules.get(path)
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


def _check_order(job: JobConfig, ctx: _Ctx, pairs: Iterable[tuple[str, str, str]]) -> None:
    for small, large, why in pairs:
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
    data = require_mapping(data, source)
    decl = _algorithm_of(data, ctx)
    own = None
    if decl is not None and decl.section is not None and decl.plugin:
        learner = dict(data["learner"])  # the plugin's section is read after the schema's keys
        own = learner.pop(decl.section, None)
        data = {**data, "learner": learner}
    job = _section(JobConfig, data, "", ctx)
    if decl is not None and decl.config is not None and decl.plugin:
        path = f"learner.{decl.section}"
        rules = {f"{path}.{key}": rule for key, rule in decl.rules.items()}
        plugin_ctx = dataclasses.replace(ctx, rules=rules)
        setattr(job.learner, str(decl.section), _section(decl.config, own, path, plugin_ctx))
    _check_order(job, ctx, ORDERED)
    if decl is not None and decl.config is not None and decl.plugin:
        _check_order(job, ctx, ordered_pairs(decl))  # the plugin's own, once its section is set
    _apply_preset(job, data, ctx)
    return job


def _algorithm_of(data: dict, ctx: _Ctx) -> AlgoDecl | None:
    """The job's algorithm, resolved before its keys are read: a plugin brings its own section.
    None where learner.algo is not a string or no algorithm's name."""
    learner = data.get("learner") or {}
    name = learner.get("algo", LearnerConfig.algo) if isinstance(learner, dict) else None
    if not isinstance(name, str) or not is_algorithm_name(name):
        return None  # the schema's type check and RULES word these errors
    try:
        decl = resolve_algorithm(name)
    except ConfigError as err:
        raise ConfigError(f"{ctx.where('learner.algo')}: {err.cause}", err.fix) from None
    if decl.section is not None and decl.plugin and decl.section in _hints(LearnerConfig):
        raise ConfigError(
            f"{ctx.where('learner.algo')}: learner.algo = {name} keeps its keys in "
            f"learner.{decl.section}, a key hpcmarl already has",
            f"give the class another section name (its class attribute section), not one of "
            f"{sorted(_hints(LearnerConfig))}",
        )
    return decl


def _apply_preset(job: JobConfig, data: dict, ctx: _Ctx) -> None:
    """Fix the keys an algorithm's preset names (`mappo` sets learner.ppo.critic=central); the
    job may repeat them but not contradict them."""
    decl = resolve_algorithm(job.learner.algo)
    if not decl.preset or decl.section is None:
        return
    section = getattr(job.learner, decl.section)
    given = (data.get("learner") or {}).get(decl.section) or {}
    for key, value in decl.preset.items():
        path = f"learner.{decl.section}.{key}"
        if key in given and given[key] != value:
            others = [d.name for d in CATALOG.values() if d.impl == decl.impl and not d.preset]
            raise ConfigError(
                f"{ctx.where(path, 'learner.algo')}: learner.algo = {decl.name!r} fixes {path} = "
                f"{show(value)}, the job sets {show(given[key])}",
                f"drop {path}, or use learner.algo={others[0] if others else decl.name}",
            )
        setattr(section, key, value)
