"""The loggers a job names in `runtime.loggers` (tensorboard, wandb, mlflow): each gets the rows
the commander writes to `metrics.jsonl`, as numeric scalars stepped by env steps (updates
offline, where no env steps are taken).

`metrics.jsonl` is the run's record; loggers are views of it for people watching training, so a
logger that fails mid-run (a full disk, a tracking server gone) is named once on stderr and
dropped, and the run goes on. Only the commander's rank logs. W&B runs offline and MLflow
writes a file store inside the run directory unless the user's environment says otherwise
(`WANDB_MODE`, `MLFLOW_TRACKING_URI`): compute nodes often have no internet, and a batch job
must not wait on a server. Each launch, a resume included, is one W&B or MLflow run, named
after the run directory; their steps continue where the checkpoint left off.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from hpcmarl.api import EXIT_CHECKPOINTED
from hpcmarl.errors import UserError
from hpcmarl.extras import require
from hpcmarl.tensorboard import TB_DIR, TensorBoardLog

MLFLOW_DIR = "mlruns"
"""The folder of the run directory that holds MLflow's file store (without MLFLOW_TRACKING_URI)."""
NOT_SCALARS = {
    "progress": frozenset({"time_s", "eval_return", "eval_agent_returns"}),
    "eval": frozenset({"time_s", "env_steps", "updates", "episodes", "versions"}),
    "learn": frozenset({"env_steps"}),
}
"""Per row kind logged, the fields that are not its own scalars: wall time (every logger stamps
it), the x-axis, and the evaluation that progress rows repeat (eval rows log it at the step it
was measured). Other row kinds (episodes, schedule, checkpoints) are not logged."""


class Logger(Protocol):
    """What the commander's rows need from a logger."""

    def log(self, step: int, points: list[tuple[str, float]]) -> None: ...

    def resume_at(self, step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self, exit_code: int = 0) -> None: ...


class WandbLog:
    """A W&B run in `RUN_DIR/wandb` (or WANDB_DIR), offline unless WANDB_MODE is set; upload it
    later with `wandb sync RUN_DIR/wandb/offline-run-*`. The project is WANDB_PROJECT or the
    job's name; the job's settings are the run's config."""

    def __init__(self, run_dir: str, job: dict[str, Any]) -> None:
        wandb = require("wandb", "runtime.loggers=wandb", "drop wandb from runtime.loggers")
        hooks = sys.excepthook, sys.exit  # wandb.init replaces both for the process's life
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or job_name(job),
                name=os.path.basename(os.path.abspath(run_dir)),
                dir=os.environ.get("WANDB_DIR") or run_dir,
                config=job,
                settings=wandb.Settings(
                    mode=os.environ.get("WANDB_MODE") or "offline",
                    console="off",  # hpcmarl's own lines stay on the job's stdout as they are
                    silent=True,
                    x_disable_stats=True,  # no sampling thread beside the commander's loop
                    save_code=False,
                    disable_git=True,
                ),
            )
        finally:
            sys.excepthook, sys.exit = hooks

    def log(self, step: int, points: list[tuple[str, float]]) -> None:
        self.run.log(dict(points), step=step)

    def resume_at(self, step: int) -> None:
        """A resume is a new W&B run; its steps start at the checkpoint's."""

    def flush(self) -> None:
        """W&B's service process writes as rows come."""

    def close(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


class MlflowLog:
    """An MLflow run in the file store `RUN_DIR/mlruns` or at MLFLOW_TRACKING_URI. The
    experiment is MLFLOW_EXPERIMENT_NAME or the job's name; the job's settings are the run's
    parameters. Plain files, not MLflow's SQLite store: SQLite's locks are unreliable on the
    shared filesystems run directories live on."""

    def __init__(self, run_dir: str, job: dict[str, Any]) -> None:
        require("mlflow", "runtime.loggers=mlflow", "drop mlflow from runtime.loggers")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or Path(run_dir, MLFLOW_DIR).resolve().as_uri()
        if uri.startswith("file:"):  # MLflow 3 refuses a file store unless told it is wanted
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client, self.metric = MlflowClient(tracking_uri=uri), Metric
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or job_name(job)
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        run_name = os.path.basename(os.path.abspath(run_dir))
        tags = {"hpcmarl.run_dir": os.path.abspath(run_dir)}
        self.run_id = self.client.create_run(experiment, run_name=run_name, tags=tags).info.run_id
        params = [Param(key, value) for key, value in flat_params(job)]
        for start in range(0, len(params), 100):  # MLflow takes 100 parameters a call
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.pending: list[Any] = []

    def log(self, step: int, points: list[tuple[str, float]]) -> None:
        """Kept until `flush`: one batch per progress row, not one file append per scalar."""
        stamp = int(time.time() * 1000)
        self.pending += [self.metric(mlflow_key(t), v, stamp, step) for t, v in points]

    def resume_at(self, step: int) -> None:
        """A resume is a new MLflow run; its steps start at the checkpoint's."""

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for start in range(0, len(pending), 1000):  # MLflow takes 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=pending[start : start + 1000])

    def close(self, exit_code: int = 0) -> None:
        self.flush()
        status = {0: "FINISHED", EXIT_CHECKPOINTED: "KILLED"}.get(exit_code, "FAILED")
        self.client.set_terminated(self.run_id, status)


OPENERS: dict[str, Callable[[str, dict[str, Any]], Logger]] = {
    "tensorboard": lambda run_dir, job: TensorBoardLog(os.path.join(run_dir, TB_DIR)),
    "wandb": WandbLog,
    "mlflow": MlflowLog,
}
"""Logger name -> how it opens in a run directory, given the job's settings."""
LOGGERS = tuple(OPENERS)
"""The names `runtime.loggers` takes."""


def check_loggers(names: Sequence[str]) -> None:
    """Refuse at start-up, in one line naming the extra, a logger whose package is missing."""
    for name in names:
        if name != "tensorboard":  # a core dependency: every install has it
            require(name, f"runtime.loggers={name}", f"drop {name} from runtime.loggers")


class Loggers:
    """The job's loggers, fed the commander's rows; one that fails is warned about and dropped."""

    def __init__(
        self, names: Sequence[str], run_dir: str, x_axis: str, job: dict[str, Any]
    ) -> None:
        """`x_axis`: the row field that steps the scalars; `job`: the job's settings."""
        self.x_axis = x_axis
        self.step = 0
        self.active: dict[str, Logger] = {}
        for name in names:
            try:
                self.active[name] = OPENERS[name](run_dir, job)
            except UserError:  # a missing extra: refused at start-up, as `check_loggers` does
                raise
            except Exception as err:  # noqa: BLE001 - failing to open drops only the logger
                warn_dropped(name, err)

    def write(self, kind: str, row: dict[str, Any]) -> None:
        """Log the row's numbers; a kind not in `NOT_SCALARS` logs nothing.

        The step is the largest x-axis value seen: progress and eval rows carry the run's
        totals, a learn row offline only its learner's updates, which never exceed them.
        """
        skip = NOT_SCALARS.get(kind)
        if skip is None or not self.active:
            return
        self.step = max(self.step, int(row.get(self.x_axis) or 0))
        prefix = f"learn/{row['group']}" if kind == "learn" else kind
        self._each("log", self.step, scalars(prefix, row, skip | {self.x_axis}))

    def resume_at(self, counters: dict[str, Any]) -> None:
        """The run continues from a checkpoint taken at these counters (env steps, updates)."""
        self.step = max(self.step, int(counters[self.x_axis]))
        self._each("resume_at", self.step)

    def flush(self) -> None:
        """Write what is queued, once per progress row."""
        self._each("flush")

    def close(self, exit_code: int = 0) -> None:
        """End every logger's run with the job's exit code; later rows are dropped."""
        self._each("close", exit_code)
        self.active.clear()

    def _each(self, method: str, *args: Any) -> None:
        for name, logger in list(self.active.items()):
            try:
                getattr(logger, method)(*args)
            except Exception as err:  # noqa: BLE001 - a logger must never end the run
                del self.active[name]
                warn_dropped(name, err)
                if method != "close":
                    _close_quietly(logger)


def _close_quietly(logger: Logger) -> None:
    try:
        logger.close(1)
    except Exception:  # noqa: BLE001, S110 - already reported as failed
        pass


def warn_dropped(name: str, err: BaseException) -> None:
    """One line on stderr: which logger, why (its error's first line), and what goes on."""
    why = (str(err).strip().splitlines() or [""])[0][:200]
    print(
        f"hpcmarl: warning: the {name} logger failed ({type(err).__name__}: {why}); it is "
        "dropped and the run goes on (metrics.jsonl keeps every row)",
        file=sys.stderr,
        flush=True,
    )


def scalars(prefix: str, row: dict[str, Any], skip: frozenset[str]) -> list[tuple[str, float]]:
    """(tag, value) for every number in `row`, nested dicts as `key/subkey` (agents, shards)."""
    out: list[tuple[str, float]] = []
    for key, value in row.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            out += scalars(f"{prefix}/{key}", value, frozenset())
        elif isinstance(value, numbers.Real) and math.isfinite(value):
            out.append((f"{prefix}/{key}", float(value)))
    return out


def job_name(job: dict[str, Any]) -> str:
    return str(job.get("name") or "hpcmarl")


def mlflow_key(tag: str) -> str:
    """The tag in the characters MLflow takes (an agent id may hold others)."""
    return re.sub(r"[^\w./ -]", "_", tag)


def flat_params(job: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """The job's settings as `section.key` -> text, lists and mappings of values as JSON."""
    out: list[tuple[str, str]] = []
    for key, value in job.items():
        path = f"{prefix}{mlflow_key(str(key))}"
        if isinstance(value, dict) and value:
            out += flat_params(value, f"{path}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out.append((path, text[:500]))
    return out
