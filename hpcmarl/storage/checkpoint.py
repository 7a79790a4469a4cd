"""Checkpoint directories: one HDF5 file per stateful role, a manifest, and a `latest` pointer.

    RUN_DIR/checkpoints/000012/replay0.h5     one file per role, written by that role
    RUN_DIR/checkpoints/000012/manifest.json  written last, by the commander: the commit
    RUN_DIR/checkpoints/latest -> 000012      a symbolic link, moved after the manifest

`latest` is a link so that `RUN_DIR/checkpoints/latest/ps0.h5` opens the newest checkpoint's
file from anywhere. Runs written before, and filesystems without symbolic links, hold a text
file there naming the id instead; `latest_pointer` reads both.

A checkpoint exists once its manifest does; a directory without one is a checkpoint that a
crash interrupted and is never used. Every step replaces whole files atomically, so a kill at
any moment leaves the newest complete checkpoint intact. Resuming trusts the manifest's sizes
and sha256 digests, not the pointer alone: a crash between the manifest and the pointer move,
or a file damaged since, is found by looking, and each checkpoint passed over gets one line
saying why.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .hdf5 import (
    SCHEMA_VERSION,
    FileRecord,
    StorageError,
    Tree,
    link_atomic,
    read_tree_with_attrs,
    sha256_of,
    write_bytes_atomic,
    write_tree_atomic,
)

__all__ = [
    "Checkpoint",
    "FileRecord",
    "checkpoint_path",
    "commit_checkpoint",
    "has_checkpoints",
    "latest_checkpoint",
    "latest_pointer",
    "next_checkpoint_id",
    "read_checkpoint",
    "checkpoint_ids",
    "role_file",
    "write_role_state",
]

MANIFEST = "manifest.json"
LATEST = "latest"
ROLE_KIND = "role_state"
_ROLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class _Unusable(Exception):
    """Why one checkpoint directory cannot be resumed from (becomes one skipped line)."""


@dataclass
class Checkpoint:
    """A complete checkpoint: its directory and its parsed manifest."""

    run_dir: Path
    id: str
    path: Path
    manifest: dict[str, Any]

    def roles(self) -> list[str]:
        return sorted(entry["name"].removesuffix(".h5") for entry in self.manifest["files"])

    def read_role(self, role: str) -> Tree:
        """The role's saved tree; the file must also say it belongs to `role`, so a file copied
        under another role's name is refused rather than loaded into the wrong role."""
        if role not in self.roles():
            raise StorageError(
                f"checkpoint {self.id} holds no state for role {role!r} "
                f"(it holds: {', '.join(self.roles())})",
                "resume with the job layout that wrote this checkpoint, or start a new run",
            )
        path = self.path / f"{role}.h5"
        tree, attrs = read_tree_with_attrs(path, ROLE_KIND)
        if attrs.get("role") != role:
            raise StorageError(
                f"{path} holds the state of role {attrs.get('role')!r}, not {role!r}",
                "restore the checkpoint directory as it was written",
            )
        return tree

    def info(self) -> dict[str, Any]:
        """What the commander recorded at commit: counters, world layout, config digest."""
        return dict(self.manifest.get("info", {}))


# -- paths and ids -----------------------------------------------------------------------------
def checkpoint_path(run_dir: str | Path, ckpt_id: str) -> Path:
    if not ckpt_id.isdigit():
        raise ValueError(f"checkpoint id must be digits, got {ckpt_id!r}")
    return Path(run_dir) / "checkpoints" / ckpt_id


def role_file(run_dir: str | Path, ckpt_id: str, role: str) -> Path:
    if not _ROLE_NAME.fullmatch(role):
        raise ValueError(f"role name {role!r} cannot name a checkpoint file")
    return checkpoint_path(run_dir, ckpt_id) / f"{role}.h5"


def checkpoint_ids(run_dir: str | Path) -> list[str]:
    """Every checkpoint directory's id, complete or not, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    ids = [p.name for p in root.iterdir() if p.name.isdigit() and p.is_dir()]
    return sorted(ids, key=int)


def next_checkpoint_id(run_dir: str | Path) -> str:
    """One more than any id in use, so an interrupted checkpoint's directory is never reused."""
    ids = checkpoint_ids(run_dir)
    return f"{int(ids[-1]) + 1 if ids else 1:06d}"


def has_checkpoints(run_dir: str | Path) -> bool:
    """Whether any checkpoint was ever committed here (intact or not): a run that crashed before
    its first commit has nothing to resume and may start afresh."""
    return any((checkpoint_path(run_dir, i) / MANIFEST).exists() for i in checkpoint_ids(run_dir))


# -- writing -----------------------------------------------------------------------------------
def write_role_state(run_dir: str | Path, ckpt_id: str, role: str, tree: Tree) -> FileRecord:
    """One role's part of checkpoint `ckpt_id`; the record goes to the commander for the
    manifest."""
    path = role_file(run_dir, ckpt_id, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_tree_atomic(path, tree, ROLE_KIND, {"role": role})


def commit_checkpoint(
    run_dir: str | Path, ckpt_id: str, records: list[FileRecord], info: dict[str, Any], keep: int
) -> Path:
    """Make checkpoint `ckpt_id` exist: check the files, write the manifest, move `latest`,
    then delete what is no longer needed.

    Sizes are checked here, on the commander's node, because a run directory that is not on a
    filesystem shared by every rank shows up as a missing file and must fail now, not at resume.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    path = checkpoint_path(run_dir, ckpt_id)
    _check_records(path, records)
    manifest = {
        "format": "hpcmarl-checkpoint",
        "schema_version": SCHEMA_VERSION,
        "id": ckpt_id,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": [asdict(r) for r in sorted(records, key=lambda r: r.name)],
        "info": info,
    }
    write_bytes_atomic(path / MANIFEST, json.dumps(manifest, indent=2).encode())
    _move_latest(path.parent / LATEST, ckpt_id)
    _prune(run_dir, ckpt_id, keep)
    return path


def _move_latest(pointer: Path, ckpt_id: str) -> None:
    """`latest` becomes a link to the checkpoint's directory (replacing a text file of an older
    run's in one rename); a filesystem that has no symbolic links gets the text file. A copy
    of the run directory made by a tool that follows links (Python's `shutil.copytree`,
    `cp -L`, some archivers) holds `latest` as a second copy of a checkpoint's directory,
    which no rename can replace: that copy goes first."""
    if pointer.is_dir() and not pointer.is_symlink():
        shutil.rmtree(pointer)
    try:
        link_atomic(pointer, ckpt_id)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        write_bytes_atomic(pointer, f"{ckpt_id}\n".encode())


def _check_records(path: Path, records: list[FileRecord]) -> None:
    names = [r.name for r in records]
    if len(set(names)) != len(names):
        raise ValueError(f"checkpoint {path.name}: a file is listed twice in {sorted(names)}")
    for record in records:
        if Path(record.name).name != record.name or record.name == MANIFEST:
            raise ValueError(f"checkpoint {path.name}: bad file name {record.name!r}")
        file = path / record.name
        size = file.stat().st_size if file.is_file() else None
        if size != record.size:
            found = "is missing" if size is None else f"has {size} bytes"
            raise StorageError(
                f"checkpoint {path.name}: {file} {found}, but its writer reported {record.size}",
                "put runtime.run_dir on a filesystem that every rank of the job shares",
            )


def _prune(run_dir: str | Path, newest: str, keep: int) -> None:
    """Best effort: delete complete checkpoints beyond the newest `keep`, every older incomplete
    one, and temporary files that killed writers left. A manifest goes before its directory, so
    a kill mid-delete leaves an incomplete directory, never a complete-looking one with files
    missing."""
    older = [i for i in checkpoint_ids(run_dir) if int(i) < int(newest)]
    complete = [i for i in older if (checkpoint_path(run_dir, i) / MANIFEST).exists()]
    kept = set(complete[-(keep - 1) :]) if keep > 1 else set()
    for ckpt_id in older:
        if ckpt_id not in kept:
            path = checkpoint_path(run_dir, ckpt_id)
            (path / MANIFEST).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
    root = Path(run_dir) / "checkpoints"
    for stale in [*root.glob(f".{LATEST}.*.tmp"), *(root / newest).glob(".*.tmp")]:
        stale.unlink(missing_ok=True)


# -- finding the checkpoint to resume from ---------------------------------------------------------
def latest_checkpoint(run_dir: str | Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest complete and intact checkpoint, and one line per newer one passed over.

    Every directory is considered newest first, not only the one `latest` names: a crash after
    the manifest but before the pointer moved leaves a complete checkpoint newer than the
    pointer. A pointer naming no directory is reported too.
    """
    skipped = _pointer_problems(run_dir)
    for ckpt_id in reversed(checkpoint_ids(run_dir)):
        path = checkpoint_path(run_dir, ckpt_id)
        try:
            manifest = _verified_manifest(path)
        except _Unusable as why:
            skipped.append(f"checkpoint {ckpt_id}{why}: skipped")
            continue
        return Checkpoint(Path(run_dir), ckpt_id, path, manifest), skipped
    return None, skipped


def read_checkpoint(run_dir: str | Path, ckpt_id: str) -> Checkpoint:
    """One named checkpoint, with the same checks resume makes (every file present, of its
    recorded size and digest)."""
    path = checkpoint_path(run_dir, ckpt_id)
    try:
        return Checkpoint(Path(run_dir), ckpt_id, path, _verified_manifest(path))
    except _Unusable as why:
        raise StorageError(
            f"checkpoint {ckpt_id} of {run_dir}{why}", "name another checkpoint"
        ) from None


def latest_pointer(run_dir: str | Path) -> str | None:
    """What `checkpoints/latest` names: the link's target, or an older run's text (None: no
    pointer). Only a hint: `latest_checkpoint` trusts the manifests, not the pointer."""
    pointer = Path(run_dir) / "checkpoints" / LATEST
    if pointer.is_symlink():
        return Path(os.readlink(pointer)).name
    if not pointer.is_file():
        return None
    return pointer.read_text(errors="replace").strip()


def _pointer_problems(run_dir: str | Path) -> list[str]:
    named = latest_pointer(run_dir)
    if named is None or (named.isdigit() and checkpoint_path(run_dir, named).is_dir()):
        return []
    return [f"the latest pointer names checkpoint {named[:40]!r}, which does not exist: ignored"]


def _verified_manifest(path: Path) -> dict[str, Any]:
    """The manifest, once every file it lists has its recorded size and sha256 digest."""
    manifest = _load_manifest(path)
    for entry in manifest["files"]:
        file = path / entry["name"]
        if not file.is_file():
            raise _Unusable(f": {entry['name']} is missing")
        size = file.stat().st_size
        if size != entry["size"]:
            raise _Unusable(
                f": {entry['name']} has {size} bytes, the manifest says {entry['size']} "
                "(truncated or overwritten)"
            )
        if sha256_of(file) != entry["sha256"]:
            raise _Unusable(f": {entry['name']} does not match its sha256 digest (corrupt)")
    return manifest


def _load_manifest(path: Path) -> dict[str, Any]:
    try:
        text = (path / MANIFEST).read_text()
    except FileNotFoundError:
        raise _Unusable(" is incomplete (no manifest)") from None
    try:
        manifest = json.loads(text)
        version = int(manifest["schema_version"])
        names = [(str(f["name"]), int(f["size"]), str(f["sha256"])) for f in manifest["files"]]
    except (ValueError, TypeError, KeyError) as err:
        raise _Unusable(f": its manifest is unreadable ({type(err).__name__}: {err})") from None
    if version > SCHEMA_VERSION:
        raise _Unusable(f" was written by a newer hpcmarl (schema version {version})")
    if manifest.get("id") != path.name or any(Path(n).name != n for n, _, _ in names):
        raise _Unusable(": its manifest belongs to another directory or names foreign paths")
    return manifest
