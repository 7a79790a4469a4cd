"""The seam between the commander and its schedules.

The commander hands a schedule a `Situation` (a read-only snapshot of the run) and applies the
`Grant`s it returns: it takes the roles off the waiting lists, holds their task space, sends the
tasks. It reports back what each finished task said. A schedule never reads or writes the
commander's fields; what it needs to know of the job is in its `Context`, fixed at start.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcmarl.algos.contract import PolicySpec
from hpcmarl.config.schema import JobConfig
from hpcmarl.roles.task_space import new_task_id


@dataclass(frozen=True)
class Context:
    """What a schedule knows of the job."""

    cfg: JobConfig
    collectors: tuple[str, ...]
    shards: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]
    """Training group -> its learners, in group-rank order."""
    bindings: Mapping[str, str]
    """agent -> the policy key it acts with."""
    keys: Mapping[str, tuple[str, ...]]
    """Training group -> the keys it publishes at start."""
    specs: Mapping[str, PolicySpec] = field(default_factory=dict)
    """Key -> PolicySpec of every policy at start (a schedule that adds policies copies them)."""

    @property
    def crews(self) -> dict[tuple[str, ...], tuple[str, ...]]:
        """Learners that start their tasks together -> the groups they train. Learners of one
        group are its data-parallel members; a learner hosting several groups trains them all
        in each of its tasks, so its groups share a crew."""
        crews: dict[tuple[str, ...], tuple[str, ...]] = {}
        for group, members in self.groups.items():
            crews[members] = (*crews.get(members, ()), group)
        return crews

    @property
    def items_per_task(self) -> int:
        """Items one collect task yields per group (fragments x env copies)."""
        return self.cfg.collector.fragments_per_task * self.cfg.env.num_envs


@dataclass(frozen=True)
class Situation:
    """The run as the commander sees it when it asks for grants."""

    now: float
    env_steps: int
    updates: int
    waiting_collectors: tuple[str, ...]
    waiting_learners: frozenset[str]
    running: int
    """Tasks granted and not finished."""
    collector_slots: int
    """Collector tasks that may start now (free collector task space)."""
    replay_sizes: Mapping[str, int]
    """Training group -> items held by its fullest shard, as last reported."""


@dataclass
class Grant:
    """One task for one role."""

    role: str
    task: dict[str, Any]


class Schedule:
    """A strategy for granting work; subclasses define `grants` and whichever reports they
    care about (the defaults ignore them)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def grants(self, s: Situation) -> list[Grant]:
        """Tasks to start now (collector grants never more than `s.collector_slots`)."""
        raise NotImplementedError

    def on_task_done(self, role: str, kind: str, report: dict[str, Any]) -> None:
        """A task ended: `kind` is collect, eval or learn; `report` what the role said."""

    def on_task_failed(self, role: str, report: dict[str, Any]) -> None:
        """A collect task was lost (its environment failed); `report` counts what it shipped."""

    def at_boundary(self, s: Situation) -> bool:
        """Whether stop conditions and periodic checkpoints may be acted on now."""
        return True

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        """Metric rows (kind, row) the schedule produced since the last call."""
        return []

    def lines(self) -> list[str]:
        """Progress lines for stdout the schedule produced since the last call."""
        return []

    def additions(self) -> list[tuple[PolicySpec, str]]:
        """Policies (spec, training group) to add to the population since the last call: the
        commander registers them and announces their tables before any task uses them."""
        return []

    def stop_reason(self) -> str | None:
        """Why the schedule's own work is complete (PSRO's iteration limit), or None."""
        return None

    def progress(self) -> float | None:
        """The fraction done of the schedule's own budget (PSRO's iterations), None when it
        has none: the progress line's ETA then follows the env-step and update budgets."""
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, tree: dict[str, Any]) -> None: ...

    # -- helpers every schedule uses -----------------------------------------------------------
    def collect_task(self, task_id: str, s: Situation, **extra: Any) -> dict[str, Any]:
        return {
            "task_id": task_id,
            "kind": "collect",
            "fragments": self.ctx.cfg.collector.fragments_per_task,
            "env_steps": s.env_steps,
            "bindings": dict(self.ctx.bindings),
            **extra,
        }

    def eval_task(self, task_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "task_id": task_id,
            "kind": "eval",
            "episodes": self.ctx.cfg.commander.eval_episodes,
            "bindings": dict(self.ctx.bindings),
            **extra,
        }


class Timed(Schedule):
    """A free-running schedule: collectors ask, and each gets an evaluation when one is due
    (every `eval_interval_s` once learning has begun) or else whatever `collect` returns;
    learners are granted by `learner_grants`."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        collects = not ctx.cfg.offline.dataset  # offline: no collect task ever comes
        self.evals = EvalTimer(ctx.cfg.commander.eval_interval_s, time.monotonic(), collects)

    def grants(self, s: Situation) -> list[Grant]:
        grants: list[Grant] = []
        for collector in s.waiting_collectors[: s.collector_slots]:
            if self.evals.due(s):
                self.evals.start(s.now)
                grants.append(Grant(collector, self.eval_task(new_task_id("eval"))))
                continue
            task = self.collect(s)
            if task is not None:
                self.evals.collected()
                grants.append(Grant(collector, task))
        return grants + self.learner_grants(s)

    def collect(self, s: Situation) -> dict[str, Any] | None:
        """The next collect task, or None when collection must wait."""
        raise NotImplementedError

    def learner_grants(self, s: Situation) -> list[Grant]:
        raise NotImplementedError

    def on_task_done(self, role: str, kind: str, report: dict[str, Any]) -> None:
        if kind == "eval":
            self.evals.done()


class EvalTimer:
    """Every `eval_interval_s`, once learning has begun, one evaluation at a time, and never
    two without a collect task granted between them: an interval shorter than an evaluation
    (or a lone collector) would otherwise evaluate back to back and never reach a step budget.
    Offline (`collects` False) there is nothing to collect, and evaluations follow the clock."""

    def __init__(self, interval_s: float, now: float, collects: bool = True) -> None:
        self.interval_s = interval_s
        self.last = now
        self.running = False
        self.collects = collects
        self.collected_since = True

    def due(self, s: Situation) -> bool:
        waited = s.now - self.last >= self.interval_s
        return not self.running and self.collected_since and s.updates > 0 and waited

    def start(self, now: float) -> None:
        self.running, self.last, self.collected_since = True, now, not self.collects

    def collected(self) -> None:
        self.collected_since = True

    def done(self) -> None:
        self.running = False
