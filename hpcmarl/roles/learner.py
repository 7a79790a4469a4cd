"""A learner: trains its policies on batches sampled from every replay shard.

The learner works in tasks granted by the commander: a task is `updates_per_task` updates of
each of its policies. Learners of one policy get their tasks together and average gradients
with a nonblocking allreduce, so they take the same number of steps and never wait inside a
collective for a learner that has no batch: a batch is in hand before the collective starts.

A group never drifts apart unnoticed: at start (fresh or resumed) every member takes the group
root's weights, and every `drift_check_interval` averaged updates the members compare a digest of
their weights; a mismatch stops the job naming the learners that differ. Both are collectives
posted at the same point of every member's update sequence, so they match without a barrier.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..algos.base import NetworkAlgorithm
from ..comm.allreduce import Handle, SoloAverager, digest, drift_report
from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..config.schema import LearnerConfig
from ..core import Role
from ..replay.columns import TRANSITION_COLUMNS
from .state_tree import flatten, nest


@dataclass
class PolicyTrainer:
    """What a learner holds for one policy: the algorithm, its batches and its collective."""

    policy: str
    key: str
    algo: NetworkAlgorithm
    averager: SoloAverager
    pushes_weights: bool
    members: list[str] = field(default_factory=list)
    """The learners of this policy in group-rank order (for naming who drifted)."""
    samples: deque = field(default_factory=deque)
    awaiting: set = field(default_factory=set)
    handle: Handle | None = None
    sync: Handle | None = None
    drift: Handle | None = None
    averaged: int = 0
    """Averaged updates since this process started: equal across the group by construction."""
    in_flight: Message | None = None
    td_errors: np.ndarray | None = None
    remaining: int = 0
    pushes: int = 0
    stats: list = field(default_factory=list)

    def done(self) -> bool:
        """The task's updates are applied and no collective is in flight."""
        return self.remaining == 0 and self.handle is None and self.drift is None


class Learner(Role):
    """Samples, computes gradients, averages them with its group, applies them, pushes weights."""

    kind = "learner"

    def __init__(
        self,
        name: str,
        transport: LocalTransport,
        cfg: LearnerConfig,
        trainers: list[PolicyTrainer],
        shards: list[str],
        ps_of_policy: dict[str, str],
        prioritized: bool,
        sequential: bool = False,
    ) -> None:
        super().__init__(name, transport)
        self.sequential = sequential
        self.cfg = cfg
        self.trainers = {t.policy: t for t in trainers}
        self.shards = shards
        self.ps_of_policy = ps_of_policy
        self.prioritized = prioritized
        self.task: dict | None = None
        self.started = False
        self.resumed = False
        self.syncing = False
        self.drift_check_interval = cfg.drift_check_interval

    def work(self) -> bool:
        if not self.started:
            return self.start_up()
        if self.task is None:
            return self.ask_for_task()
        progressed = False
        for trainer in self.trainers.values():
            self.request_samples(trainer)
            progressed = self.train_step(trainer) or progressed
        if all(t.done() for t in self.trainers.values()):
            self.finish_task()
            progressed = True
        return progressed

    def start_up(self) -> bool:
        """Take the group root's weights (a resume has loaded its own by now), then push them."""
        trainers = self.trainers.values()
        if not self.syncing:
            self.syncing = True
            for trainer in trainers:
                trainer.sync = trainer.averager.start_broadcast(trainer.algo.group_weights())
        for trainer in trainers:
            if trainer.sync is not None and trainer.averager.ready(trainer.sync):
                trainer.algo.load_group_weights(trainer.averager.result(trainer.sync))
                trainer.sync = None
        if any(t.sync is not None for t in trainers):
            return False
        self.started = True
        if not self.resumed:  # a resumed parameter server already holds these weights
            for trainer in trainers:
                self.push_weights(trainer)
        return True

    def handle_task(self, msg: Message) -> None:
        self.task, self.asked = msg.meta, False
        for trainer in self.trainers.values():
            trainer.remaining = msg.meta["updates"]
            trainer.stats = []

    def handle_sample(self, msg: Message) -> None:
        trainer = self.trainers[msg.meta["policy"]]
        trainer.awaiting.discard(msg.src)
        trainer.samples.append(msg)

    def handle_stop(self, msg: Message) -> None:
        self.send("stopped", msg.src, {"role": self.name, "updates": self.updates()})
        self.finish()

    def request_samples(self, trainer: PolicyTrainer) -> None:
        """Keep one request in flight per shard while this task still needs batches."""
        if self.sequential and (trainer.handle is not None or trainer.samples):
            return  # deterministic mode: the next request follows the last update's priorities
        wanted = trainer.remaining - len(trainer.samples) - (trainer.handle is not None)
        for shard in self.shards:
            if wanted <= len(trainer.awaiting):
                return
            if shard not in trainer.awaiting:
                trainer.awaiting.add(shard)
                self.send(
                    "sample_request", shard, {"policy": trainer.policy, "n": self.cfg.batch_size}
                )

    def train_step(self, trainer: PolicyTrainer) -> bool:
        """Either finish the update whose average is in flight, or start the next one."""
        if trainer.drift is not None:
            return self.check_drift(trainer)
        if trainer.handle is not None:
            if not trainer.averager.ready(trainer.handle):
                return False
            self.apply_update(trainer)
            return True
        if trainer.remaining == 0 or not trainer.samples:
            return False
        msg = trainer.samples.popleft()
        assert msg.arrays is not None
        batch = {c: msg.arrays[c] for c in TRANSITION_COLUMNS}
        weights = msg.arrays["weights"] if self.prioritized else None
        grad, stats, td = trainer.algo.compute_gradients(batch, weights)
        trainer.handle = trainer.averager.start(grad)
        trainer.in_flight, trainer.td_errors = msg, td
        trainer.stats.append(stats)
        return True

    def apply_update(self, trainer: PolicyTrainer) -> None:
        assert trainer.handle is not None and trainer.in_flight is not None
        trainer.algo.apply_gradients(trainer.averager.result(trainer.handle))
        trainer.handle, trainer.remaining = None, trainer.remaining - 1
        trainer.averaged += 1
        self.start_drift_check(trainer)
        if self.prioritized:
            self.send_priorities(trainer, trainer.in_flight)
        trainer.in_flight = None
        if trainer.algo.updates % self.cfg.push_interval == 0:
            self.push_weights(trainer)

    def start_drift_check(self, trainer: PolicyTrainer) -> None:
        """Every `drift_check_interval` averaged updates, gather the group's weight digests."""
        interval = self.drift_check_interval
        if trainer.averager.size > 1 and interval > 0 and trainer.averaged % interval == 0:
            row = np.array([trainer.algo.updates, digest(trainer.algo.group_weights())])
            trainer.drift = trainer.averager.start_gather(row)

    def check_drift(self, trainer: PolicyTrainer) -> bool:
        """Compare the group's weight digests; no update starts before they are in."""
        assert trainer.drift is not None
        if not trainer.averager.ready(trainer.drift):
            return False
        rows = trainer.averager.result(trainer.drift)
        trainer.drift = None
        problem = drift_report(rows, trainer.members or [self.name])
        if problem is not None:
            raise RuntimeError(
                f"learners of policy {trainer.policy} drifted apart after {trainer.averaged} "
                f"averaged updates: {problem}"
            )
        return True

    def send_priorities(self, trainer: PolicyTrainer, msg: Message) -> None:
        assert msg.arrays is not None and trainer.td_errors is not None
        arrays = {
            "indices": msg.arrays["indices"],
            "insert_ids": msg.arrays["insert_ids"],
            "td": np.abs(trainer.td_errors).astype(np.float32),
        }
        self.send("priorities", msg.src, {"policy": trainer.policy}, arrays)

    def push_weights(self, trainer: PolicyTrainer) -> None:
        if not trainer.pushes_weights:
            return
        trainer.pushes += 1
        self.send(
            "weights_push",
            self.ps_of_policy[trainer.policy],
            {"key": trainer.key},
            {"weights": trainer.algo.get_weights()},
        )

    def finish_task(self) -> None:
        assert self.task is not None
        for trainer in self.trainers.values():
            self.push_weights(trainer)
        self.send(
            "task_done",
            "commander",
            {
                "task_id": self.task["task_id"],
                "stats": self.task_stats(),
                "sent_bulk": self.sent_bulk,
            },
        )
        self.task = None

    def task_stats(self) -> dict:
        per_policy = {}
        for policy, trainer in self.trainers.items():
            rows = trainer.stats
            mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}
            per_policy[policy] = {
                **mean,
                "updates": trainer.algo.updates,
                "version": trainer.pushes,
            }
        return {"role": self.name, "policies": per_policy}

    def state(self) -> dict:
        import torch

        policies = {
            p: {"algo": nest(t.algo.state_dict()), "pushes": t.pushes}
            for p, t in self.trainers.items()
        }
        rng = torch.get_rng_state().numpy()
        return {**super().state(), "policies": policies, "torch_rng": rng}

    def load_state(self, tree: dict) -> None:
        import torch

        for policy, entry in tree["policies"].items():
            trainer = self.trainers[policy]
            trainer.algo.load_state_dict(flatten(entry["algo"]))
            trainer.pushes = int(entry["pushes"])
        torch.set_rng_state(torch.from_numpy(np.array(tree["torch_rng"], dtype=np.uint8)))
        self.resumed = True

    def updates(self) -> int:
        return sum(t.algo.updates for t in self.trainers.values())
