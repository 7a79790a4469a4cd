"""slurm/train.sh on a real 2-node Slurm across the hosts (`local_cluster.sh up 2 --slurm`): the
time-limit cycle of tests/slurm/test_batch.py with its ranks on both nodes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..slurm.conftest import FINAL_STATES, Submitter, start_cluster
from ..slurm.test_batch import requeued_once

pytestmark = pytest.mark.mpi
TWO_NODES = ["--nodes=2", "--ntasks-per-node=2", "--ntasks=4", "--time=5", "--signal=B:USR1@60"]
"""Two ranks per node; `--ntasks` too, since train.sh's own `#SBATCH --ntasks=16` would win
over `--ntasks-per-node` (Slurm refuses 16 tasks at 2 per node on 2 nodes). A 5-minute limit
with its warning 60 s before: slurmctld's own warning would come 210-240 s after a start (it
looks at limits every 30 s), so the test sends the same signal itself once both nodes run."""
SHORT = [
    "commander.max_wall_time_s=12",
    "commander.max_env_steps=10000000",
    "checkpoint.at_end=false",
]
"""A budget on the training clock, which the resumed run continues: it trains on to 12 s, or
stops at once when the first run's checkpoint took it past them (on a loaded machine); no
checkpoint at the end, only the one at the warning."""
QUICK = ["commander.stop_value=null", "topology.collectors=2"]
YIELD = {"OMPI_MCA_mpi_yield_when_idle": "1"}
"""Ranks that wait yield the core: the nodes offer more CPUs than the machine has, so Open MPI
counts no node as oversubscribed and its ranks would busy-poll the shared cores."""
PROGRESS = re.compile(r"hpcmarl: +\d+\.\ds  steps")


def both_hosts(log: str) -> bool:
    """The wiring printed at a start names a rank on each node."""
    return "  host hpc1: ranks " in log and "  host hpc2: ranks " in log


def test_the_time_limit_cycle_on_2_nodes(slurm_hosts: dict[str, str], tmp_path: Path) -> None:
    """Slurm's warning (what `--signal=B:USR1@60` sends to the batch shell) once ranks run on
    both nodes: a checkpoint, exit 75, a requeue of the 2-node job, and a resumed run, again on
    both nodes, that trains on to its wall-time budget in the same run directory."""
    submit = Submitter(tmp_path, slurm_hosts)
    try:
        job = submit(TWO_NODES, [*SHORT, *QUICK], YIELD)
        job.wait(
            lambda j: PROGRESS.search(j.text()) is not None or j.state in FINAL_STATES,
            150,
            "training",
        )
        job.expect(both_hosts(job.text()), "the first run's ranks were not on both nodes")
        warn = ["scancel", "--batch", "--signal=USR1", job.id]
        subprocess.run(warn, check=True, env=submit.env, timeout=30)
        job.wait_final(timeout=240)
        log = requeued_once(job)
    finally:
        submit.cancel_all()
    for line in (
        f"hpcmarl-slurm: job {job.id} restart 0 on hpc[1-2]",
        "hpcmarl: finished: interrupted by SIGUSR1; checkpointed at the time limit",
        f"hpcmarl-slurm: checkpointed at the time limit: requeueing job {job.id}",
        f"hpcmarl-slurm: job {job.id} restart 1 on hpc[1-2]",
        "hpcmarl: resumed from checkpoint",
        "hpcmarl: finished: wall-time limit reached",
    ):
        job.expect(line in log, f"no line {line!r}")
    resumed = log[log.index("restart 1 on") :]
    job.expect(both_hosts(resumed), "the resumed run's ranks were not on both nodes")
    job.expect((tmp_path / "runs" / f"hpcmarl-{job.id}" / "checkpoints" / "latest").exists(), "")


def test_the_single_node_slurm_runs_beside_it(slurm_hosts: dict[str, str]) -> None:
    """tools/install_slurm.sh (tests/slurm's cluster) finds its own daemons by their pid files:
    it used to take the hosts' slurmctld and slurmd for its own, start none, and time out."""
    problem = start_cluster()  # idempotent; SLURM_CONF for HPCMARL_SLURM_ETC, as tests/slurm
    assert not problem, problem
    single = {k: v for k, v in os.environ.items() if v != slurm_hosts["SLURM_CONF"]}
    here = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=single
    )
    hosts = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"],
        capture_output=True,
        text=True,
        env={**os.environ, **slurm_hosts},
    )
    assert here.stdout.split() == [socket.gethostname().split(".")[0]], here.stdout + here.stderr
    assert hosts.stdout.split() == ["hpc1", "hpc2"], hosts.stdout + hosts.stderr


WORLD = (
    "from mpi4py import MPI; import socket; w = MPI.COMM_WORLD; "
    "print(w.rank, w.size, socket.gethostname(), w.allreduce(w.rank), flush=True)"
)


def test_srun_pmix_starts_one_world_across_the_nodes(
    slurm_hosts: dict[str, str], tmp_path: Path
) -> None:
    """`HPCMARL_LAUNCHER=srun` starts ranks with `srun --mpi=pmix` (Slurm's PMIx, no mpirun):
    one MPI world over both nodes. Each node needs a /tmp of its own for PMIx's files, as on a
    cluster; with the hosts' shared /tmp, hpc2's tasks failed to launch (`spmix_appdir_...: File
    exists`)."""
    log = tmp_path / "world.out"
    step = f"srun --mpi=pmix -n 4 {sys.executable} -c '{WORLD}'"
    done = subprocess.run(
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2", "--ntasks=4"]
        + [f"--output={log}", "--wrap", step],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **slurm_hosts},
        cwd=tmp_path,
    )
    out = log.read_text() if log.exists() else ""
    assert done.returncode == 0, out + done.stderr
    ranks = sorted(tuple(line.split()) for line in out.splitlines() if line[:1].isdigit())
    assert ranks == [(str(r), "4", "hpc1" if r < 2 else "hpc2", "6") for r in range(4)], out
