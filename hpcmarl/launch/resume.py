"""Resuming a run from the newest complete checkpoint of its run directory.

A requeued batch job restarts with the same command line; finding a checkpoint in the run
directory is what turns that restart into a resume. Rank 0 picks the checkpoint (verifying
digests, skipping incomplete or corrupt ones with a line each) and checks that it belongs to
this job; every rank then loads the files of the roles it hosts.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config.schema import JobConfig
from ..core import Role
from ..errors import UserError
from ..roles.coordinator import RESUMABLE_CHANGES, config_digest
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
    check_same_shards(cfg, info)
    return checkpoint.id


def check_same_shards(cfg: JobConfig, info: dict) -> None:
    saved = sum(1 for name in info.get("world", {}) if name.startswith("replay"))
    if saved and saved != cfg.topology.replay_shards:
        raise UserError(
            f"the checkpoint holds {saved} replay shard(s), the job asks for "
            f"{cfg.topology.replay_shards}",
            f"resume with topology.replay_shards={saved}",
        )


def open_checkpoint(run_dir: str, checkpoint_id: str) -> Checkpoint:
    path = checkpoint_path(run_dir, checkpoint_id)
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    return Checkpoint(Path(run_dir), checkpoint_id, Path(path), manifest)


def restore_roles(roles: list[Role], run_dir: str, checkpoint_id: str) -> None:
    """Load each hosted role's saved state; a role new to this run (more collectors) starts
    fresh."""
    checkpoint = open_checkpoint(run_dir, checkpoint_id)
    saved = set(checkpoint.roles())
    for role in roles:
        if role.name in saved:
            role.load_state(checkpoint.read_role(role.name))
