"""A cluster of hosts on this machine (tools/local_cluster.sh) and jobs run across it.

The tier needs root, `ip netns`, `nsenter` and `unshare`, and Open MPI; without one of them every
test here skips and says which. The cluster is brought up once per session (2 hosts) and taken
down at its end, also when a test fails; a cluster already up is used as it is and left up.
Every run has a hard timeout: a hang fails the test.

`slurm_hosts` adds a real Slurm on those hosts (`local_cluster.sh up 2 --slurm`: slurmctld and
a slurmd per host, apart from tools/install_slurm.sh's single-node one); its tests skip where
Slurm is not installed, and reach it through SLURM_CONF in their commands' environment only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..mpi.conftest import MPIRUN, ROOT, VENV, BackgroundJob, start_in_background

LOCAL_CLUSTER = ROOT / "tools" / "local_cluster.sh"
STATE = Path(os.environ.get("HPCMARL_CLUSTER_DIR", "/run/hpcmarl-cluster"))
HOSTS = int(os.environ.get("HPCMARL_TEST_HOSTS", "2"))
"""Hosts the tier brings up; the algorithm tests run across all of them (CI: 2; 4 by hand)."""
SLURM_CONF = STATE / "slurm" / "slurm.conf"


def unavailable() -> str:
    """Why this machine cannot host the test cluster, or '' when it can."""
    if not sys.platform.startswith("linux"):
        return "needs Linux network and UTS namespaces"
    if os.geteuid() != 0:
        return "needs root (network namespaces, a bridge, /etc/hosts lines); CI runs it as root"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install {package}"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make namespaces here (unshare --net --uts: {probe.stderr.strip()})"
    version = subprocess.run(
        [f"{VENV}/bin/mpirun", "--version"], capture_output=True, text=True, check=False
    )
    if "Open MPI" not in version.stdout + version.stderr and "HYDRA" not in version.stdout:
        return f"tools/mpirun.sh --hosts needs Open MPI or MPICH (Hydra); {VENV} has another MPI"
    return ""


@dataclass
class Cluster:
    """The hosts that are up: each name and the PID holding its namespaces."""

    holders: dict[str, int]
    made_here: bool = False
    """This session brought the cluster up (and takes it down); else it was up before."""

    @classmethod
    def read(cls, made_here: bool = False) -> Cluster:
        return cls(read_holders(), made_here)

    def host_of(self, pid: int) -> str | None:
        """The host whose network namespace process `pid` is in (None: not on any, or gone)."""
        try:
            net = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        for name, holder in self.holders.items():
            try:
                if os.readlink(f"/proc/{holder}/ns/net") == net:
                    return name
            except OSError:
                continue
        return None

    def processes(self, mark: str | None = None) -> dict[int, str]:
        """Every process on a host other than the holders and the Slurm daemons that
        `up --slurm` started there, with its host (ranks, their launchers' daemons); with
        `mark`, only those whose environment holds it: one job's, where other jobs share the
        hosts (the cluster's agent hands the launcher's environment to each daemon and rank)."""
        found = {}
        kept = {*self.holders.values(), *slurmd_pids()}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) not in kept:
                host = self.host_of(int(proc.name))
                if host is not None and (mark is None or in_environment(proc, mark)):
                    found[int(proc.name)] = host
        return found


def in_environment(proc: Path, entry: str) -> bool:
    """`entry` (NAME=value) is in the environment of process `proc` (/proc/PID)."""
    try:
        return entry.encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def read_holders() -> dict[str, int]:
    """Each host's name and holder PID, from the state file local_cluster.sh keeps."""
    lines = (STATE / "hosts").read_text().split("\n")
    return {name: int(pid) for name, _, pid, _ in (line.split() for line in lines if line)}


def slurmd_pids() -> list[int]:
    """The slurmd of each host, from the pid files of tools/cluster_slurm.sh (none: no Slurm)."""
    pids = []
    for pid_file in (STATE / "slurm" / "node").glob("*.pid"):
        try:
            pids.append(int(pid_file.read_text()))
        except (OSError, ValueError):
            continue
    return pids


def cluster_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LOCAL_CLUSTER), *args], capture_output=True, text=True, timeout=120
    )


def hosts_up() -> int:
    """How many hosts are up, every holder alive (0 when none, or any is dead)."""
    if cluster_tool("status").returncode != 0:
        return 0
    return len(Cluster.read().holders)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """`HOSTS` hosts for the session: brought up and, at the end, down (whatever the tests did);
    a cluster that was up already is used and left up."""
    reason = unavailable()
    if reason:
        pytest.skip(f"multi-host tier: {reason}")
    if hosts_up() >= HOSTS:
        yield Cluster.read()
        return
    try:
        up = cluster_tool("up", str(HOSTS))
        assert up.returncode == 0, f"local_cluster.sh up {HOSTS} failed:\n{up.stdout}{up.stderr}"
        yield Cluster.read(made_here=True)
    finally:
        down = cluster_tool("down")
        assert down.returncode == 0, f"local_cluster.sh down failed:\n{down.stdout}{down.stderr}"


@pytest.fixture(scope="session")
def slurm_hosts(cluster: Cluster) -> dict[str, str]:
    """Slurm on the session's hosts (added when missing, left up like the hosts): the
    environment its commands need, SLURM_CONF pointing at its config."""
    missing = [
        tool for tool in ("slurmctld", "slurmd", "munged", "sbatch") if not shutil.which(tool)
    ]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}): tools/install_slurm.sh")
    up = cluster_tool("up", str(HOSTS), "--slurm")
    assert up.returncode == 0, (
        f"local_cluster.sh up {HOSTS} --slurm failed:\n{up.stdout}{up.stderr}"
    )
    return {"SLURM_CONF": str(SLURM_CONF)}


def run_on_hosts(hosts: int, ranks: int, args: list[str], timeout: float):
    """`tools/mpirun.sh --hosts H -n R ARGS` to completion; a hang fails the test."""
    cmd = ["bash", str(MPIRUN), "--hosts", str(hosts), "-n", str(ranks), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": VENV}
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung past {timeout}s:\n{(exc.stderr or b'')[-3000:]!r}")


class ClusterJob(BackgroundJob):
    """`tools/mpirun.sh --hosts H -n R python -m hpcmarl ARGS` running while a test acts on it;
    waits, kills and the end as BackgroundJob's."""

    def __init__(self, hosts: int, ranks: int, args: list[str]) -> None:  # noqa: D107
        hpcmarl = [sys.executable, "-m", "hpcmarl", *args]
        cmd = ["bash", str(MPIRUN), "--hosts", str(hosts), "-n", str(ranks), *hpcmarl]
        self.mark = f"HPCMARL_TEST_JOB={uuid.uuid4().hex}"
        """In the environment of each process of this job: `Cluster.processes(job.mark)`."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": VENV}
        env.update([self.mark.split("=", 1)])
        self.proc = start_in_background(cmd, env)
