"""Start-up checks across hosts (launch/hosts.py) on two hosts of tools/local_cluster.sh: a run
directory that the second host does not share ends the job at start-up with one line naming that
host, exit 2 on every rank, and leaves nothing behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import Cluster, run_on_hosts

pytestmark = pytest.mark.mpi
PRIVATE = Path(__file__).parent / "scripts" / "private_run_dir.sh"
JOB = ["commander.max_wall_time_s=30", "commander.stop_value=null", "topology.collectors=1"]


def test_a_run_dir_host_2_does_not_share_is_refused_in_one_line(
    cluster: Cluster, tmp_path: Path
) -> None:
    folder = tmp_path / "node-local"
    folder.mkdir()
    run_dir = folder / "run"
    hpcmarl = [sys.executable, "-m", "hpcmarl", f"runtime.run_dir={run_dir}", *JOB]
    wrapped = ["bash", str(PRIVATE), "hpc2", str(folder), str(run_dir), *hpcmarl]
    result = run_on_hosts(2, 2, wrapped, timeout=120)  # rank 0 on hpc1, rank 1 on hpc2
    errors = [line for line in result.stderr.splitlines() if line.startswith("hpcmarl: error")]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert errors == [
        f"hpcmarl: error: the run directory {run_dir} is not shared: hpc2 cannot see it "
        f"(rank 1 wrote {run_dir}/.probe-hpc2, rank 0 does not find it); fix: put "
        "runtime.run_dir on a filesystem every node mounts (a shared home, project or parallel "
        "filesystem; not /tmp or a node-local disk), as an absolute path"
    ], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert list(folder.iterdir()) == []  # rank 0 removed the run directory it made
