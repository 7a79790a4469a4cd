"""Failures end the job quickly and clearly: a role that raises or is killed, a stopped rank, a
bad job, a world too small.

Every run has a hard timeout: a hang fails the test. A role's failure must end every rank with
a non-zero exit and one line naming rank, role and cause.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hpcmarl.testing.ranks import rank_pids

from ..mpi.conftest import VENV, BackgroundJob, progress_rows, run_local, run_mpi

SHORT = ["commander.max_env_steps=200000", "commander.stop_value=null"]


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("role", "poll"),
    [
        ("commander", 400),
        ("param_server", 300),
        ("replay_shard", 300),
        ("learner", 300),
        ("collector", 300),
    ],
)
def test_an_exception_in_any_role_ends_the_job(tmp_path: Path, role: str, poll: int) -> None:
    result = run_mpi(
        5,
        ["-m", "hpcmarl", *SHORT, f"runtime.run_dir={tmp_path}"],
        timeout=90,
        env={"HPCMARL_FAULT": f"{role}:{poll}"},
    )
    assert result.returncode != 0
    lines = [x.strip("\x00 ") for x in result.stderr.splitlines()]
    line = [x for x in lines if x.startswith("hpcmarl: failed: rank")]
    assert line, (
        f"rc={result.returncode}\n{result.stderr[-3000:]}\n--- stdout:\n{result.stdout[-3000:]}"
    )
    assert "injected fault in" in line[0] and "RuntimeError" in line[0]
    assert list((tmp_path / "logs").glob("rank*.traceback"))


def test_an_exception_in_one_process_ends_it(tmp_path: Path) -> None:
    result = run_local(
        ["-m", "hpcmarl", *SHORT, f"runtime.run_dir={tmp_path}"],
        timeout=90,
        env={"HPCMARL_FAULT": "learner:300"},
    )
    assert result.returncode == 1
    assert "hpcmarl: failed: rank 0 (learner0): RuntimeError: injected fault" in result.stderr


@pytest.mark.mpi
def test_bad_job_key_is_one_line_on_every_rank_count(tmp_path: Path) -> None:
    result = run_mpi(3, ["-m", "hpcmarl", "learner.lrr=0.1"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    errors = [x for x in result.stderr.splitlines() if x.startswith("hpcmarl: error:")]
    assert len(errors) == 1 and "did you mean learner.lr" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.mpi
def test_world_too_small_names_the_fix(tmp_path: Path) -> None:
    result = run_mpi(3, ["-m", "hpcmarl", "topology.colocate=false"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    # topology.collectors=auto without co-location: the other roles' 6 ranks and one collector
    assert "needs 7 ranks" in result.stderr and "mpirun -n 7" in result.stderr


def test_unknown_environment_suggests_close_names(tmp_path: Path) -> None:
    result = run_local(["-m", "hpcmarl", "env.id=CartPol-v1"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert "CartPole-v1" in result.stderr and "Traceback" not in result.stderr


ONE_ROLE_PER_RANK = [
    "topology.param_servers=1",
    "topology.replay_shards=1",
    "topology.learners=1",
    "topology.collectors=2",
    "topology.colocate=false",
]
"""Six ranks: commander, ps0, replay0, learner0, collector0, collector1 on ranks 0 to 5."""


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("role", "rank"),
    [("commander", 0), ("ps0", 1), ("replay0", 2), ("learner0", 3), ("collector1", 5)],
)
def test_kill_9_of_any_role_ends_the_job_within_10_s_without_orphans(
    tmp_path: Path, role: str, rank: int
) -> None:
    job = BackgroundJob(6, [*SHORT, *ONE_ROLE_PER_RANK, f"runtime.run_dir={tmp_path}"])
    job.wait_for(progress_rows(tmp_path, 1), 120, "a progress row")
    pids = rank_pids(tmp_path)
    assert len(pids) == 6, pids
    os.kill(pids[rank], signal.SIGKILL)
    killed = time.monotonic()
    _, err = job.finish(30, f"kill -9 of {role} (rank {rank}) did not end the job")
    took = time.monotonic() - killed
    print(f"job ended {took:.1f} s after kill -9 of {role} (rank {rank})")
    assert job.returncode != 0
    assert took < 10
    # No rank survives to say so: the launcher names the rank, its roles and its host (MPICH's
    # mpiexec names no rank: there only that a rank was killed).
    host = socket.gethostname()
    named = f"hpcmarl: failed: rank {rank} ({role}) on host {host}, pid {pids[rank]}: killed by"
    if not open_mpi():
        named = "hpcmarl: failed: a rank (MPICH's mpiexec names none; its BAD TERMINATION lines"
        named += " on stdout name the host): killed by"
    lines = [line.strip("\x00 ") for line in err.splitlines()]  # Open MPI writes NUL bytes
    failed = [line for line in lines if line.startswith("hpcmarl: failed:")]
    assert len(failed) == 1 and failed[0].startswith(f"{named} signal 9 (SIGKILL)"), err[-3000:]
    deadline = time.monotonic() + 5  # the launcher has returned; its ranks must be gone too
    while rank_pids(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not rank_pids(tmp_path), f"orphaned ranks: {rank_pids(tmp_path)}"


def open_mpi() -> bool:
    """The launcher is Open MPI's (as tools/mpirun.sh tells)."""
    version = subprocess.run([f"{VENV}/bin/mpirun", "--version"], capture_output=True, text=True)
    return "Open MPI" in version.stdout + version.stderr


@pytest.mark.mpi
def test_a_stopped_collector_is_named_within_the_heartbeat_timeout(tmp_path: Path) -> None:
    layout = ONE_ROLE_PER_RANK
    heartbeat = ["runtime.heartbeat_interval_s=1", "runtime.heartbeat_timeout_s=6"]
    job = BackgroundJob(6, [*SHORT, *layout, *heartbeat, f"runtime.run_dir={tmp_path}"])
    job.wait_for(progress_rows(tmp_path, 1), 120, "a progress row")
    os.kill(rank_pids(tmp_path)[5], signal.SIGSTOP)  # rank 5 hosts collector1 alone
    stopped = time.monotonic()
    _, err = job.finish(60, "a silent collector was never noticed")
    print(f"job ended {time.monotonic() - stopped:.1f} s after SIGSTOP")
    assert job.returncode != 0
    assert "no heartbeat for 6 s from collector1 (rank 5)" in err


def test_an_algorithm_that_does_not_fit_the_action_space_is_refused(tmp_path: Path) -> None:
    result = run_local(["-m", "hpcmarl", "env.id=Pendulum-v1"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert "Pendulum-v1" in result.stderr or "Discrete" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
