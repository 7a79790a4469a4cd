"""slurm/train.sh outside Slurm, where a test can time its signal: Slurm's warning may come
while the ranks are still starting (a loaded node, a short remaining allocation). The script
writes it down for the commander rather than relaying it as a signal, which used to kill a rank
that had no handler yet (exit 138) or be lost before the ranks existed (the job then died at its
limit). A requeued start must not act on the last allocation's warning again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, VENV

TRAIN = ROOT / "slurm" / "train.sh"
RANKS = 4
JOB = [
    str(ROOT / "jobs" / "cartpole_dqn.yaml"),
    "commander.stop_value=null",
    "topology.collectors=2",
]


def start_script(run_dir: Path, args: list[str]) -> subprocess.Popen:
    env = {
        **os.environ,
        "HPCMARL_VENV": VENV,
        "HPCMARL_PYTHON": sys.executable,
        "HPCMARL_ROOT": str(ROOT),
        "HPCMARL_RUN_DIR": str(run_dir),
        "SLURM_NTASKS": str(RANKS),
    }
    env.pop("SLURM_JOB_ID", None)
    return subprocess.Popen(
        ["bash", str(TRAIN), *JOB, *args],
        cwd=run_dir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"train.sh did not end within {timeout:g} s:\n{out[-3000:]}")
    return out


@pytest.mark.mpi
def test_a_warning_during_start_up_checkpoints_and_a_restart_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_script(run_dir, ["commander.max_env_steps=10000000"])
    time.sleep(0.2)  # the launcher has started, the ranks have not reached their handlers
    os.kill(proc.pid, signal.SIGUSR1)  # to the batch shell only, as `--signal=B:USR1`
    out = finish(proc, 120)
    assert proc.returncode == 75, out[-3000:]
    assert "hpcmarl: finished: interrupted by SIGUSR1; checkpointed" in out, out[-3000:]
    assert "checkpointed (exit 75), not under Slurm" in out, out[-3000:]
    assert not (run_dir / ".slurm-signal").exists(), "the commander left the warning behind"

    # A warning left over from the last allocation (one that came as the ranks were exiting)
    # must not stop the restarted job at once.
    (run_dir / ".slurm-signal").write_text("SIGUSR1\n")
    proc = start_script(run_dir, ["commander.max_env_steps=3000"])
    out = finish(proc, 120)
    assert proc.returncode == 0, out[-3000:]
    assert "hpcmarl: resumed from checkpoint" in out, out[-3000:]
    assert "hpcmarl: finished: step budget reached" in out, out[-3000:]
