"""Learner collectives under real mpirun: MPI, Horovod and torch.distributed (gloo here; NCCL
needs GPUs) against a one-process reference.

One 6-rank run per backend holds a bystander rank and two independent learner groups (2 and 3
learners); see scripts/allreduce_check.py for what each member checks. The MPI run also lets
the second group ask for `auto` with Horovod unavailable, to see the fallback and its line.
Horovod runs are skipped, with the reason, where Horovod does not import. The end-to-end runs
of test_train.py keep the job's `learner.allreduce` (`mpi` by default), so they never train
with Horovod or torch; one short CartPole run per backend here does, with two learners of one
group.
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


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    store_dir = tmp_path_factory.mktemp("stores")
    result = run_mpi(RANKS, [*SCRIPT, "torch,torch", "torch", str(store_dir)], timeout=240)
    result.stdout += f"\nstores left: {sorted(p.name for p in store_dir.iterdir())}"
    return result


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


@pytest.mark.mpi
def test_torch_backend_matches_reference_with_2_and_3_learners(
    torch_run: subprocess.CompletedProcess,
) -> None:
    """gloo on the CPU, through a file store in which a stale store was left first; the
    process group is destroyed at close, and the last member to leave removes the store."""
    check_all_ok(torch_run, "torch")
    out = torch_run.stdout
    assert "learners of policy p0 average gradients with torch (gloo, 2 ranks)" in out
    assert "learners of policy p1 average gradients with torch (gloo, 3 ranks)" in out
    assert out.endswith("stores left: []"), out[-300:]


CARTPOLE = [
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
@pytest.mark.parametrize(
    ("backend", "line"),
    [("horovod", "with horovod (2 ranks)"), ("torch", "with torch (gloo, 2 ranks)")],
)
def test_cartpole_trains_and_its_two_learners_stay_equal(
    backend: str, line: str, tmp_path: Path
) -> None:
    """`learner.allreduce=horovod` and `torch` end to end, under real mpirun: the group says
    how it averages, both learners apply the same updates (a digest mismatch after any of them
    would stop the job), and the final checkpoint holds the same update count, weights and
    optimizer state on both. torch's file store in the run directory is gone at the end."""
    if backend == "horovod" and HOROVOD_MISSING is not None:
        pytest.skip(f"{HOROVOD_MISSING}; `bash tools/install_horovod.sh` builds it")
    args = ["-m", "hpcmarl", *CARTPOLE, f"learner.allreduce={backend}"]
    result = run_mpi(5, [*args, f"runtime.run_dir={tmp_path}"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"average gradients {line}" in result.stdout, result.stdout[-3000:]
    assert not list(tmp_path.glob("*.store"))
    assert "finished: wall-time limit reached" in result.stdout, result.stdout[-3000:]
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    first, second = (flatten(checkpoint.read_role(r)["groups"]) for r in ("learner0", "learner1"))
    assert first["shared/algo/updates"] == second["shared/algo/updates"] > 0
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
