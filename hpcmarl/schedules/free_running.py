"""The off-policy schedule: every collector and learner group works as fast as it can.

Collectors get a task whenever they ask and collector task space is left; every
`eval_interval_s` the next one is a greedy evaluation. Learners of one group start their tasks
together or not at all, and only once a replay shard holds `learning_starts` items of their
group. The rate limiter on the replay shards, not this schedule, keeps collection and learning
in proportion. Offline, the replay shards hold the dataset and collectors only evaluate: a
collector's request waits until an evaluation is due.
"""

from __future__ import annotations

from typing import Any

from ..roles.task_space import new_task_id
from .base import Context, Grant, Situation, Timed


class FreeRunning(Timed):
    """Grants tasks as requests come in (DI-engine's SoloCommander task spaces)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.offline = bool(ctx.cfg.offline.dataset)

    def collect(self, s: Situation) -> dict[str, Any] | None:
        return None if self.offline else self.collect_task(new_task_id("collector"), s)

    def learner_grants(self, s: Situation) -> list[Grant]:
        """A crew of learners starts its tasks together, or not at all: once every group it
        trains can be sampled."""
        grants = []
        updates = self.ctx.cfg.learner.updates_per_task
        for members, groups in self.ctx.crews.items():
            if not set(members) <= s.waiting_learners:
                continue
            if not all(self.replay_ready(group, s) for group in groups):
                continue
            task_id = new_task_id("learner")
            for learner in members:
                task = {"task_id": f"{task_id}/{learner}", "updates": updates}
                grants.append(Grant(learner, task))
        return grants

    def replay_ready(self, group: str, s: Situation) -> bool:
        """Some shard holds `learning_starts` items of the group (offline: any, since the whole
        dataset is loaded before a shard first reports)."""
        starts = 1 if self.offline else max(1, self.ctx.cfg.replay.learning_starts)
        return s.replay_sizes.get(group, 0) >= starts
