"""Checkpoint directories: commit order, pruning, and resuming after a kill at every stage."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from hpcmarl.storage.checkpoint import (
    FileRecord,
    checkpoint_path,
    commit_checkpoint,
    has_checkpoints,
    latest_checkpoint,
    latest_pointer,
    next_checkpoint_id,
    role_file,
    write_role_state,
)
from hpcmarl.storage.hdf5 import StorageError, link_atomic, read_tree, sha256_of

ROLES = ("replay0", "learner0", "commander")


def write_files(run_dir: Path) -> tuple[str, list[FileRecord]]:
    """Every role's file of the next checkpoint, each holding that checkpoint's id."""
    ckpt_id = next_checkpoint_id(run_dir)
    records = [
        write_role_state(run_dir, ckpt_id, role, {"id": int(ckpt_id), "w": np.arange(2000.0)})
        for role in ROLES
    ]
    return ckpt_id, records


def take(run_dir: Path, keep: int = 10) -> str:
    ckpt_id, records = write_files(run_dir)
    commit_checkpoint(run_dir, ckpt_id, records, {"env_steps": int(ckpt_id) * 100}, keep)
    return ckpt_id


def resumed_id(run_dir: Path) -> tuple[str | None, list[str]]:
    checkpoint, skipped = latest_checkpoint(run_dir)
    return (None if checkpoint is None else checkpoint.id), skipped


def test_a_committed_checkpoint_reads_back(tmp_path: Path) -> None:
    assert not has_checkpoints(tmp_path) and latest_checkpoint(tmp_path) == (None, [])
    ckpt_id = take(tmp_path)
    assert ckpt_id == "000001" and has_checkpoints(tmp_path)
    checkpoint, skipped = latest_checkpoint(tmp_path)
    assert checkpoint is not None and skipped == []
    assert checkpoint.id == ckpt_id and checkpoint.path == checkpoint_path(tmp_path, ckpt_id)
    assert checkpoint.roles() == sorted(ROLES)
    assert checkpoint.info() == {"env_steps": 100}
    tree = checkpoint.read_role("learner0")
    assert tree["id"] == 1 and isinstance(tree["w"], np.ndarray) and tree["w"].dtype == np.float64
    latest = tmp_path / "checkpoints" / "latest"
    assert latest.is_symlink() and os.readlink(latest) == ckpt_id == latest_pointer(tmp_path)
    assert read_tree(latest / "learner0.h5")["id"] == 1  # the newest checkpoint's files
    manifest = json.loads((checkpoint.path / "manifest.json").read_text())
    assert manifest["id"] == ckpt_id and manifest["schema_version"] == 1 and manifest["created"]
    assert {f["name"] for f in manifest["files"]} == {f"{r}.h5" for r in ROLES}


def test_ids_count_past_incomplete_directories(tmp_path: Path) -> None:
    assert next_checkpoint_id(tmp_path) == "000001"
    take(tmp_path)
    write_files(tmp_path)
    assert next_checkpoint_id(tmp_path) == "000003"
    assert role_file(tmp_path, "000003", "ps0") == tmp_path / "checkpoints" / "000003" / "ps0.h5"
    with pytest.raises(ValueError):
        role_file(tmp_path, "000003", "../ps0")


def test_kill_before_the_manifest_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    take(tmp_path)
    write_files(tmp_path)
    assert resumed_id(tmp_path) == (
        "000001",
        ["checkpoint 000002 is incomplete (no manifest): skipped"],
    )


def test_kill_before_the_pointer_moved_uses_the_newer_checkpoint(tmp_path: Path) -> None:
    take(tmp_path)
    take(tmp_path)
    link_atomic(tmp_path / "checkpoints" / "latest", "000001")
    assert resumed_id(tmp_path) == ("000002", [])


def test_an_older_runs_text_pointer_is_read_and_becomes_a_link_at_the_next_commit(
    tmp_path: Path,
) -> None:
    take(tmp_path)
    latest = tmp_path / "checkpoints" / "latest"
    latest.unlink()
    latest.write_text("000001\n")  # as hpcmarl wrote it before the link
    assert latest_pointer(tmp_path) == "000001" and resumed_id(tmp_path) == ("000001", [])
    take(tmp_path)
    assert latest.is_symlink() and latest_pointer(tmp_path) == "000002"
    assert resumed_id(tmp_path) == ("000002", [])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "000001",
        "000002",
        "latest",
    ]  # no temporary link left beside it


def test_a_copy_that_followed_the_link_commits_its_next_checkpoint(tmp_path: Path) -> None:
    """shutil.copytree (like cp -L) copies `latest` as a directory: the next commit replaces
    it with a link instead of failing with IsADirectoryError (a resumed copy once did)."""
    take(tmp_path / "run")
    copy = Path(shutil.copytree(tmp_path / "run", tmp_path / "copy"))
    latest = copy / "checkpoints" / "latest"
    assert latest.is_dir() and not latest.is_symlink()
    assert resumed_id(copy) == ("000001", [])
    take(copy)
    assert latest.is_symlink() and latest_pointer(copy) == "000002"
    assert resumed_id(copy) == ("000002", [])


def test_leftover_temp_files_are_ignored_and_cleaned_at_the_next_commit(tmp_path: Path) -> None:
    take(tmp_path)
    ckpt_id, records = write_files(tmp_path)
    stale = checkpoint_path(tmp_path, ckpt_id) / ".replay0.h5.0123abcd.tmp"
    stale.write_bytes(b"\x89HDF\r\n\x1a\n half a file")
    assert resumed_id(tmp_path)[0] == "000001"
    commit_checkpoint(tmp_path, ckpt_id, records, {}, keep=3)
    assert resumed_id(tmp_path) == ("000002", []) and not stale.exists()


def test_half_written_or_flipped_role_files_are_skipped_with_a_reason(tmp_path: Path) -> None:
    take(tmp_path)
    take(tmp_path)
    take(tmp_path)
    half = role_file(tmp_path, "000003", "replay0")
    half.write_bytes(half.read_bytes()[: half.stat().st_size // 2])
    flipped = role_file(tmp_path, "000002", "learner0")
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    checkpoint_id, skipped = resumed_id(tmp_path)
    assert checkpoint_id == "000001"
    assert skipped[0].startswith("checkpoint 000003: replay0.h5 has ")
    assert "(truncated or overwritten): skipped" in skipped[0]
    assert skipped[1] == (
        "checkpoint 000002: learner0.h5 does not match its sha256 digest (corrupt): skipped"
    )


def test_no_usable_checkpoint_gives_none_with_every_reason(tmp_path: Path) -> None:
    take(tmp_path)
    role_file(tmp_path, "000001", "commander").unlink()
    (checkpoint_path(tmp_path, "000001") / "manifest.json").write_text("{not json")
    write_files(tmp_path)
    link_atomic(tmp_path / "checkpoints" / "latest", "000099")  # a link to nothing
    checkpoint_id, skipped = resumed_id(tmp_path)
    assert checkpoint_id is None and has_checkpoints(tmp_path)
    assert "names checkpoint '000099', which does not exist" in skipped[0]
    assert skipped[1] == "checkpoint 000002 is incomplete (no manifest): skipped"
    assert skipped[2].startswith("checkpoint 000001: its manifest is unreadable")


def test_a_file_missing_since_the_commit_is_skipped(tmp_path: Path) -> None:
    take(tmp_path)
    take(tmp_path)
    role_file(tmp_path, "000002", "commander").unlink()
    reason = "checkpoint 000002: commander.h5 is missing: skipped"
    assert resumed_id(tmp_path) == ("000001", [reason])


def test_commit_refuses_files_it_cannot_see(tmp_path: Path) -> None:
    ckpt_id, records = write_files(tmp_path)
    role_file(tmp_path, ckpt_id, "replay0").unlink()
    with pytest.raises(StorageError, match="replay0.h5 is missing.*shares"):
        commit_checkpoint(tmp_path, ckpt_id, records, {}, keep=2)
    assert not has_checkpoints(tmp_path)


def test_keep_prunes_old_complete_and_incomplete_directories(tmp_path: Path) -> None:
    for _ in range(4):
        take(tmp_path, keep=2)
    write_files(tmp_path)  # 000005 is interrupted
    take(tmp_path, keep=2)
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["000004", "000006", "latest"]
    assert resumed_id(tmp_path) == ("000006", [])
    take(tmp_path, keep=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["000007", "latest"]


def test_read_role_refuses_unknown_roles_and_swapped_files(tmp_path: Path) -> None:
    ckpt_id, _ = write_files(tmp_path)
    path = checkpoint_path(tmp_path, ckpt_id)
    shutil.copyfile(path / "replay0.h5", path / "learner0.h5")
    records = [FileRecord(p.name, p.stat().st_size, sha256_of(p)) for p in path.glob("*.h5")]
    commit_checkpoint(tmp_path, ckpt_id, records, {}, keep=2)
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    with pytest.raises(StorageError, match="holds no state for role 'ps0'"):
        checkpoint.read_role("ps0")
    with pytest.raises(StorageError, match="holds the state of role 'replay0', not 'learner0'"):
        checkpoint.read_role("learner0")
