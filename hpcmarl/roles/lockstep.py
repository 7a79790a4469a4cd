"""Deterministic mode's fixed schedule: rounds in which everything happens in one order.

A round is: each collector in turn runs one collect task (the next starts only when the
previous one's batches are all inserted), then every learner group runs one task, then, every
`eval_every_rounds` rounds, one evaluation (offline, a round has no collect phase). Stop
conditions and periodic checkpoints are looked at only between rounds; a signal may cut a
round, so the schedule's position is part of the commander's checkpoint. With seeds fixed and
no rate limiter left to react to timing, a run and any resume of it produce the same data, the
same updates and the same `round` rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .task_space import linear_epsilon, new_task_id

if TYPE_CHECKING:
    from .commander import Commander


class Lockstep:
    """The round, the phase in it, and whose turn it is."""

    def __init__(self, commander: Commander) -> None:
        self.commander = commander
        self.round = 0
        self.phase = "collect"
        self.turn = 0
        self.learning = False
        self.tally: dict[str, list[float]] = {"returns": [], "loss": [], "q_mean": []}
        self.pushed = {p: 1 for p in commander.topology.policies}
        """Weight versions pushed so far, from learner reports (1: the learners' start-up push)."""

    @property
    def at_boundary(self) -> bool:
        return self.phase == "collect" and self.turn == 0 and not self.commander.running

    def advance(self) -> bool:
        """Grant the next task of the schedule when its turn has come."""
        if self.commander.running:
            return False
        if self.phase == "collect":
            return self.next_collector()
        if self.phase == "learn":
            return self.learn()
        return self.evaluate()

    def next_collector(self) -> bool:
        c = self.commander
        if self.turn == len(c.collectors) or c.cfg.offline.dataset:  # offline: nothing to collect
            self.phase = "learn"
            return True
        name = c.collectors[self.turn]
        if name not in c.waiting_collectors:
            return False
        c.waiting_collectors.remove(name)
        col = c.cfg.collector
        eps = linear_epsilon(c.stats.env_steps, col.eps_start, col.eps_end, col.eps_decay_steps)
        self.grant(
            name,
            {
                "task_id": new_task_id("collector"),
                "kind": "collect",
                "epsilon": eps,
                "fragments": col.fragments_per_task,
                "seed": self.seed(self.turn),
                "versions": dict(self.pushed),
            },
        )
        self.turn += 1
        return True

    def learn(self) -> bool:
        c = self.commander
        if self.learning:
            self.end_round()
            return True
        if c.stats.env_steps < c.cfg.replay.learning_starts and not c.cfg.offline.dataset:
            self.end_round()
            return True
        if not set(c.learners) <= c.waiting_learners:
            return False
        for group in c.learner_groups():
            task_id = new_task_id("learner")
            for learner in group:
                c.waiting_learners.discard(learner)
                self.grant(
                    learner,
                    {"task_id": f"{task_id}/{learner}", "updates": c.cfg.learner.updates_per_task},
                )
        self.learning = True
        return True

    def evaluate(self) -> bool:
        c = self.commander
        if self.learning:  # the evaluation task has finished
            self.learning, self.phase = False, "collect"
            return True
        name = c.collectors[0]
        if name not in c.waiting_collectors:
            return False
        c.waiting_collectors.remove(name)
        self.grant(
            name,
            {
                "task_id": new_task_id("eval"),
                "kind": "eval",
                "episodes": c.cfg.commander.eval_episodes,
                "seed": self.seed(-1),
            },
        )
        self.learning = True
        return True

    def eval_done(self) -> None:
        """Nothing to do: the round moves on when the evaluation task is done (`evaluate`)."""

    def grant(self, role: str, task: dict[str, Any]) -> None:
        self.commander.running[task["task_id"]] = role
        self.commander.send("task", role, task)

    def seed(self, slot: int) -> int:
        return self.commander.cfg.seed * 1_000_003 + self.round * 10_007 + slot + 1

    def on_collect(self, stats: dict[str, Any]) -> None:
        self.tally["returns"] += stats["episode_returns"]

    def on_learn(self, stats: dict[str, Any]) -> None:
        for policy, row in stats["policies"].items():
            self.pushed[policy] = max(self.pushed[policy], int(row.get("version", 0)))
            self.tally["loss"].append(row.get("loss", float("nan")))
            self.tally["q_mean"].append(row.get("q_mean", float("nan")))

    def end_round(self) -> None:
        c = self.commander
        row: dict[str, Any] = {
            "round": self.round,
            "env_steps": c.stats.env_steps,
            "updates": c.stats.total_updates(),
            "episodes": c.stats.episodes,
        }
        row.update({k: (sum(v) / len(v) if v else None) for k, v in self.tally.items()})
        c.sink.record("round", row)
        self.tally = {k: [] for k in self.tally}
        self.round, self.turn, self.learning = self.round + 1, 0, False
        every = c.cfg.commander.eval_every_rounds
        self.phase = "eval" if self.round % every == 0 and c.stats.total_updates() else "collect"

    def state(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "phase": self.phase,
            "turn": self.turn,
            "learning": self.learning,
            "tally": {k: list(v) for k, v in self.tally.items()},
            "pushed": dict(self.pushed),
        }

    def load_state(self, tree: dict[str, Any]) -> None:
        self.round, self.phase = int(tree["round"]), str(tree["phase"])
        self.turn, self.learning = int(tree["turn"]), bool(tree["learning"])
        self.tally = {k: [float(x) for x in v] for k, v in tree["tally"].items()}
        self.pushed = {p: int(v) for p, v in tree["pushed"].items()}
