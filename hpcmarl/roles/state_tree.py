"""Flat `a/b/c` state dicts <-> nested trees, and RNG states as plain data.

Algorithm and replay states name their arrays with slash paths (`online/0.weight`); HDF5 takes
a slash as a group separator, so a flat dict is nested before writing and flattened after
reading to give back exactly the keys it had.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "/"))
        else:
            flat[path] = value
    return flat


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """A numpy Generator's state as a tree of plain values (big ints stay exact in JSON)."""
    return dict(rng.bit_generator.state)


def restore_rng(rng: np.random.Generator, state: dict[str, Any]) -> None:
    rng.bit_generator.state = state
