"""Every documented bound of a job key works: at each limit `RULES` states, a value is either
refused at start-up in one line naming the key, or it runs.

Cheap by design (CI's time is short): every value at and beside every limit goes through the
job's validation alone, in this process (`load_job`, a millisecond each). The value nearest each
limit that validation accepts then runs, together with the others of its kind: one short
one-process job (`run_job`, what `python -m hpcmarl` runs) per context (the algorithm or mode
whose keys they are) and side (every key at its lower limit, then every key at its upper one).
A value that the job's later start-up checks refuse must be named in the refusal; it leaves the
job and the rest runs. A job that fails while running is run again key by key, so the failure
names the key. A key whose limit ends the run at once runs alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcmarl.config.docs import walk
from hpcmarl.config.loader import load_job
from hpcmarl.config.rules import RULES
from hpcmarl.errors import UserError
from hpcmarl.launch import run

CONTEXTS: dict[str, list[str]] = {
    "learner.ppo.": ["learner.algo=ppo", "collector.fragments_per_task=1"],
    "learner.qmix.": [
        "jobs/spread_qmix.yaml",
        "env.kwargs.max_cycles=5",
        "replay.learning_starts=4",
    ],
    "learner.r2d2.": ["jobs/cartpole_novel_r2d2.yaml"],
    "replay.sequence_length": ["jobs/cartpole_novel_r2d2.yaml"],
    "replay.burn_in": ["jobs/cartpole_novel_r2d2.yaml"],
    "replay.sequence_overlap": ["jobs/cartpole_novel_r2d2.yaml"],
    "psro.": ["jobs/kuhn_psro.yaml", "psro.steps_per_iteration=100", "psro.iterations=1"],
    "commander.eval_every_rounds": ["commander.deterministic=true"],
    "": ["replay_log.enabled=true"],
}
"""What a key needs to matter (by key prefix): its algorithm's job, or the mode that reads it;
every other key runs in the default job (DQN on CartPole), its replay files written."""

STOPS = (
    "commander.max_env_steps",
    "commander.max_updates",
    "commander.max_wall_time_s",
    "psro.iterations",
)
"""Keys whose limit ends the run at once, or takes away a stop the other keys' job relies on (the
update budget, the wall-time guard; PSRO iterations of one step each, every one evaluated): each
runs alone."""

SHORT = [
    "commander.stop_value=null",
    "commander.max_env_steps=400",
    "commander.max_updates=3",
    "commander.max_wall_time_s=60",
    "commander.eval_episodes=2",
    "topology.collectors=1",
    "env.num_envs=2",
    "replay.learning_starts=32",
    "learner.batch_size=16",
    "learner.updates_per_task=5",
    "learner.hidden_sizes=[16]",
    "psro.updates_per_iteration=5",
    "psro.eval_episodes=4",
    "learner.ppo.batch_fragments=2",
    "learner.ppo.epochs=1",
]
"""What makes any job short (a key under test overrides these). The wall-time limit only guards
against a job that never reaches its budgets: one that stops there has not run."""


@dataclasses.dataclass(frozen=True)
class Value:
    """One key at (or beside) one of its limits."""

    key: str
    value: Any

    @property
    def context(self) -> tuple[str, ...]:
        """The job file and settings that make the key matter."""
        for prefix, needs in CONTEXTS.items():
            if self.key.startswith(prefix):
                return tuple(needs)
        return ()

    def override(self) -> str:
        return f"{self.key}={self.value}"


def _is_int(cls: type, name: str) -> bool:
    hint = typing.get_type_hints(cls)[name]
    return hint is int or int in typing.get_args(hint) or hint == list[int]


def limits() -> Iterator[tuple[str, list[Value]]]:
    """Each bounded key's values at each limit, from outside in: the limit one step out (1 for
    an integer, 0.001 for a number), the limit, one step in."""
    for key, cls, fld in walk():
        rule = RULES.get(key)
        if rule is None or not rule.bounds:
            continue
        step = 1 if _is_int(cls, fld.name) else 0.001
        for limit, side in zip(rule.bounds, (-1, 1), strict=False):
            near = [limit + side * step, limit, limit - side * step]
            near = [int(v) if step == 1 else round(v, 6) for v in near]
            yield (
                ("low", "high")[side > 0],
                [Value(key, [v] if key == "learner.hidden_sizes" else v) for v in near],
            )


def split(context: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """(job file or None, overrides) of a context."""
    job = next((c for c in context if c.endswith(".yaml")), None)
    return job, [c for c in context if not c.endswith(".yaml")]


def validation_error(value: Value) -> str | None:
    """What `load_job` says of the value in its context, or None when it accepts it."""
    job, given = split(value.context)
    try:
        load_job(job, [*given, value.override()])
    except UserError as err:
        return err.message()
    return None


def nearest_accepted() -> dict[tuple[tuple[str, ...], str], list[Value]]:
    """For every key and limit, the value nearest it that validation accepts, grouped by context
    and side; every value refused on the way must be refused naming its key."""
    groups: dict[tuple[tuple[str, ...], str], list[Value]] = {}
    unnamed = []
    for side, near in limits():
        for value in near:
            error = validation_error(value)
            if error is None:
                group = (value.context, "stop" if value.key in STOPS else side)
                groups.setdefault(group, []).append(value)
                break
            if value.key not in error:
                unnamed.append(f"{value.override()}: {error}")
    assert not unnamed, "refused without naming the key:\n" + "\n".join(unnamed)
    return groups


def run_job(context: tuple[str, ...], values: list[Value], run_dir: Path) -> tuple[int, str]:
    """One short job in this process, as `python -m hpcmarl` runs it: its code and output."""
    job, given = split(context)
    overrides = [*SHORT, *given, *(v.override() for v in values), f"runtime.run_dir={run_dir}"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run.run_job(job, overrides)
    return code, out.getvalue() + err.getvalue()


class Jobs:
    """The jobs run so far (a new run directory each) and what failed in them."""

    def __init__(self, root: Path) -> None:
        self.root, self.count, self.failed = root, 0, []

    def run(self, context: tuple[str, ...], values: list[Value]) -> tuple[int, str]:
        self.count += 1
        return run_job(context, values, self.root / f"job{self.count}")

    def check(self, context: tuple[str, ...], values: list[Value]) -> None:
        """Run the values together: a start-up refusal must name a key of theirs (that value
        leaves, refused alone too, and the rest runs again); a failure is retried key by key."""
        code, output = self.run(context, values)
        stopped = finished(self.root / f"job{self.count}")
        if code == 0 and stopped is not None and not stopped.startswith("wall-time limit"):
            return
        named = [v for v in values if v.key in refusal(output)] if code == 2 else []
        if named and len(values) > 1:
            for value in named:
                self.check(context, [value])
            self.check(context, [v for v in values if v not in named])
        elif len(values) > 1:
            before = len(self.failed)
            for value in values:
                self.check(context, [value])
            if len(self.failed) == before:
                together = " ".join(v.override() for v in values)
                self.failed.append(f"only together, in {context}: {together}")
        elif not named:
            lines = [line for line in output.splitlines() if line.startswith("hpcmarl: ")]
            self.failed.append(
                f"{values[0].override()} in {context}: exit {code}, {stopped}: {lines[-3:]}"
            )


def finished(run_dir: Path) -> str | None:
    """Why the run stopped, from its `finished` row (its stop line goes to the real stdout)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(row) for row in path.read_text().splitlines()] if path.exists() else []
    return next((row["reason"] for row in rows if row["kind"] == "finished"), None)


def refusal(output: str) -> str:
    return next((line for line in output.splitlines() if line.startswith("hpcmarl: error:")), "")


@pytest.mark.filterwarnings("ignore")
def test_every_documented_bound_runs_or_is_refused_naming_the_key(tmp_path: Path) -> None:
    jobs = Jobs(tmp_path)
    for (context, _), values in nearest_accepted().items():
        jobs.check(context, values)
    assert not jobs.failed, "\n".join(jobs.failed)
