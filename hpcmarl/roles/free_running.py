"""The default schedule: every collector and learner group works as fast as it can.

Collectors get a task whenever they ask and collector task space is left; every
`eval_interval_s` the next one is a greedy evaluation. Learners of one policy start their tasks
together or not at all, and only once a replay shard holds `learning_starts` items of each of
their policies. The rate limiter on the replay shards, not this schedule, keeps collection and
learning in proportion. Offline, the replay shards hold the dataset and collectors only
evaluate: a collector's request waits until an evaluation is due.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .task_space import linear_epsilon, new_task_id

if TYPE_CHECKING:
    from .commander import Commander


class FreeRunning:
    """Grants tasks as requests come in (DI-engine's SoloCommander task spaces)."""

    def __init__(self, commander: Commander) -> None:
        self.commander = commander
        self.last_eval = time.monotonic()
        self.eval_running = False

    def eval_done(self) -> None:
        """An evaluation's result arrived: the next one may be granted when due."""
        self.eval_running = False

    def advance(self) -> bool:
        granted = self.grant_collector_tasks()
        return self.grant_learner_tasks() or granted

    def grant_collector_tasks(self) -> bool:
        c = self.commander
        granted = False
        while c.waiting_collectors and c.collector_space.acquire():
            task = self.next_collector_task()
            if task is None:
                c.collector_space.release()
                break
            collector = c.waiting_collectors.popleft()
            c.running[str(task["task_id"])] = collector
            c.send("task", collector, task)
            granted = True
        return granted

    def next_collector_task(self) -> dict | None:
        """A greedy evaluation when one is due, else a collect task at the current epsilon
        (offline: nothing)."""
        c = self.commander
        settings = c.cfg.commander
        due = time.monotonic() - self.last_eval >= settings.eval_interval_s
        if due and not self.eval_running and c.stats.total_updates() > 0:
            self.eval_running, self.last_eval = True, time.monotonic()
            return {
                "task_id": new_task_id("eval"),
                "kind": "eval",
                "episodes": settings.eval_episodes,
            }
        if c.cfg.offline.dataset:
            return None
        col = c.cfg.collector
        eps = linear_epsilon(c.stats.env_steps, col.eps_start, col.eps_end, col.eps_decay_steps)
        return {
            "task_id": new_task_id("collector"),
            "kind": "collect",
            "fragments": col.fragments_per_task,
            "epsilon": eps,
        }

    def grant_learner_tasks(self) -> bool:
        """Learners of one policy start their tasks together, or not at all."""
        c = self.commander
        granted = False
        for group in c.learner_groups():
            if not set(group) <= c.waiting_learners or not self.replay_ready(group):
                continue
            task_id = new_task_id("learner")
            for learner in group:
                c.learner_space.acquire()
                c.waiting_learners.discard(learner)
                c.running[f"{task_id}/{learner}"] = learner
                task = {
                    "task_id": f"{task_id}/{learner}",
                    "updates": c.cfg.learner.updates_per_task,
                }
                c.send("task", learner, task)
            granted = True
        return granted

    def replay_ready(self, group: list[str]) -> bool:
        """Some shard holds `learning_starts` items of every policy the group trains (offline:
        any, since the whole dataset is loaded before a shard first reports)."""
        c = self.commander
        policies = {p for learner in group for p in c.topology.policies_of_learner[learner]}
        starts = 1 if c.cfg.offline.dataset else max(1, c.cfg.replay.learning_starts)
        return all(c.stats.replay_size(p) >= starts for p in policies)
