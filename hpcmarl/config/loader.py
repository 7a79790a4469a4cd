"""Read a job: YAML file, then `KEY=VALUE` overrides, then validation into a `JobConfig`.

Only plain YAML is read: the loader is PyYAML's safe loader, which builds no Python objects, so a
job file from anywhere cannot run code. It differs from `yaml.safe_load` in two ways that users
hit: `5e-4` and `1e5` read as numbers (YAML 1.2), not strings; a key given twice is an error
instead of silently keeping the last one.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from hpcmarl.algos.catalog import resolve_algorithm
from hpcmarl.config.docs import EXPLAIN_HINT, all_keys, explain, field_help, show, unknown_key_fix
from hpcmarl.config.schema import JobConfig
from hpcmarl.config.validate import build_job, require_mapping
from hpcmarl.errors import ConfigError

__all__ = [
    "JobSource",
    "apply_overrides",
    "explain",
    "field_help",
    "job_from_dict",
    "job_to_dict",
    "load_job",
    "parse_yaml",
    "read_job_file",
    "save_resolved",
]

_FLOAT_1_2 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _JobLoader(yaml.SafeLoader):
    """The safe loader with YAML 1.2 floats and duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {show(key)} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 core schema for booleans and floats: only true/false are booleans (`yes`, `on` stay
# strings, so `double_q: yes` is reported rather than guessed), and any decimal with a dot or an
# exponent is a float. Ints keep YAML's int resolver, which runs first.
_BOOL = "tag:yaml.org,2002:bool"
_JobLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JobLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_JobLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))


def _yaml_error(err: yaml.YAMLError, source: str) -> ConfigError:
    mark = getattr(err, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    if "tag:yaml.org,2002:python/" in problem:
        tag = problem.split("tag:yaml.org,2002:", 1)[1].rstrip("'")
        return ConfigError(
            f"{source}: holds a Python object tag (!!{tag}){at}; only plain YAML is accepted",
            "write the value as plain YAML (mappings, lists, strings, numbers, true/false, null)",
        )
    if "appears twice" in problem:
        return ConfigError(f"{source}: {problem}{at}", "keep only one of the two entries")
    return ConfigError(
        f"{source}: YAML syntax error{at}: {problem}",
        "correct the YAML near that line (indentation, a missing ':' or an unclosed bracket)",
    )


def parse_yaml(text: str, source: str) -> Any:
    """Plain YAML to plain data, with any YAML problem turned into a `ConfigError`."""
    try:
        return yaml.load(text, Loader=_JobLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise _yaml_error(err, source) from None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        if path in all_keys():  # `python -m hpcmarl learner.lr`: an override lacking its value
            raise ConfigError(
                f"{path} is neither a job file nor KEY=VALUE",
                f"give it a value to override it, e.g. {path}=VALUE; {EXPLAIN_HINT}",
            ) from None
        raise ConfigError(
            f"job file {path} does not exist",
            "check the path, or leave the job file out to run the built-in default job",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"job file {path} is not UTF-8 text", "save it as UTF-8") from None
    except OSError as err:
        raise ConfigError(
            f"job file {path} cannot be read: {err.strerror}", "make it a readable file"
        ) from None


def _split_override(text: str) -> tuple[str, Any]:
    """("learner.lr", 0.0005) from "learner.lr=5e-4"."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"override {text!r} is not KEY=VALUE",
            f"write it as a dotted key, '=' and a YAML value, e.g. learner.lr=5e-4; {EXPLAIN_HINT}",
        )
    value = parse_yaml(raw, f"override {text}")
    return key, value


_FREE_FORM = {"env.kwargs", "agents.mapping", "agents.groups", "learner.model.kwargs"}
"""Keys whose value is a user mapping, so `env.kwargs.max_cycles=25` sets one entry in it."""


def _check_override_key(key: str, text: str) -> list[str]:
    """The key's parts, if the schema has it or it names an entry inside a free-form mapping."""
    parts = key.split(".")
    keys = set(all_keys())
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in keys and (n == len(parts) or head in _FREE_FORM):
            return parts
    if len(parts) > 2 and parts[0] == "learner" and f"learner.{parts[1]}" not in keys:
        return parts  # a plugin algorithm's own section: validation reads it with the algorithm
    raise ConfigError(f"override {text}: {key} is not a known key", unknown_key_fix(key))


def _set_path(data: dict, parts: list[str], value: Any, text: str) -> None:
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            here = ".".join(parts[: i + 1])
            raise ConfigError(
                f"override {text}: {here} holds {show(child)}, not a mapping to set a key in",
                f"set the whole value instead, e.g. {here}={{{parts[i + 1]}: {show(value)}}}",
            )
        node = child
    node[parts[-1]] = value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """A copy of `data` with each `dotted.key=yaml_value` applied in order; `data` is untouched."""
    out = copy.deepcopy(data)
    for text in overrides:
        key, value = _split_override(text)
        _set_path(out, _check_override_key(key, text), value, text)
    return out


def job_from_dict(data: dict, source: str = "<dict>") -> JobConfig:
    """A validated job; keys left out take the schema default. `source` prefixes every error."""
    return build_job(data, source)


def job_to_dict(cfg: JobConfig) -> dict:
    """Plain dicts, lists and scalars, ready for YAML or JSON and for `job_from_dict`; a plugin
    algorithm's section (`learner.<section>`, set by validation) goes with them."""
    plain = dataclasses.asdict(cfg)
    decl = resolve_algorithm(cfg.learner.algo)
    if decl.plugin and decl.section is not None and hasattr(cfg.learner, decl.section):
        plain["learner"][decl.section] = dataclasses.asdict(getattr(cfg.learner, decl.section))
    return plain


def read_job_file(path: str) -> dict:
    """The parsed top-level mapping of a job file; an empty file is an empty job."""
    data = parse_yaml(_read_text(path), path)
    return {} if data is None else require_mapping(data, path)


JobSource = str | os.PathLike | Mapping[str, Any] | None
"""A job file's path, the same keys as a mapping (`hpcmarl.train`), or None: the default job."""


def command_job(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The job file and overrides of `python -m hpcmarl [train] [JOB.yaml] [key=value ...]`:
    the first word names the job file unless it is an override (then the default job runs).
    The launcher reads a command line the same way (`launch/launcher_options.py`)."""
    args = list(args[1:] if args and args[0] == "train" else args)
    job = args[0] if args and "=" not in args[0] else None
    return job, args[1:] if job is not None else args


def load_job(job: JobSource, overrides: Sequence[str] = ()) -> JobConfig:
    """The job to run, with overrides on top: a job file, a mapping of the keys a job file
    holds (never changed here), or, if None, the built-in default job."""
    if job is None:
        data, source = {}, "<default job>"
    elif isinstance(job, Mapping):
        data, source = require_mapping(dict(job), "<job mapping>"), "<job mapping>"
    else:
        source = os.fspath(job)
        data = read_job_file(source)
    data = apply_overrides(data, overrides)
    origins = {_split_override(text)[0]: text for text in overrides}
    return build_job(data, source, origins)


def save_resolved(cfg: JobConfig, path: str) -> None:
    """Write the job as resolved YAML atomically, so a crash never leaves a half-written file."""
    text = "# Resolved hpcmarl job: every key, after defaults and overrides.\n"
    text += yaml.safe_dump(job_to_dict(cfg), sort_keys=False, default_flow_style=None)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".job-", suffix=".yaml.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
