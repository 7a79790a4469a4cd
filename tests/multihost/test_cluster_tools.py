"""tools/local_cluster.sh makes hosts with their own names and addresses, and tools/mpirun.sh
--hosts runs a command across them: ranks in blocks (or round robin), talking over TCP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..mpi.conftest import ROOT
from .conftest import HOSTS, STATE, Cluster, cluster_tool, read_holders, run_on_hosts

pytestmark = pytest.mark.mpi
SCRIPTS = Path(__file__).parent / "scripts"
RANK_AND_HOST = ["bash", "-c", "echo $OMPI_COMM_WORLD_RANK $(hostname)"]


def test_each_host_has_its_own_name_and_an_address_that_resolves(cluster: Cluster) -> None:
    addresses = set()
    for name, holder in cluster.holders.items():
        inside = subprocess.run(
            ["nsenter", "-t", str(holder), "-n", "-u", "hostname"], capture_output=True, text=True
        )
        assert inside.stdout.strip() == name
        addresses.add(socket.gethostbyname(name))
    assert len(addresses) == len(cluster.holders) >= HOSTS
    status = cluster_tool("status")
    assert status.returncode == 0
    assert all(f"{name} " in status.stdout for name in cluster.holders), status.stdout


def test_up_again_keeps_the_hosts_that_are_up(cluster: Cluster) -> None:
    again = cluster_tool("up", str(len(cluster.holders)))
    assert again.returncode == 0, again.stderr
    assert read_holders() == cluster.holders


def test_ranks_go_to_hosts_in_blocks_or_round_robin(cluster: Cluster) -> None:
    blocks = run_on_hosts(2, 4, RANK_AND_HOST, timeout=60)
    assert blocks.returncode == 0, blocks.stderr
    assert sorted(blocks.stdout.split("\n")[:-1]) == ["0 hpc1", "1 hpc1", "2 hpc2", "3 hpc2"]
    spread = run_on_hosts(2, 4, ["--map-by", "node", *RANK_AND_HOST], timeout=60)
    assert spread.returncode == 0, spread.stderr
    assert sorted(spread.stdout.split("\n")[:-1]) == ["0 hpc1", "1 hpc2", "2 hpc1", "3 hpc2"]


def test_a_send_reaches_a_rank_on_the_other_host(cluster: Cluster) -> None:
    script = str(SCRIPTS / "send_between_hosts.py")
    result = run_on_hosts(2, 4, [sys.executable, script], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "rank 3 on hpc2 got 499500 from rank 0 on hpc1" in result.stdout


def test_an_idle_rank_on_another_host_wakes_on_its_doorbell(cluster: Cluster) -> None:
    """Ranks on hpc2 wait a minute for rank 0's messages from hpc1: a ring over UDP must end
    the wait, as a ring over an abstract socket does on one host (tests/mpi/test_transport.py).
    Before, a world over several hosts had no doorbells, and every idle rank polled."""
    script = str(ROOT / "tests" / "mpi" / "scripts" / "doorbell_wakeup.py")
    result = run_on_hosts(2, 4, [sys.executable, script], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok (") == 4, result.stdout


def test_down_leaves_no_trace_and_up_builds_again(cluster: Cluster) -> None:
    if not cluster.made_here:
        pytest.skip("a cluster was up before the tests: it is left as it was")
    down = cluster_tool("down")
    assert down.returncode == 0, down.stderr
    assert not STATE.exists()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "hpcmarl-" not in namespaces
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "hpcmarl-br0" not in links and "hpcm-v" not in links
    assert "hpcmarl-local-cluster" not in Path("/etc/hosts").read_text()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in cluster.holders.values())
    assert cluster_tool("down").returncode == 0  # nothing up: fine too
    up = cluster_tool("up", str(len(cluster.holders)))
    assert up.returncode == 0, up.stderr
    cluster.holders = read_holders()
