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
