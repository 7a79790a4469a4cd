"""What the schema says about itself: field help, key listings and "did you mean" suggestions.

The schema's attribute docstrings are the single source of help text, so error messages and
`python -m hpcmarl --explain` can never drift from the code that defines a key.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import textwrap
from collections.abc import Iterable, Iterator
from typing import Any

import yaml

from hpcmarl.config.schema import JobConfig

EXPLAIN_HINT = "every key is listed with its meaning by `python -m hpcmarl --explain`"


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Read the string literal under each annotated field; Python keeps none of them at runtime."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[stmt.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def field_help(cls: type, name: str) -> str:
    """The attribute docstring of one schema field, on one line, for messages and --explain (a
    field made by code, such as an algorithm's section, carries it as `metadata["doc"]`)."""
    if name not in {f.name for f in dataclasses.fields(cls)}:
        raise KeyError(f"{cls.__name__} has no field {name!r}")
    doc = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("doc")
    return str(doc) if doc is not None else _field_docs(cls).get(name, "")


def show(value: Any) -> str:
    """Render a value as the user would write it in YAML; strings quoted so `"5"` differs from 5."""
    if isinstance(value, str):
        return repr(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def default_of(cls: type, name: str) -> Any:
    """The schema default of a field, built fresh so callers may keep or change it."""
    fld = next(f for f in dataclasses.fields(cls) if f.name == name)
    if fld.default_factory is not dataclasses.MISSING:
        return fld.default_factory()
    return fld.default


def section_class(fld: dataclasses.Field) -> type | None:
    """The dataclass a section field holds, or None for a plain key."""
    factory = fld.default_factory
    is_section = isinstance(factory, type) and dataclasses.is_dataclass(factory)
    return factory if is_section else None  # type: ignore[return-value]


def walk(cls: type = JobConfig, prefix: str = "") -> Iterator[tuple[str, type, dataclasses.Field]]:
    """Every key as (dotted path, owning class, field), sections before their children."""
    for fld in dataclasses.fields(cls):
        path = prefix + fld.name
        yield path, cls, fld
        section = section_class(fld)
        if section is not None:
            yield from walk(section, path + ".")


@functools.cache
def all_keys() -> tuple[str, ...]:
    """Every valid dotted key path, sections included."""
    return tuple(path for path, _, _ in walk())


def suggest(path: str, n: int = 3) -> list[str]:
    """Valid keys near `path`: its section's keys first, then the same name in another section
    (`lr` -> `learner.lr`), then whole-path look-alikes (`lerner.lr` -> `learner.lr`)."""
    keys = all_keys()
    parent, _, leaf = path.rpartition(".")
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    near = [f"{parent}.{m}" if parent else m for m in _close(leaf, siblings)]
    by_leaf = {k.rpartition(".")[2]: k for k in keys}
    near += [by_leaf[m] for m in difflib.get_close_matches(leaf, list(by_leaf), n, cutoff=0.75)]
    near += difflib.get_close_matches(path, keys, n, cutoff=0.8)
    return list(dict.fromkeys(near))[:n]


def _close(leaf: str, siblings: list[str]) -> list[str]:
    names = [k.rpartition(".")[2] for k in siblings]
    return difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)


MOVED_KEYS = {
    "learner.double_q": "learner.dqn.double_q",
    "learner.huber_delta": "learner.dqn.huber_delta",
    "learner.target_network_update_freq": "learner.dqn.target_network_update_freq",
    "collector.eps_start": "learner.dqn.eps_start",
    "collector.eps_end": "learner.dqn.eps_end",
    "collector.eps_decay_steps": "learner.dqn.eps_decay_steps",
}
"""Keys that moved into an algorithm's own section: an old job file is told the new name."""


def unknown_key_fix(path: str) -> str:
    """The fix for a key the schema does not have: its new name if it moved, else the nearest
    real keys, then where to look."""
    if path in MOVED_KEYS:
        return f"it moved: write {MOVED_KEYS[path]} instead (the algorithm owns it now)"
    near = suggest(path)
    lead = f"did you mean {' or '.join(near)}? " if near else "remove it; "
    return lead + EXPLAIN_HINT


def _explain_key(path: str, cls: type, fld: dataclasses.Field, rules: dict[str, str]) -> str:
    depth = path.count(".")
    indent = "  " * depth
    section = section_class(fld)
    if section is not None:
        return f"\n{indent}{path}:  (section) {inspect.getdoc(section)}"
    head = f"{indent}{path}: {fld.type} = {show(default_of(cls, fld.name))}"
    if path in rules:
        head += f"  [{rules[path]}]"
    body = textwrap.fill(
        field_help(cls, fld.name),
        width=96,
        initial_indent=indent + "    ",
        subsequent_indent=indent + "    ",
    )
    return f"{head}\n{body}"


def explain(key: str | None = None) -> str:
    """Every key with its type, default, allowed range and help, in job-file order; with `key`,
    that key and the keys of its section only (a `ConfigError` for a key the schema lacks)."""
    from hpcmarl.algos import catalog
    from hpcmarl.config.rules import ORDERED, rule_texts  # rules builds on this module
    from hpcmarl.errors import ConfigError

    rules = rule_texts()
    if key is not None and key not in all_keys() and catalog.is_algorithm_name(key):
        return explain_algorithm(key)
    if key is not None:
        if key not in all_keys():
            raise ConfigError(f"--explain {key}: {key} is not a known key", unknown_key_fix(key))
        chosen = [k for k in walk() if k[0] == key or k[0].startswith(key + ".")]
        return "\n".join(_explain_key(path, cls, fld, rules) for path, cls, fld in chosen) + "\n"
    lines = [
        "hpcmarl job file keys. A job file is YAML whose sections mirror these; any key can",
        "also be set on the command line as KEY=VALUE (e.g. learner.lr=5e-4).",
        "",
    ]
    lines += [_explain_key(path, cls, fld, rules) for path, cls, fld in walk()]
    lines += ["", catalog.describe()]
    lines += _order_lines(ORDERED)
    return "\n".join(lines) + "\n"


def explain_algorithm(name: str) -> str:
    """`--explain module:Class` (or an entry point's name): what the algorithm is, and its own
    keys with their types, defaults, checks and help, as `learner.<section>.KEY`."""
    from hpcmarl.algos import catalog

    decl = catalog.resolve_algorithm(name)
    kind = "on-policy" if decl.on_policy else "off-policy"
    lines = [f"learner.algo = {name}: {decl.summary} ({kind}, trains on {decl.items}s)"]
    if decl.config is None or decl.section is None:
        return "\n".join([*lines, "  no keys of its own"]) + "\n"
    prefix = f"learner.{decl.section}"
    rules = {f"{prefix}.{key}": rule.text for key, rule in decl.rules.items()}
    lines.append(f"{prefix}:  (section) {inspect.getdoc(decl.config)}")
    lines += [
        _explain_key(path, cls, fld, rules) for path, cls, fld in walk(decl.config, prefix + ".")
    ]
    lines += _order_lines(catalog.ordered_pairs(decl))
    return "\n".join(lines) + "\n"


def _order_lines(pairs: Iterable[tuple[str, str, str]]) -> list[str]:
    """`--explain`'s list of keys that must not exceed another; none where there are no pairs."""
    shown = [f"  {small} <= {large}  ({why})" for small, large, why in pairs]
    return ["", "Keys that must not exceed another:", *shown] if shown else []
