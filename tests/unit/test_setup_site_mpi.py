"""`tools/setup.sh --mpi site` without a usable site MPI: one line naming the fix, exit 2, and
nothing made, before any virtualenv or download (the whole site path runs in CI's
`make test-site-mpi`, on Debian's MPICH)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "tools" / "setup.sh"
BASH = shutil.which("bash") or "/bin/bash"


def setup_site(path: Path, **env: str) -> subprocess.CompletedProcess:
    """The set-up with PATH holding only `path` (plus the tools the script needs first), so
    that no mpicc of this machine (Debian's alternatives, a venv's) can be found."""
    for tool in ("dirname", "readlink"):
        found = shutil.which(tool)
        assert found is not None, tool
        (path / tool).symlink_to(found)
    full_env = {"PATH": str(path), "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run(
        [BASH, str(SETUP), "--mpi", "site"],
        capture_output=True,
        text=True,
        timeout=30,
        env=full_env,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("env", "missing"), [({}, "no mpicc on PATH"), ({"MPICC": "mpicc.absent"}, "no mpicc.absent")]
)
def test_no_mpicc_is_one_line_naming_module_load_or_mpicc(
    tmp_path: Path, env: dict[str, str], missing: str
) -> None:
    before = (ROOT / ".venv-site").exists()
    result = setup_site(tmp_path, **env)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert missing in lines[0]
    assert "fix: module load" in lines[0] and "MPICC=/path/to/mpicc" in lines[0]
    assert (ROOT / ".venv-site").exists() == before


def test_an_mpicc_without_a_launcher_beside_it_names_mpiexec(tmp_path: Path) -> None:
    mpicc = tmp_path / "mpicc"
    mpicc.write_text("#!/bin/sh\n")
    mpicc.chmod(0o755)
    result = setup_site(tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"no mpiexec or mpirun next to {mpicc}" in lines[0]
    assert "fix: set MPIEXEC=/path/to/mpiexec" in lines[0]
