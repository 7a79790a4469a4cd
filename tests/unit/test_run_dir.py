"""A run directory belongs to one job, and only a run directory is written into.

A second job on a directory whose job still runs is refused, naming the holder; a lock left by a
job that died is taken over with a line; a folder of the user's that is not a run is never
written (its `config.yaml` replaced, rows appended to its CSV files). A run names its run
directory when it starts and again when it ends, whatever ended it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcmarl.launch import run
from hpcmarl.launch.run_lock import LOCK_NAME, MARKER_NAME

from ..mpi.conftest import progress_rows, run_local

QUICK = ["commander.stop_value=null", "commander.max_env_steps=200", "topology.collectors=1"]
LONG = [
    "commander.stop_value=null",
    "commander.max_env_steps=10000000",
    "commander.progress_interval_s=0.5",
    "topology.collectors=1",
]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("hpcmarl: error: ")]


def check_run_dir_named_at_start_and_end(out: str, run_dir: Path) -> None:
    """Issue 34: the run directory is printed at start (once, before the wiring diagram) and
    again after the `finished:` line, so that a user finds the run's files from either end."""
    lines = out.splitlines()
    named = [i for i, line in enumerate(lines) if line == f"hpcmarl: run directory: {run_dir}"]
    wiring = next(i for i, line in enumerate(lines) if line.startswith("hpcmarl: topology for"))
    finished = max(i for i, line in enumerate(lines) if line.startswith("hpcmarl: finished:"))
    assert len(named) == 2 and named[0] < wiring and named[1] == finished + 1, out[-3000:]


def test_a_second_job_on_a_running_run_directory_is_refused_naming_its_holder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.Popen(  # named relative to its working directory: printed absolute
        [sys.executable, "-m", "hpcmarl", *LONG, "runtime.run_dir=run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )
    try:
        ready = progress_rows(run_dir, 1)
        deadline = time.monotonic() + 60
        while not ready() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready(), first.communicate(timeout=5)
        code = run.run_job(None, [*QUICK, f"runtime.run_dir={run_dir}"])
        lines = error_lines(capsys.readouterr().err)
        assert code == 2
        assert len(lines) == 1, lines
        assert f"PID {first.pid} on host {socket.gethostname()}" in lines[0]
        assert "in use by another hpcmarl job" in lines[0] and "; fix: " in lines[0]
        assert first.poll() is None, "the refused job disturbed the running one"
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 75, err[-2000:]
    check_run_dir_named_at_start_and_end(out, run_dir)
    assert json.loads((run_dir / LOCK_NAME).read_text() or "{}") == {}, "lock not released"


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / MARKER_NAME).write_text("")
    gone = subprocess.Popen(["true"])
    gone.wait()
    holder = {"host": socket.gethostname(), "pid": gone.pid}
    (run_dir / LOCK_NAME).write_text(json.dumps(holder))
    result = run_local(["-m", "hpcmarl", *QUICK, f"runtime.run_dir={run_dir}"], timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        f"taking over the stale lock of {run_dir}: PID {gone.pid} on {socket.gethostname()}"
        in result.stdout
    )
    assert "hpcmarl: finished:" in result.stdout
    check_run_dir_named_at_start_and_end(result.stdout, run_dir)


def test_a_folder_of_the_users_is_refused_and_left_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    files = {"config.yaml": "my: settings\n", "progress.csv": "a,b\n1,2\n", "metrics.jsonl": ""}
    for name, text in files.items():
        (mine / name).write_text(text)
        (mine / name).chmod(0o664)
    code = run.run_job(None, [*QUICK, f"runtime.run_dir={mine}"])
    lines = error_lines(capsys.readouterr().err)
    assert code == 2
    assert len(lines) == 1 and "is not an hpcmarl run" in lines[0] and "; fix: " in lines[0]
    assert sorted(os.listdir(mine)) == sorted(files)
    for name, text in files.items():
        assert (mine / name).read_text() == text
        assert (mine / name).stat().st_mode & 0o777 == 0o664
    assert sorted(os.listdir(tmp_path)) == ["mine"]


RAISING_ENV = """
import gymnasium
import numpy as np
from gymnasium import spaces


class Raising(gymnasium.Env):
    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("this env breaks at reset")


gymnasium.register("Raising-v0", entry_point=Raising)
"""


def test_a_failure_during_start_up_writes_nothing_in_the_working_directory(
    tmp_path: Path,
) -> None:
    """A crash (not a user error) before the run directory exists left ./runs/logs behind in
    whatever directory the job was started from."""
    cwd, mods, run_dir = tmp_path / "cwd", tmp_path / "mods", tmp_path / "run"
    cwd.mkdir()
    mods.mkdir()
    (mods / "raising_env.py").write_text(RAISING_ENV)
    path = os.pathsep.join([str(mods), str(Path(__file__).resolve().parents[2])])
    result = run_local(
        ["-m", "hpcmarl", "env.id=raising_env:Raising-v0", f"runtime.run_dir={run_dir}"],
        timeout=60,
        env={"PYTHONPATH": path},
        cwd=cwd,
    )
    assert result.returncode == 1
    lines = [x for x in result.stderr.splitlines() if x.startswith("hpcmarl: failed:")]
    assert len(lines) == 1 and "this env breaks at reset" in lines[0], result.stderr
    assert os.listdir(cwd) == []
    traceback = lines[0].split("[traceback: ")[1].rstrip("]")
    assert "this env breaks at reset" in Path(traceback).read_text()
    Path(traceback).unlink()
