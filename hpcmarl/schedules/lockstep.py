"""Deterministic mode's fixed schedule: rounds in which everything happens in one order.

A round is: each collector in turn runs one collect task (the next starts only when the
previous one's batches are all inserted), then every learner group runs one task, then, every
`eval_every_rounds` rounds, one evaluation (offline, a round has no collect phase). Off-policy,
a learner task is `updates_per_task` updates; on-policy, one update on a complete batch of
fragments (if the round's collection completed one; fragments left over wait for the next
round). Stop conditions and periodic checkpoints are looked at only between rounds; a signal
may cut a round, so the schedule's position is part of the commander's checkpoint. With seeds
fixed and no rate limiter left to react to timing, a run and any resume of it produce the same
data, the same updates and the same `round` rows.
"""

from __future__ import annotations

from typing import Any

from ..roles.task_space import new_task_id
from .base import Context, Grant, Schedule, Situation
from .on_policy import make_ledger, update_grants


class Lockstep(Schedule):
    """The round, the phase in it, and whose turn it is."""

    def __init__(self, ctx: Context, on_policy: bool) -> None:
        super().__init__(ctx)
        self.round = 0
        self.phase = "collect"
        self.turn = 0
        self.learning = False
        self.tally: dict[str, list[float]] = {"returns": [], "loss": [], "q_mean": []}
        self.pushed = {key: 1 for keys in ctx.keys.values() for key in keys}
        """Weight versions published so far, from learner reports (1: the start-up push)."""
        self.ledger = make_ledger(ctx) if on_policy else None
        self.offline = bool(ctx.cfg.offline.dataset)
        self.finished_rows: list[dict[str, Any]] = []

    def at_boundary(self, s: Situation) -> bool:
        return self.phase == "collect" and self.turn == 0 and not s.running

    def grants(self, s: Situation) -> list[Grant]:
        """The next task of the schedule when its turn has come."""
        if s.running:
            return []
        if self.phase == "collect":
            return self.next_collector(s)
        if self.phase == "learn":
            return self.learn(s)
        return self.evaluate(s)

    def next_collector(self, s: Situation) -> list[Grant]:
        if self.turn == len(self.ctx.collectors) or self.offline:  # offline: nothing to collect
            self.phase = "learn"
            return self.learn(s)
        name = self.ctx.collectors[self.turn]
        if name not in s.waiting_collectors:
            return []
        task = self.collect_task(
            new_task_id("collector"), s, seed=self.seed(self.turn), versions=dict(self.pushed)
        )
        if self.ledger is not None:
            self.ledger.on_granted(task["task_id"])
        self.turn += 1
        return [Grant(name, task)]

    def learn(self, s: Situation) -> list[Grant]:
        if self.learning:
            self.end_round(s)
            return []
        starts = 0 if self.ledger is not None else self.ctx.cfg.replay.learning_starts
        if s.env_steps < starts and not self.offline:
            self.end_round(s)
            return []
        learners = {m for members in self.ctx.groups.values() for m in members}
        if not learners <= s.waiting_learners:
            return []
        grants: list[Grant] = []
        for members, groups in self.ctx.crews.items():
            if self.ledger is not None:
                if all(self.ledger.ready(group) for group in groups):
                    grants += update_grants(self.ledger, members, groups)
                continue
            task_id = new_task_id("learner")
            updates = self.ctx.cfg.learner.updates_per_task
            grants += [Grant(m, {"task_id": f"{task_id}/{m}", "updates": updates}) for m in members]
        if not grants:
            self.end_round(s)
            return []
        self.learning = True
        return grants

    def evaluate(self, s: Situation) -> list[Grant]:
        if self.learning:  # the evaluation task has finished
            self.learning, self.phase = False, "collect"
            return []
        name = self.ctx.collectors[0]
        if name not in s.waiting_collectors:
            return []
        self.learning = True
        task = self.eval_task(new_task_id("eval"), seed=self.seed(-1), versions=dict(self.pushed))
        return [Grant(name, task)]

    def seed(self, slot: int) -> int:
        return self.ctx.cfg.seed * 1_000_003 + self.round * 10_007 + slot + 1

    def on_task_done(self, role: str, kind: str, report: dict[str, Any]) -> None:
        if kind == "collect":
            self.tally["returns"] += report["collect"]["episode_returns"]
            if self.ledger is not None:
                self.ledger.on_collected(report["task_id"], report["collect"]["items"])
        elif kind == "learn":
            self.on_learn(report["stats"])

    def on_learn(self, stats: dict[str, Any]) -> None:
        for group, row in stats["groups"].items():
            for key in self.ctx.keys[group]:
                self.pushed[key] = max(self.pushed[key], int(row.get("version", 0)))
            self.tally["loss"].append(row.get("loss", row.get("policy_loss", float("nan"))))
            self.tally["q_mean"].append(row.get("q_mean", row.get("return_mean", float("nan"))))
            if self.ledger is not None:
                self.ledger.on_trained(group, int(row["version"]))

    def end_round(self, s: Situation) -> None:
        """Close the round with its `round` row (the commander records it, see `records`)."""
        self.finished_rows.append(
            {
                "round": self.round,
                "env_steps": s.env_steps,
                "updates": s.updates,
                **{k: (sum(v) / len(v) if v else None) for k, v in self.tally.items()},
            }
        )
        self.tally = {k: [] for k in self.tally}
        self.round, self.turn, self.learning = self.round + 1, 0, False
        every = self.ctx.cfg.commander.eval_every_rounds
        self.phase = "eval" if self.round % every == 0 and s.updates else "collect"

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        rows, self.finished_rows = self.finished_rows, []
        return [("round", row) for row in rows]

    def state(self) -> dict[str, Any]:
        tree: dict[str, Any] = {
            "round": self.round,
            "phase": self.phase,
            "turn": self.turn,
            "learning": self.learning,
            "tally": {k: list(v) for k, v in self.tally.items()},
            "pushed": [[key, version] for key, version in self.pushed.items()],
        }
        if self.ledger is not None:
            tree["ledger"] = self.ledger.state()
        return tree

    def load_state(self, tree: dict[str, Any]) -> None:
        self.round, self.phase = int(tree["round"]), str(tree["phase"])
        self.turn, self.learning = int(tree["turn"]), bool(tree["learning"])
        self.tally = {k: [float(x) for x in v] for k, v in tree["tally"].items()}
        self.pushed = {key: int(version) for key, version in tree["pushed"]}
        if self.ledger is not None:
            self.ledger.load_state(tree["ledger"])
