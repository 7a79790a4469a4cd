"""Every rank exits with the run's code, not only the one `mpirun` happens to report.

Open MPI's `mpirun` returns the first non-zero code of any rank, so a rank that wrongly exits 0
hides behind the commander's 75. Each rank here runs under a wrapper that records its own
code, as a launcher that keeps per-task codes (`srun`) would. Open MPI also terminates the
ranks still exiting once one has exited non-zero, which would record 143 for them; told to
treat a non-zero exit as normal (as `srun` does by default), it lets every rank end by itself,
and then reports 0 itself (mpirun's own 75 is checked in tests/checkpoint/test_resume.py).
"""

from __future__ import annotations

import signal
import stat
from pathlib import Path

import pytest

from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import probe_env
from hpcmarl.launch.topology import build_topology

from .conftest import BackgroundJob, progress_rows

RANKS = 3
JOB = [
    "commander.stop_value=null",
    "commander.max_env_steps=10000000",
    "commander.progress_interval_s=1",
    "topology.learners=1",
    "topology.collectors=1",
    "replay.learning_starts=200",
    "checkpoint.interval_s=0",
]
LET_RANKS_EXIT = {"PRTE_MCA_rtos": "error-nonzero-status=false"}
"""Open MPI: a rank's non-zero exit does not terminate the others (MPICH ignores this)."""
RECORD_EXIT = """#!/usr/bin/env bash
# Run one rank's command and write its exit code to DIR/rank<N>. The trap keeps this shell
# alive through the signal the test sends, so that it outlives the rank it records.
dir=$1; shift
trap : USR1 TERM INT
"$@"
code=$?
echo "$code" > "$dir/rank${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-x}}"
exit "$code"
"""


def learner_only_ranks() -> list[int]:
    """Ranks of this job's placement that host a learner and nothing else."""
    cfg = load_job(None, JOB)
    topology = build_topology(RANKS, cfg.topology, probe_env(cfg).training_groups())
    return [
        rank
        for rank in range(RANKS)
        if [topology.kind_of[name] for name in topology.roles_on(rank)] == ["learner"]
    ]


@pytest.mark.mpi
def test_every_rank_exits_75_after_a_signal_checkpoint(tmp_path: Path) -> None:
    assert learner_only_ranks(), "the job no longer places a rank with only a learner"
    run_dir, codes = tmp_path / "run", tmp_path / "codes"
    codes.mkdir()
    wrapper = tmp_path / "record_exit.sh"
    wrapper.write_text(RECORD_EXIT)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    args = [*JOB, f"runtime.run_dir={run_dir}"]
    job = BackgroundJob(RANKS, args, [str(wrapper), str(codes)], LET_RANKS_EXIT)
    job.wait_for(progress_rows(run_dir, 1), 60, "a progress row")
    job.signal(signal.SIGUSR1)  # Slurm's warning; TERM takes the same path in the commander
    out, err = job.finish(60, "it did not stop after SIGUSR1")
    assert "checkpointed at the time limit" in out, out[-2000:] + err[-2000:]
    by_rank = {p.name: p.read_text().strip() for p in sorted(codes.iterdir())}
    assert by_rank == {f"rank{r}": "75" for r in range(RANKS)}, err[-2000:]
