"""`hpcmarl.train(job)` from Python: the job that `python -m hpcmarl` runs, and its run.

`train` goes through the command's own launch path (`launch.run.launch_job`): without mpirun
one process hosts every role; under mpirun every rank calls `train` with the same job, rank 0
plans and broadcasts, and a failing rank aborts the world as the command's does, so no rank is
left waiting. The result is a `Run`: the run directory and what the run recorded there.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import UserError

__all__ = ["Run", "TrainingError", "train"]

EXIT_OK = 0
EXIT_CHECKPOINTED = 75
"""A run stopped by a signal (Ctrl-C in a notebook, Slurm's warning) after a checkpoint: its
`Run` is returned, and `python -m hpcmarl resume RUN_DIR` continues it."""


class TrainingError(RuntimeError):
    """A run that failed, or a job refused while its roles were built: the line printed
    above it names the rank, the role and the cause."""

    def __init__(self, exit_code: int, run_dir: Path | None) -> None:
        self.exit_code = exit_code
        self.run_dir = run_dir
        where = f"; tracebacks go to {run_dir / 'logs'}" if run_dir is not None else ""
        super().__init__(f"the run ended with exit code {exit_code}, as printed above{where}")


class Run:
    """A run directory and what the run recorded in it (`metrics.jsonl`), read when asked: a
    run continued in the same directory (a resume, another `train` there) shows its newest."""

    def __init__(self, run_dir: str | Path, exit_code: int = EXIT_OK) -> None:
        self.run_dir = Path(run_dir)
        self.exit_code = exit_code
        """0, or 75 when a signal stopped the run after a checkpoint."""

    def metrics(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The rows of `metrics.jsonl` (progress, eval, checkpoint, learner, finished, ...),
        oldest first; with `kind`, only the rows of that kind."""
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [row for row in rows if kind is None or row.get("kind") == kind]

    @property
    def final(self) -> dict[str, Any]:
        """The run's last figures: its last progress row (env steps, updates, episodes, train
        and eval returns, ...) with the `finished` row's reason, env steps and time on top, and
        the newest evaluation's return (`eval_return`) where the last progress row has none."""
        rows = self.metrics()
        last: dict[str, Any] = {}
        for kind in ("progress", "finished"):
            row = next((r for r in reversed(rows) if r.get("kind") == kind), None)
            last.update({k: v for k, v in (row or {}).items() if k != "kind"})
        evaluated = [r["eval_return"] for r in rows if r.get("eval_return") is not None]
        if last.get("eval_return") is None and evaluated:
            last["eval_return"] = evaluated[-1]
        return last

    def __repr__(self) -> str:
        return f"Run({str(self.run_dir)!r}, exit_code={self.exit_code})"


def train(
    job: str | os.PathLike | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike | None = None,
) -> Run:
    """Run a job to its end and return its `Run`.

    `job`: a job file's path, or a mapping of the same keys (None: the built-in default job);
    `overrides`: `key=value` strings as on the command line; `run_dir`: where the run writes
    (default: `runtime.run_dir`, else `runs/<name>-<time>`). A job the schema refuses raises
    `ConfigError` (a `UserError`) before anything runs; a run that fails raises
    `TrainingError`. Under mpirun, every rank must call it with the same arguments."""
    from .launch.run import launch_job, launched_by_mpi

    overrides = list(overrides)
    if run_dir is not None:  # as a quoted YAML string: any path reads back as itself
        overrides.append(f"runtime.run_dir={json.dumps(os.fspath(run_dir))}")
    if not launched_by_mpi():  # one process: the job's own error, raised (under MPI, rank 0
        from .config.loader import load_job  # parses alone and every rank returns 2)

        load_job(job, overrides)
    with signals_for_the_run():
        ended = launch_job(job, overrides)
    if ended.refusal:
        raise UserError(ended.refusal)
    if ended.code not in (EXIT_OK, EXIT_CHECKPOINTED) or ended.run_dir is None:
        raise TrainingError(ended.code, None if ended.run_dir is None else Path(ended.run_dir))
    return Run(Path(ended.run_dir).absolute(), ended.code)


@contextmanager
def signals_for_the_run() -> Iterator[None]:
    """The run's signal handlers (a signal becomes a checkpoint and a stop) while it runs, the
    caller's again after it: in a notebook, Ctrl-C interrupts code again once training ended,
    and a signal that stopped one run does not stop the next one before it starts."""
    from .launch import signals

    before = {sig: signal.getsignal(sig) for sig in signals.CAUGHT}
    signals.clear()
    signals.install()
    try:
        yield
    finally:
        signals.clear()
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
