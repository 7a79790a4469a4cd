"""The on-policy schedule: collect fragments with recent weights, train on each once, publish.

Collect tasks are granted while the ledger allows (at most `max_policy_lag` updates ahead of
the learners, acting with a weight version recent enough for the batch their fragments will
fill); a group's learners get an update task, with the fragments each takes from each shard,
as soon as the batch is complete on the shards. With `max_policy_lag: 0` collection and training
alternate; with 1 collectors fill the next batch while the learners train on this one.
Evaluations come every `eval_interval_s`, as in the off-policy schedule.
"""

from __future__ import annotations

from typing import Any

from ..algos.catalog import on_policy_window
from ..roles.task_space import new_task_id
from .base import Context, Grant, Situation, Timed
from .ledger import FragmentLedger


def make_ledger(ctx: Context) -> FragmentLedger:
    batch, lag = on_policy_window(ctx.cfg.learner)
    groups = {g: (batch, lag, ctx.keys[g]) for g in ctx.groups}
    return FragmentLedger(groups, ctx.shards, ctx.items_per_task)


def update_grants(
    ledger: FragmentLedger, members: tuple[str, ...], groups: tuple[str, ...]
) -> list[Grant]:
    """One update task per learner of a crew, each naming the fragments it takes per group."""
    takes = {group: ledger.assign(group, members) for group in groups}
    task_id = new_task_id("learner")
    return [
        Grant(
            learner,
            {
                "task_id": f"{task_id}/{learner}",
                "updates": 1,
                "take": {group: takes[group][learner] for group in groups},
            },
        )
        for learner in members
    ]


class OnPolicy(Timed):
    """Collect within the lag window; train each complete batch once."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.ledger = make_ledger(ctx)

    def collect(self, s: Situation) -> dict[str, Any] | None:
        if not self.ledger.may_collect():
            return None
        task_id = new_task_id("collector")
        versions = self.ledger.versions()
        self.ledger.on_granted(task_id)
        return self.collect_task(task_id, s, versions=versions)

    def learner_grants(self, s: Situation) -> list[Grant]:
        """A crew's update once the batch of every group it trains is complete."""
        grants = []
        for members, groups in self.ctx.crews.items():
            if not set(members) <= s.waiting_learners:
                continue
            if not all(self.ledger.ready(group) for group in groups):
                continue
            grants += update_grants(self.ledger, members, groups)
        return grants

    def on_task_done(self, role: str, kind: str, report: dict[str, Any]) -> None:
        super().on_task_done(role, kind, report)
        if kind == "collect":
            self.ledger.on_collected(report["task_id"], report["collect"]["items"])
        elif kind == "learn":
            for group, row in report["stats"]["groups"].items():
                self.ledger.on_trained(group, int(row["version"]))

    def on_task_failed(self, role: str, report: dict[str, Any]) -> None:
        self.ledger.on_collected(report["task_id"], report.get("items", {}))

    def state(self) -> dict[str, Any]:
        return {"ledger": self.ledger.state()}

    def load_state(self, tree: dict[str, Any]) -> None:
        self.ledger.load_state(tree["ledger"])
