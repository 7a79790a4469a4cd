"""A TERM or Ctrl-C to `tools/mpirun.sh` checkpoints the run and exits 75, as a Slurm warning does.

Open MPI's mpirun ends every rank at once on TERM, INT and HUP; mpirun.sh keeps mpirun out of
its process group and passes those signals on to the commander instead (tools/mpirun.sh).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint
from hpcmarl.testing.ranks import rank_pids

from .conftest import BackgroundJob, progress_rows

LONG = [
    "commander.stop_value=null",
    "commander.max_env_steps=10000000",
    "commander.progress_interval_s=1",
    "checkpoint.interval_s=0",
]


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("sig", "to"),
    [
        (signal.SIGTERM, "mpirun.sh"),
        (signal.SIGINT, "its process group"),
        (signal.SIGTERM, "rank 1"),
    ],
)
def test_a_signal_checkpoints_and_exits_75(tmp_path: Path, sig: int, to: str) -> None:
    """`kill PID` of the launcher, a terminal's Ctrl-C (to the foreground process group), or a
    TERM to one rank that does not host the commander: each is passed on to the commander."""
    run_dir = tmp_path / "run"
    job = BackgroundJob(4, [*LONG, f"runtime.run_dir={run_dir}"])
    job.wait_for(progress_rows(run_dir, 1), 90, "a progress row")
    if to == "mpirun.sh":
        os.kill(job.proc.pid, sig)
    elif to == "its process group":
        job.signal(sig)
    else:
        os.kill(rank_pids(run_dir)[1], sig)
    name = signal.Signals(sig).name
    out, err = job.finish(90, f"it did not stop after {name} to {to}")
    assert job.returncode == 75, out[-2000:] + err[-3000:]
    assert f"hpcmarl: finished: interrupted by {name}; checkpointed" in out, out[-2000:]
    if to == "rank 1":
        assert f"hpcmarl: rank 1 got {name}: asked the commander to checkpoint" in out
    checkpoint, skipped = latest_checkpoint(run_dir)
    assert checkpoint is not None and not skipped
    assert {"commander", "learner0"} <= set(checkpoint.roles())
