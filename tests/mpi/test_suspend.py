"""A job suspended whole (`scontrol suspend`, Ctrl-Z: SIGSTOP to every rank, later SIGCONT)
goes on where it was: the commander sees the gap on its own clock and restarts the heartbeat
clocks instead of ending a healthy job for "no heartbeat" (it named roles on its own rank)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hpcmarl.testing.ranks import rank_pids

from .conftest import BackgroundJob

HEARTBEAT_TIMEOUT_S = 15
"""Not less: on 2 cores at load 12-16, ranks still starting were not heard from for 10 s."""
STOPPED_S = HEARTBEAT_TIMEOUT_S + 3


def env_steps(run_dir: Path) -> int:
    """Env steps of the last progress row (0 before the first)."""
    progress = run_dir / "progress.csv"
    if not progress.exists():
        return 0
    header, *rows = progress.read_text().splitlines()
    return int(rows[-1].split(",")[header.split(",").index("env_steps")]) if rows else 0


def ended(job: BackgroundJob) -> bool:
    return job.proc.poll() is not None


@pytest.mark.mpi
def test_a_job_stopped_and_continued_whole_goes_on(tmp_path: Path) -> None:
    args = [
        "commander.stop_value=null",
        "commander.max_env_steps=10000000",
        "commander.max_wall_time_s=25",
        "commander.progress_interval_s=1",
        "checkpoint.interval_s=0",
        "runtime.heartbeat_interval_s=1",
        f"runtime.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
        f"runtime.run_dir={tmp_path}",
    ]
    job = BackgroundJob(4, args)
    job.wait_for(lambda: env_steps(tmp_path) > 0 or ended(job), 90, "env steps")
    assert not ended(job), "".join(job.finish(5, "ended"))[-3000:]
    pids = rank_pids(tmp_path)
    assert len(pids) == 4, pids
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    time.sleep(STOPPED_S)
    os.kill(pids[0], signal.SIGCONT)  # the commander goes on a second before its peers
    time.sleep(1.0)
    for rank in sorted(pids)[1:]:
        os.kill(pids[rank], signal.SIGCONT)
    out, err = job.finish(120, "the job did not end after SIGCONT")
    assert job.returncode == 0, out[-2000:] + err[-3000:]
    suspended = out.find("hpcmarl: the job was suspended for")
    assert 0 <= suspended < out.find("hpcmarl: finished: wall-time limit reached"), out[-3000:]
