"""The message table: every kind of message, who sends it, who receives it, what it carries.

This table is the contract between roles. Control messages carry a small `meta` dict only;
bulk messages also carry named numpy arrays, which travel as raw buffers, never pickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Kind:
    """One row of the message table."""

    name: str
    sender: str
    receiver: str
    payload: str
    bulk: bool = False


MESSAGE_TABLE: tuple[Kind, ...] = (
    Kind("task_request", "collector|learner", "commander", "{} - ask for work when idle"),
    Kind("task", "commander", "collector|learner", "{task_id, kind, bindings, ...} - work"),
    Kind("task_done", "collector|learner", "commander", "{task_id, stats} - releases task space"),
    Kind("task_failed", "collector|learner", "commander", "{task_id, cause} - releases space"),
    Kind("stats", "param_server|replay_shard", "commander", "{counters} - periodic report"),
    Kind("heartbeat", "every role", "commander", "{} - still alive (any message counts)"),
    Kind("relax", "commander", "replay_shard", "{on} - drain: serve samples, take batches"),
    Kind("wrap_up", "commander", "learner", "{task_id} - end the task after this update"),
    Kind("stop", "commander", "every role", "{reason} - finish and acknowledge"),
    Kind("stopped", "every role", "commander", "{counters} - acknowledgement of stop"),
    Kind("checkpoint", "commander", "stateful roles", "{id, run_dir, expect} - write state"),
    Kind("snapshotted", "stateful roles", "commander", "{id, bytes} - state cut, writing"),
    Kind("checkpointed", "stateful roles", "commander", "{id, record, seconds} - file written"),
    Kind("create_table", "commander", "param_server", "{key, spec} - announce a policy key"),
    Kind("batch", "collector", "replay_shard", "{group, items} + item columns", bulk=True),
    Kind("credit", "replay_shard", "collector", "{n[, group, first, items]} - send n more"),
    Kind("sample_request", "learner", "replay_shard", "{group, n | ranges, min_version}"),
    Kind("sample", "replay_shard", "learner", "{group, items, dropped|empty} + columns", bulk=True),
    Kind("priorities", "learner", "replay_shard", "{group} + indices, ids, td", bulk=True),
    Kind("weights_push", "learner", "param_server", "{key[, spec]} + weights", bulk=True),
    Kind("weights_pull", "collector", "param_server", "{key, have_version, min_version}"),
    Kind("weights", "param_server", "collector", "{key, version[, spec]} + weights", bulk=True),
    Kind("not_newer", "param_server", "collector", "{key, version} - nothing newer"),
)

KINDS: dict[str, Kind] = {kind.name: kind for kind in MESSAGE_TABLE}


@dataclass
class Message:
    """A message between two roles, addressed by role name (e.g. `replay1`).

    Arrays handed to `send` belong to the transport from then on: the sender must not modify
    them, because a nonblocking send may still be reading them.
    """

    kind: str
    src: str
    dst: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] | None = None


def format_table() -> str:
    """The message table as text, for the wiring diagram printed at start."""
    rows = [f"  {k.name:<15} {k.sender:>26} -> {k.receiver:<20} {k.payload}" for k in MESSAGE_TABLE]
    return "\n".join(rows)
