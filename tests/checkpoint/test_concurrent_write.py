"""A checkpoint written while the run goes on: with the replay shards' writes slowed to a few
seconds (as a big table on a slow filesystem would take), collectors keep collecting and
learners keep learning between the cut and the commit, heartbeats keep the run alive, and the
committed checkpoint holds the state at the cut, from which the run resumes."""

from __future__ import annotations

import json
from pathlib import Path

from ..mpi.conftest import run_local, run_mpi

WRITE_DELAY_S = 24.0
HEARTBEAT_TIMEOUT_S = 20.0
"""Shorter than the write, so a role stalled by it would fail the run; longer than the ranks'
start-up (torch imported, envs built), since the commander counts silence from its own start:
6 s on a loaded 2-core node, over 10 s while the Slurm suite's time-limit jobs start beside
this test (the suite's first)."""


def records(run_dir: Path) -> list[dict]:
    return [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_work_goes_on_while_a_slow_checkpoint_is_written(tmp_path: Path) -> None:
    args = [
        "-m",
        "hpcmarl",
        "commander.stop_value=null",
        "commander.max_env_steps=8000",
        "commander.progress_interval_s=0.5",
        "checkpoint.interval_s=3",
        "replay.learning_starts=200",
        "runtime.heartbeat_interval_s=0.5",
        f"runtime.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
        f"runtime.run_dir={tmp_path}",
    ]
    # The first checkpoint is the slow one; the later ones (every 3 s, and at the end) need
    # not wait again.
    env = {"HPCMARL_FAULT_WRITE_DELAY": f"replay_shard:{WRITE_DELAY_S}:1"}
    done = run_mpi(5, args, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "while work went on)" in done.stdout, done.stdout[-3000:]
    rows = records(tmp_path)
    first = next(i for i, r in enumerate(rows) if r["kind"] == "checkpoint")
    cut = rows[first]
    assert cut["write_s"] >= WRITE_DELAY_S and cut["bytes"] > 0
    # Progress reported between the cut and the commit (the checkpoint row is written at the
    # commit) shows env steps and updates made after the cut.
    during = [r for r in rows[:first] if r["kind"] == "progress"][-1]
    assert during["env_steps"] > cut["env_steps"], (during, cut)
    finished = rows[-1]
    assert finished["kind"] == "finished" and "step budget reached" in finished["reason"]
    # The final checkpoint is the end state, not a cut the run had moved past.
    last = [r for r in rows if r["kind"] == "checkpoint"][-1]
    assert last["env_steps"] >= 8000
    again = run_local(["-m", "hpcmarl", "resume", str(tmp_path)], timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from checkpoint {last['id']} at {last['env_steps']} env steps" in again.stdout
