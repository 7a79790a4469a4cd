"""A stdout that closes (`python -m hpcmarl ... | head -3`) never stops training.

`head` exits after its lines and the pipe closes: every later print would raise BrokenPipeError.
The run must go on to its end, writing its metrics files, and exit with the run's own code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_stdout_lets_the_run_finish_with_its_own_exit_code(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = [
        "commander.max_env_steps=3000",
        "commander.stop_value=null",
        "topology.collectors=1",
        f"runtime.run_dir={run_dir}",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "hpcmarl", *job],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    head = [process.stdout.readline() for _ in range(3)]  # what `| head -3` reads
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert all(head), head
    assert process.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "finished" and rows[-1]["env_steps"] >= 3000, rows[-1]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux /dev/full")
def test_a_stdout_that_cannot_be_written_is_refused_in_one_line(tmp_path: Path) -> None:
    """`> /dev/full`: every write fails with ENOSPC. Nothing would show how the run goes, so it
    is refused at start-up, exit 2, with the fix, and leaves no run directory."""
    run_dir = tmp_path / "run"
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "hpcmarl",
                "commander.max_env_steps=200",
                f"runtime.run_dir={run_dir}",
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    err = result.stderr
    assert result.returncode == 2, err
    (line,) = err.splitlines()
    assert line.startswith("hpcmarl: error: stdout cannot be written") and "; fix: " in line, err
    assert not run_dir.exists() and os.listdir(tmp_path) == []
