"""`python -m hpcmarl scale RUN_DIR collectors=-N|+N` on a running job (one process).

Retired collectors end the task in hand and take no other; `+N` puts them back to work; the
run says what it did and records `scale` rows. A request to a directory without a running job
is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcmarl.launch.scaling import take_requests, write_request

from ..mpi.conftest import ROOT

JOB = ["commander.max_env_steps=10000000", "commander.stop_value=null", "topology.collectors=3"]
"""Endless: the test ends it with SIGTERM once it has seen what it looks for (a step budget
either ended it before the requests on a fast machine or outlived the timeout on a loaded one)."""


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(check, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.3)


def reported_after_the_last_scale(run_dir: Path, collector: str) -> bool:
    rows = metrics(run_dir)
    last = max(i for i, row in enumerate(rows) if row["kind"] == "scale")
    return any(row.get("collector") == collector for row in rows[last:])


def scale(run_dir: Path, request: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcmarl", "scale", str(run_dir), request],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_collectors_retire_and_come_back_in_a_running_job(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(
        [sys.executable, "-m", "hpcmarl", *JOB, f"runtime.run_dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: any(r["kind"] == "progress" for r in metrics(tmp_path)), 120, "progress")
        assert scale(tmp_path, "collectors=-2").returncode == 0
        wait_for(lambda: any(r["kind"] == "scale" for r in metrics(tmp_path)), 30, "a retirement")
        time.sleep(3)  # the retired collectors end their tasks in hand
        assert scale(tmp_path, "collectors=+1").returncode == 0
        wait_for(lambda: len([r for r in metrics(tmp_path) if r["kind"] == "scale"]) == 2, 30, "+1")
        wait_for(lambda: reported_after_the_last_scale(tmp_path, "collector2"), 120, "collector2")
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 75, err[-3000:]  # stopped by the signal, checkpointed
    assert "hpcmarl: scale: collectors -2: collector1, collector2 retired" in out
    assert "hpcmarl: scale: collectors +1: collector2 back at work; 2 collectors at work" in out
    rows = metrics(tmp_path)
    retire, back = [r for r in rows if r["kind"] == "scale"]
    assert retire["moved"] == ["collector1", "collector2"] and retire["at_work"] == 1
    assert back["moved"] == ["collector2"] and back["at_work"] == 2
    # Between the two requests collector1 reported at most the task it had in hand.
    i, j = rows.index(retire), rows.index(back)
    reports = {r["env_steps"] for r in rows[i:j] if r.get("collector") == "collector1"}
    assert len(reports) <= 1, reports
    later = {r["env_steps"] for r in rows[j:] if r.get("collector") == "collector1"}
    assert len(later) <= 1, later  # still retired: at most the task reported late
    assert any(r.get("collector") == "collector2" for r in rows[j:]), "collector2 works again"


def test_scale_refuses_a_directory_without_a_running_job(tmp_path: Path) -> None:
    result = scale(tmp_path / "nothing", "collectors=-1")
    assert result.returncode == 2
    assert "is not a run directory" in result.stderr
    bad = scale(tmp_path, "learners=+1")
    assert bad.returncode == 2 and "usage: python -m hpcmarl scale" in bad.stderr


def test_requests_are_taken_oldest_first_and_once(tmp_path: Path) -> None:
    write_request(str(tmp_path), {"collectors": -1})
    write_request(str(tmp_path), {"collectors": 2})
    (tmp_path / "control" / "0-junk.json").write_text("not json")
    taken = take_requests(str(tmp_path))
    assert "error" in taken[0] and taken[1:] == [{"collectors": -1}, {"collectors": 2}]
    assert take_requests(str(tmp_path)) == []
