"""Resuming a run from the newest complete checkpoint of its run directory.

A requeued batch job restarts with the same command line; finding a checkpoint in the run
directory is what turns that restart into a resume. Rank 0 picks the checkpoint (verifying
digests, skipping incomplete or corrupt ones with a line each) and checks that it belongs to
this job; every rank then loads the files of the roles it hosts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config.schema import JobConfig
from ..core import Role
from ..errors import UserError
from ..replay.redistribute import (
    deal_compact_tables,
    deal_limiters,
    deal_queues,
    deal_tables,
)
from ..roles.coordinator import RESUMABLE_CHANGES, config_digest
from ..roles.state_tree import flatten, nest
from ..storage.checkpoint import Checkpoint, checkpoint_path, has_checkpoints, latest_checkpoint


def find_resume_point(cfg: JobConfig, run_dir: str) -> str | None:
    """The id of the checkpoint to resume from, None for a fresh run; refuses a foreign one."""
    if not has_checkpoints(run_dir):
        return None
    checkpoint, skipped = latest_checkpoint(run_dir)
    for line in skipped:
        print(f"hpcmarl: {line}", flush=True)
    if checkpoint is None:
        raise UserError(
            f"{run_dir} holds checkpoints but none is complete and intact",
            "start a new run with another runtime.run_dir, or restore a checkpoint directory",
        )
    info = checkpoint.info()
    if info.get("config_sha256") != config_digest(cfg):
        raise UserError(
            f"{run_dir} holds checkpoints of another job (its job differs from this one in "
            f"more than {', '.join(RESUMABLE_CHANGES)})",
            f"give this job a new runtime.run_dir, or resume that run with "
            f"`python -m hpcmarl resume {run_dir}`",
        )
    return checkpoint.id


def open_checkpoint(run_dir: str, checkpoint_id: str) -> Checkpoint:
    path = checkpoint_path(run_dir, checkpoint_id)
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    return Checkpoint(Path(run_dir), checkpoint_id, Path(path), manifest)


def restore_roles(
    roles: list[Role], run_dir: str, checkpoint_id: str, shards: list[str], capacity: int
) -> None:
    """Load each hosted role's saved state; a role new to this run (more collectors) starts
    fresh; replay tables are dealt anew when the number of shards changed."""
    checkpoint = open_checkpoint(run_dir, checkpoint_id)
    saved = set(checkpoint.roles())
    dealt = redeal_replay(checkpoint, shards, capacity)
    for role in roles:
        if dealt is not None and role.name in dealt:
            role.load_state(dealt[role.name])
        elif role.name in saved:
            role.load_state(checkpoint.read_role(role.name))


def redeal_replay(checkpoint: Checkpoint, shards: list[str], capacity: int) -> dict | None:
    """New shard trees when the shard count differs from the checkpoint's, else None.

    Each carries the generation its groups' tables hold (PSRO's iteration): without it, a new
    shard took the current iteration's first request for a newer one and emptied its table. A
    saved table of an older generation (a shard that had not yet heard of the newest) is
    dropped, as that shard would have dropped it. What earlier tables evicted and dropped stays
    counted, on the first new shard, so the run's totals are unchanged."""
    saved = sorted(
        (r for r in checkpoint.roles() if r.startswith("replay")),
        key=lambda name: int(name.removeprefix("replay")),
    )
    if saved == shards or not saved:
        return None
    trees: list[Any] = [checkpoint.read_role(name) for name in saved]
    generations = saved_generations(trees)
    out: dict[str, dict] = {
        name: {
            "tables": {},
            "limiters": {},
            "pending_inserts": {},
            "samples_served": 0,
            "generations": dict(generations),
            "earlier": {},
        }
        for name in shards
    }
    for group in trees[0]["tables"]:
        newest = [t for t in trees if generation_of(t, group) == generations.get(group, 0)]
        out[shards[0]]["earlier"][group] = earlier_counts(trees, newest, group)
        redeal_group(out, shards, group, newest, capacity)
    for i, tree in enumerate(trees):
        pending = out[shards[i % len(shards)]]["pending_inserts"]
        for entry in tree["pending_inserts"].values():
            pending[str(len(pending))] = entry
    return out


def redeal_group(
    out: dict[str, dict], shards: list[str], group: str, trees: list[Any], capacity: int
) -> None:
    """Deal the group's tables of the saved shard `trees` into the new shards' trees `out`."""
    states = [flatten(t["tables"][group]) for t in trees]
    if "queue_counters" in states[0]:  # an on-policy queue: item i to shard i mod S
        for name, queue in zip(shards, deal_queues(states, len(shards)), strict=True):
            out[name]["tables"][group] = nest(queue)
        return
    if "storage_form" in states[0]:  # compact transitions: each run whole on one shard
        tables = deal_compact_tables(states, len(shards), capacity)
    else:
        tables = deal_tables(states, len(shards), capacity)
    limiters = deal_limiters([t["limiters"][group] for t in trees], len(shards))
    for name, table, limiter in zip(shards, tables, limiters, strict=True):
        out[name]["tables"][group], out[name]["limiters"][group] = nest(table), limiter


def saved_generations(trees: list[Any]) -> dict[str, int]:
    """Group -> the newest generation any saved shard's table holds."""
    out: dict[str, int] = {}
    for tree in trees:
        for group in tree.get("generations", {}):
            out[group] = max(out.get(group, 0), generation_of(tree, group))
    return out


def generation_of(tree: Any, group: str) -> int:
    return int(tree.get("generations", {}).get(group, 0))


def earlier_counts(trees: list[Any], newest: list[Any], group: str) -> dict[str, int]:
    """What the group's replaced tables evicted and dropped on every saved shard, and what
    its stale saved tables (those not in `newest`) did, which the re-deal replaces too."""
    counts = {"evicted": 0, "dropped": 0}
    for tree in trees:
        for key, value in tree.get("earlier", {}).get(group, {}).items():
            counts[key] += int(value)
        if not any(tree is t for t in newest):
            table = flatten(tree["tables"][group])
            if "queue_counters" in table:  # [inserted, evicted, dropped, taken]
                counts["evicted"] += int(table["queue_counters"][1])
                counts["dropped"] += int(table["queue_counters"][2])
            else:  # [inserted, evicted]
                counts["evicted"] += int(table["counters"][1])
    return counts
