"""Learner collectives under real mpirun: MPI and Horovod against a one-process reference.

One 6-rank run per backend holds a bystander rank and two independent learner groups (2 and 3
learners); see scripts/allreduce_check.py for what each member checks. The MPI run also lets
the second group ask for `auto` with Horovod unavailable, to see the fallback and its line.
Horovod runs are skipped, with the reason, where Horovod does not import. The end-to-end runs
of test_train.py keep the job's `learner.allreduce` (`mpi` by default), so they never train
with Horovod; one short CartPole run here does, with two learners of one group.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from hpcmarl.comm import horovod
from hpcmarl.roles.state_tree import flatten
from hpcmarl.storage.checkpoint import latest_checkpoint

from .conftest import ROOT, run_mpi

# `-m mpi4py`: a failed check on one rank aborts the world instead of leaving the others waiting.
SCRIPT = ["-m", "mpi4py", str(ROOT / "tests" / "mpi" / "scripts" / "allreduce_check.py")]
RANKS = 6
HOROVOD_MISSING = horovod.unavailable_reason()


def check_all_ok(result: subprocess.CompletedProcess, backend: str) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(f"ok backend={backend} learners=2") == 2, result.stdout
    assert result.stdout.count(f"ok backend={backend} learners=3") == 3, result.stdout
    assert "0: ok (stood by)" in result.stdout


@pytest.fixture(scope="module")
def mpi_run() -> subprocess.CompletedProcess:
    # Where Horovod is installed it is hidden; where it is not, its absence is the real thing.
    env = {horovod.HIDE_VAR: "1"} if HOROVOD_MISSING is None else {}
    return run_mpi(RANKS, [*SCRIPT, "mpi,auto", "mpi"], timeout=240, env=env)


@pytest.fixture(scope="module")
def horovod_run() -> subprocess.CompletedProcess:
    if HOROVOD_MISSING is not None:
        pytest.skip(f"{HOROVOD_MISSING}; `bash tools/install_horovod.sh` builds it")
    return run_mpi(RANKS, [*SCRIPT, "horovod,auto", "horovod"], timeout=240)


@pytest.mark.mpi
def test_mpi_backend_matches_reference_with_2_and_3_learners(
    mpi_run: subprocess.CompletedProcess,
) -> None:
    check_all_ok(mpi_run, "mpi")
    assert "learners of policy p0 average gradients with mpi (2 ranks)" in mpi_run.stdout


@pytest.mark.mpi
def test_auto_falls_back_to_mpi_with_one_clear_line(mpi_run: subprocess.CompletedProcess) -> None:
    check_all_ok(mpi_run, "mpi")
    reason = f"hidden by {horovod.HIDE_VAR}=1" if HOROVOD_MISSING is None else HOROVOD_MISSING
    lines = [line for line in mpi_run.stdout.splitlines() if "policy p1" in line]
    assert len(lines) == 1, mpi_run.stdout
    assert lines[0].startswith("hpcmarl: learners of policy p1: horovod"), lines[0]
    assert lines[0].endswith(f"{reason}, using mpi (3 ranks)"), lines[0]


@pytest.mark.mpi
def test_horovod_backend_matches_reference_with_2_and_3_learners(
    horovod_run: subprocess.CompletedProcess,
) -> None:
    check_all_ok(horovod_run, "horovod")
    out = horovod_run.stdout
    assert "learners of policy p0 average gradients with horovod (2 ranks)" in out
    assert "learners of policy p1 average gradients with horovod (3 ranks)" in out  # auto


HOROVOD_CARTPOLE = [
    "learner.allreduce=horovod",
    "learner.drift_check_interval=1",  # the learners compare weight digests after every update
    "learner.updates_per_task=20",
    "topology.learners=2",
    "topology.replay_shards=1",
    "topology.collectors=1",
    "replay.learning_starts=100",
    "replay.samples_per_insert=8",
    "commander.max_env_steps=10000000",
    "commander.max_wall_time_s=12",  # not steps: an idle machine collects 1,500 in 2 s, before
    "commander.stop_value=null",  # the shard's first size report lets any learner task start
    "checkpoint.interval_s=0",
]
"""CartPole's DQN trained for 12 s, in tasks of 20 updates, both learners in its one group."""


@pytest.mark.mpi
def test_cartpole_trains_with_horovod_and_its_two_learners_stay_equal(tmp_path: Path) -> None:
    """`learner.allreduce=horovod` end to end, under real mpirun: the group says it averages
    with Horovod, both learners apply the same updates (a digest mismatch after any of them
    would stop the job), and the final checkpoint holds the same update count, weights and
    optimizer state on both."""
    if HOROVOD_MISSING is not None:
        pytest.skip(f"{HOROVOD_MISSING}; `bash tools/install_horovod.sh` builds it")
    args = ["-m", "hpcmarl", *HOROVOD_CARTPOLE, f"runtime.run_dir={tmp_path}"]
    result = run_mpi(5, args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "average gradients with horovod (2 ranks)" in result.stdout, result.stdout[-3000:]
    assert "finished: wall-time limit reached" in result.stdout, result.stdout[-3000:]
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    first, second = (flatten(checkpoint.read_role(r)["groups"]) for r in ("learner0", "learner1"))
    assert first["shared/algo/updates"] == second["shared/algo/updates"] > 0
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
