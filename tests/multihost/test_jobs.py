"""hpcmarl across two hosts of tools/local_cluster.sh: the default job runs with its ranks on
both hosts, and a rank killed on the second host ends the job on every host within seconds."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from hpcmarl.testing.ranks import rank_pids

from ..mpi.conftest import progress_rows
from .conftest import Cluster, ClusterJob

pytestmark = pytest.mark.mpi
DEFAULT_JOB = ["commander.max_env_steps=6000", "commander.stop_value=null"]
ENDLESS = ["commander.max_env_steps=200000", "commander.stop_value=null"]


def rank_hosts(cluster: Cluster, run_dir: Path) -> dict[int, str | None]:
    return {rank: cluster.host_of(pid) for rank, pid in sorted(rank_pids(run_dir).items())}


def test_the_default_job_runs_at_8_ranks_on_2_hosts(cluster: Cluster, tmp_path: Path) -> None:
    job = ClusterJob(2, 8, [*DEFAULT_JOB, f"runtime.run_dir={tmp_path}"])
    job.wait_for(progress_rows(tmp_path, 1), 150, "a progress row")
    hosts = rank_hosts(cluster, tmp_path)
    out, err = job.finish(150, "the default job across 2 hosts did not end")
    assert job.returncode == 0, err[-3000:]
    assert "hpcmarl: finished: step budget reached" in out
    assert hosts == {rank: "hpc1" if rank < 4 else "hpc2" for rank in range(8)}  # in blocks
    assert "  host hpc1: ranks 0-3 (commander, " in out  # the wiring names each host's ranks
    assert "  host hpc2: ranks 4-7 (" in out
    # Placed by host, not by rank number: each host trains (a learner and its shard), where
    # block mapping left host 2 without a learner.
    wiring = [line for line in out.splitlines() if line.startswith("  host hpc")]
    assert len(wiring) == 2, wiring
    assert all("learner" in line and "replay" in line for line in wiring), wiring


def test_kill_9_of_a_rank_on_host_2_ends_the_job_on_every_host(
    cluster: Cluster, tmp_path: Path
) -> None:
    wiring = "runtime.print_wiring=full"  # a line per rank, whose roles the failed line names
    job = ClusterJob(2, 8, [*ENDLESS, wiring, f"runtime.run_dir={tmp_path}"])
    job.wait_for(progress_rows(tmp_path, 1), 150, "a progress row")
    on_host_2 = [rank for rank, host in rank_hosts(cluster, tmp_path).items() if host == "hpc2"]
    assert on_host_2, rank_hosts(cluster, tmp_path)
    assert set(cluster.processes(job.mark).values()) == {"hpc1", "hpc2"}  # the mark finds it
    victim = on_host_2[0]
    pid = rank_pids(tmp_path)[victim]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    out, err = job.finish(30, f"kill -9 of rank {victim} on hpc2 did not end the job")
    took = time.monotonic() - killed
    print(f"ended {took:.1f} s after kill -9 of rank {victim} on hpc2, exit {job.returncode}")
    assert job.returncode != 0
    assert took < 10
    # The launcher names the rank, its roles (as the wiring printed them) and its host.
    roles = re.search(rf"^  rank +{victim}: (.+)$", out, re.MULTILINE)
    assert roles, out[-3000:]
    named = f"hpcmarl: failed: rank {victim} ({roles[1]}) on host hpc2, pid {pid}: killed by"
    lines = [line.strip("\x00 ") for line in err.splitlines()]  # Open MPI writes NUL bytes
    failed = [line for line in lines if line.startswith("hpcmarl: failed:")]
    # Open MPI reports the killed rank, unless a peer that saw its socket close aborted first:
    # then the line names that peer and what it lost (both seen here, the second 1 run in 2).
    lost_peer = re.compile(
        r"hpcmarl: failed: rank \d+ \(.+\) on host hpc\d lost its connection to another rank"
    )
    assert len(failed) == 1, err[-3000:]
    assert failed[0].startswith(f"{named} signal 9 (SIGKILL)") or lost_peer.match(failed[0]), err[
        -3000:
    ]
    deadline = time.monotonic() + 5  # mpirun has returned; nothing of the job may stay on a host
    while cluster.processes(job.mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not cluster.processes(job.mark), f"left on the hosts: {cluster.processes(job.mark)}"


def test_a_collector_rank_lost_on_host_2_is_survived(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime.fault_tolerance=collectors across hosts: rank 5 on hpc2 (collector1 and
    collector9, nothing else) kills itself early, and the run goes on to its budget."""
    monkeypatch.setenv("HPCMARL_FAULT", "collector1:300:kill")
    args = ["commander.max_env_steps=4000", "commander.stop_value=null"]
    job = ClusterJob(
        2, 8, [*args, "runtime.fault_tolerance=collectors", f"runtime.run_dir={tmp_path}"]
    )
    out, err = job.finish(200, "a run that lost a collector rank on hpc2 did not end")
    assert job.returncode == 0, err[-3000:]
    assert "hpcmarl: lost rank 5 (collector1, collector9) on host hpc2; going on with 8" in out
    assert "hpcmarl: finished: step budget reached" in out
    assert not cluster.processes(job.mark), f"left on the hosts: {cluster.processes(job.mark)}"
