"""The trained policies a checkpoint holds: the parameter servers' tables, read without MPI.

`evaluate`, `hpcmarl.load_policy` and `export-policy` all start from a run directory and want
the published policies of one checkpoint (the newest intact one unless named): each policy's
flat weight vector, its `PolicySpec` (as JSON, the text a collector builds its actor from) and
its version. Nothing here imports torch: building a network from an entry is `hpcmarl.policy`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from .checkpoint import Checkpoint, checkpoint_ids, latest_checkpoint, read_checkpoint

__all__ = ["PolicyEntry", "chosen_checkpoint", "policy_tables"]


@dataclass(frozen=True)
class PolicyEntry:
    """One published policy as a parameter server saved it."""

    key: str
    """`{strategy_spec_id}/{policy_id}`."""
    spec_json: str
    """The `PolicySpec` as JSON (`PolicySpec.from_json`)."""
    weights: np.ndarray
    """The flat float32 vector, in the spec's parameter order."""
    version: int
    """How many times the learners had published it."""


def chosen_checkpoint(run_dir: str | Path, checkpoint: str | None) -> Checkpoint:
    """Checkpoint `checkpoint` of the run, or its newest intact one when None; a name the run
    lacks, or a run without an intact checkpoint, is a `UserError` naming what it holds."""
    if checkpoint is not None:
        if checkpoint not in checkpoint_ids(run_dir):
            held = ", ".join(checkpoint_ids(run_dir)) or "none"
            raise UserError(
                f"{run_dir} has no checkpoint {checkpoint!r} (it has: {held})",
                "name one of its checkpoints, or none for the newest",
            )
        return read_checkpoint(run_dir, checkpoint)
    newest, skipped = latest_checkpoint(run_dir)
    if newest is None:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        raise UserError(
            f"{run_dir} holds no intact checkpoint{why}",
            "use a run that has written a checkpoint (checkpoint.interval_s, or its end)",
        )
    return newest


def policy_tables(ckpt: Checkpoint) -> dict[str, PolicyEntry]:
    """key -> entry for every policy with weights, from every parameter server (`ps*`) of the
    checkpoint; a key announced but never published has no weights and is left out."""
    tables: dict[str, PolicyEntry] = {}
    for role in ckpt.roles():
        if not role.startswith("ps"):
            continue
        saved: dict[str, Any] = ckpt.read_role(role).get("tables", {})  # type: ignore[assignment]
        for sid, policies in saved.items():
            for policy, entry in policies.items():
                if entry.get("weights") is None:
                    continue
                key = f"{sid}/{policy}"
                weights = np.asarray(entry["weights"], np.float32)
                tables[key] = PolicyEntry(key, str(entry["spec"]), weights, int(entry["version"]))
    return tables
