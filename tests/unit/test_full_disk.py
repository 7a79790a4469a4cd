"""A full disk under a checkpoint is named in one line, with the bytes needed, no h5py traceback.

The disk is a small tmpfs mounted for the test (root only: skipped elsewhere), so nothing real
fills up. The run's first checkpoint, at its step budget, needs more than it holds: at 200 KiB
the first file is refused before HDF5 starts; at 700 KiB each file fits alone and the disk
fills inside HDF5's writes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def disk_of(size: str, tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("this container may not mount a tmpfs")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.parametrize(
    "size",
    [
        "200k",  # too small for ps0's file: refused before HDF5 starts
        # Room for each file alone (the learner's, the largest, about 540 KB), not for all five
        # written at once: the disk fills inside HDF5's writes. That printed h5py's finalizer
        # tracebacks, a RuntimeError line from another writer, then segfaulted (exit 139).
        "700k",
    ],
)
def test_a_full_disk_at_a_checkpoint_is_one_failed_line_with_the_bytes(
    size: str, tmp_path: Path
) -> None:
    with disk_of(size, tmp_path) as disk:
        check_one_line(disk / "run", tmp_path)


def check_one_line(run_dir: Path, tmp_path: Path) -> None:
    job = [
        "commander.max_env_steps=500",
        "commander.stop_value=null",
        "topology.collectors=1",
        f"runtime.run_dir={run_dir}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "hpcmarl", *job],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    err = result.stderr
    assert result.returncode == 1, err
    (line,) = [line for line in err.splitlines() if line.startswith("hpcmarl: failed: ")]
    assert f"no space left on the disk of {run_dir}" in line, line
    assert " bytes" in line and "; fix: free " in line, line
    assert "Traceback" not in err and "h5py" not in err, err
    assert not [p for p in run_dir.rglob("*.tmp")], "temporary files left on the full disk"
