"""Progress lines on stdout and the same rows in `progress.csv`, `metrics.jsonl` and the loggers.

Batch jobs write stdout to a file, so progress is plain lines, flushed, never carriage-return
bars. The CSV holds the progress columns only (with one `eval_return/<agent>` column per agent
of a multi-agent job, beside the team return); the JSONL holds every row kind (progress and
evaluation) with all its fields, for scripts; the job's loggers (`runtime.loggers`: TensorBoard
in `tb/` by default, W&B, MLflow; see loggers.py) get the numbers of progress, evaluation and
learner rows as scalars, for people watching a run.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from .loggers import Loggers

PROGRESS_COLUMNS = (
    "time_s",
    "env_steps",
    "env_steps_per_s",
    "updates",
    "updates_per_s",
    "episodes",
    "train_return",
    "eval_return",
    "replay_fill",
    "replay_evicted",
    "replay_dropped",
    "version_lag",
    "eta_s",
)


def run_dir_line(run_dir: str) -> str:
    """The line that names the run directory, printed when a run starts and again after its
    last line: a batch log's head and tail then both say where the run's files are. Absolute,
    so that it can be pasted into `resume`, `analyze` or `tensorboard --logdir` from anywhere."""
    return f"hpcmarl: run directory: {os.path.abspath(run_dir)}"


class MetricsSink:
    """Writes rows to the run directory and progress lines to a stream."""

    def __init__(
        self,
        run_dir: str,
        stream: TextIO = sys.stdout,
        agents: list[str] | None = None,
        x_axis: str = "env_steps",
        loggers: Sequence[str] = ("tensorboard",),
        job: dict[str, Any] | None = None,
    ) -> None:
        """`x_axis`: the row field the loggers step by ("updates" offline, with no env steps);
        `loggers`: their names (`runtime.loggers`); `job`: the job's settings, which W&B and
        MLflow record with the run."""
        self.stream = stream
        self.agents = list(agents or []) if len(agents or []) > 1 else []
        self.columns = PROGRESS_COLUMNS + tuple(f"eval_return/{a}" for a in self.agents)
        os.makedirs(run_dir, exist_ok=True)
        self.loggers = Loggers(loggers, run_dir, x_axis, job or {})  # may refuse: files after
        self._jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a", buffering=1)
        csv_path = os.path.join(run_dir, "progress.csv")
        fresh = not os.path.exists(csv_path) or os.path.getsize(csv_path) == 0
        self._csv_file = open(csv_path, "a", newline="", buffering=1)
        self._csv = csv.DictWriter(self._csv_file, fieldnames=self.columns)
        if fresh:
            self._csv.writeheader()

    def progress(self, row: dict[str, Any]) -> None:
        per_agent = row.get("eval_agent_returns") or {}
        flat = {**row, **{f"eval_return/{a}": per_agent.get(a) for a in self.agents}}
        self._csv.writerow({k: _plain(flat.get(k)) for k in self.columns})
        self.record("progress", row)
        self.loggers.flush()
        self.say(format_progress(row))

    def record(self, kind: str, row: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps({"kind": kind, **row}, default=_plain) + "\n")
        self.loggers.write(kind, row)

    def resumed(self, counters: dict[str, Any]) -> None:
        """The run continues from a checkpoint at these counters: the loggers restart there."""
        self.loggers.resume_at(counters)

    def say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, exit_code: int = 0) -> None:
        """Close every file and end the loggers' runs with the job's exit code: rows since the
        last progress row reach them here."""
        self.loggers.close(exit_code)
        self._jsonl.close()
        self._csv_file.close()


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_progress(row: dict[str, Any]) -> str:
    eta = row.get("eta_s")
    per_agent = row.get("eval_agent_returns") or {}
    agents = ""
    if len(per_agent) > 1 and row.get("eval_return") is not None:
        agents = " [" + " ".join(f"{r:.1f}" for r in per_agent.values()) + "]"
    return (
        f"hpcmarl: {row['time_s']:7.1f}s  steps {row['env_steps']:>9,}"
        f" ({row['env_steps_per_s']:,.0f}/s)  updates {row['updates']:>7,}"
        f" ({row['updates_per_s']:,.0f}/s)  train return {_fmt(row.get('train_return'), '.1f')}"
        f"  eval {_fmt(row.get('eval_return'), '.1f')}{agents}  replay {row['replay_fill']:.0%}"
        f"  lag {_fmt(row.get('version_lag'), 'd')}  eta {_fmt(eta, '.0f')}s"
        + (f"  lost {row['collectors_lost']} collector(s)" if row.get("collectors_lost") else "")
        + (f", {row['collectors_respawned']} replaced" if row.get("collectors_respawned") else "")
    )
