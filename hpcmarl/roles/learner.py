"""A learner: drives its groups' updates on batches from the replay shards, publishes weights.

The learner works in tasks granted by the commander. An off-policy task is `updates` updates,
each on one batch sampled from some shard (one request in flight per shard); an on-policy task
is one update on the fragments the commander assigned (`take`: how many from which shard).

The learner does not know which algorithm it runs. An update is the algorithm's generator: it
yields a local vector, the learner starts a nonblocking average over the group (the learners of
a group get their tasks together), keeps polling, and sends the average back in when it is
ready; the generator's return value carries the stats and priorities. So a group never waits
inside a collective for a member that has no batch: each member has its batch before its
update begins.

A task can be cut short: a checkpoint or a stop sends `wrap_up`, and an off-policy task ends
after the update in flight, whatever `updates_per_task` is. The members of a group must apply
the same number of updates, but each hears `wrap_up` at its own time, so each averaged vector
carries one more element, the member's wish to wrap up: the average of it is the same on every
member, and a task ends after the first update in which any member wished it. A lone learner
asks for no more batches once told, so with none in hand or on its way its task ends at once.

The replay shards answer at once, empty, what they cannot serve while collection is stopped
for a checkpoint or the end (drain mode), since the inserts a request waits for may never
come: the learner asks that shard no more in this task (`GroupTrainer.dry`). A group member
goes on asking the others, so that its group can agree in one more update: free-running grants
a task only once some shard holds `learning_starts` of the group, and such a shard serves every
request at once in drain mode.

A group never drifts apart unnoticed: at start (fresh or resumed) every member takes the group
root's weights, and every `drift_check_interval` averaged updates the members compare a digest of
their weights; a mismatch stops the job naming the learners that differ. Both are collectives
posted at the same point of every member's update sequence, so they match without a barrier.
"""

from __future__ import annotations

import json
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..algos.contract import Algorithm, PolicySpec, UpdateResult, UpdateSteps
from ..comm.allreduce import Handle, SoloAverager, digest, drift_report
from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..config.schema import LearnerConfig
from ..core import Role
from ..errors import ConfigError
from ..items.spec import ItemSpec
from .state_tree import flatten, nest


@dataclass
class Target:
    """What a group trains: its algorithm instance, the keys it publishes and their servers."""

    algo: Algorithm
    specs: dict[str, PolicySpec]
    servers: dict[str, str]


Retarget = Callable[[dict[str, str], int], Target]
"""(policy id -> new key, generation) -> a fresh Target: how a group switches to new policies."""


@dataclass
class GroupTrainer:
    """What a learner holds for one training group: its algorithm, batches and collectives."""

    group: str
    algo: Algorithm
    items: ItemSpec
    specs: dict[str, PolicySpec]
    averager: SoloAverager
    pushes_weights: bool
    servers: dict[str, str]
    """Policy key -> the parameter server that holds it."""
    members: list[str] = field(default_factory=list)
    """The learners of this group in group-rank order (for naming who drifted)."""
    samples: deque = field(default_factory=deque)
    awaiting: set = field(default_factory=set)
    parts: dict[str, Message] = field(default_factory=dict)
    """On-policy: the replies to this task's take requests, by shard."""
    steps: UpdateSteps | None = None
    handle: Handle | None = None
    sync: Handle | None = None
    drift: Handle | None = None
    averaged: int = 0
    """Averaged updates since this process started: equal across the group by construction."""
    in_flight: Message | None = None
    remaining: int = 0
    version: int = 0
    """Weight versions published for the group (the same count on every member)."""
    unpushed: bool = False
    announced: bool = False
    dropped: dict[str, int] = field(default_factory=dict)
    """On-policy: stale fragments each shard dropped while serving this task."""
    empty: int = 0
    """On-policy: updates of this task that found no fragment to train on (all dropped, or
    none assigned). A lone learner skips them: no optimizer step (Adam's momentum would still
    move the weights), but its unchanged weights go out as the next version all the same, as
    the commander's books count one version per batch assigned (schedules/ledger.py). A member
    of a larger group still takes its part in the average (its members must stay in step),
    with a zero gradient. Either way their statistics are left out of the task's means, which
    would otherwise report a loss of 0.0 as if something had been learned. Deterministic
    off-policy: updates a lone learner skipped because none of its shards held an item of the
    group (`Learner.try_next_shard`)."""
    stats: list = field(default_factory=list)
    retarget: Retarget | None = None
    keys: dict[str, str] = field(default_factory=dict)
    """policy id -> the key this group trains now."""
    earlier_updates: int = 0
    """Updates applied to the group's earlier policies (before its last switch)."""
    generation: int = 0
    """How many times the group was retargeted (PSRO's iteration): the shards serve it only
    items of this generation."""
    wrap_agreed: bool = False
    """A member of the group asked to wrap up the task during this update (see `wrap_up`)."""
    unfinished: int = 0
    """Updates of this task left undone because it was wrapped up."""
    attempt: int = 0
    """Deterministic mode: shards that answered the pending update's request empty, so the
    update asks the next in its rotation (see `Learner.request_samples`)."""
    dry: set = field(default_factory=set)
    """Free-running: shards that answered this task's request empty (drain mode, below
    `learning_starts`): not asked again in this task, while another shard may serve."""

    @property
    def on_policy(self) -> bool:
        return self.items.replay.on_policy

    @property
    def prioritized(self) -> bool:
        """Samples carry importance weights, and updates send priorities back."""
        return self.items.replay.selector == "prioritized"

    @property
    def updates(self) -> int:
        """Updates this group applied, over all the policies it trained."""
        return self.earlier_updates + self.algo.updates

    def done(self) -> bool:
        """The task's updates are applied, no collective is in flight, and no batch either
        (a task wrapped up early may still await some, kept for the next task)."""
        idle = self.steps is None and self.drift is None and not self.awaiting
        return self.remaining == 0 and idle


class Learner(Role):
    """Samples, drives updates, averages with its group, publishes weights."""

    kind = "learner"

    def __init__(
        self,
        name: str,
        transport: LocalTransport,
        cfg: LearnerConfig,
        trainers: list[GroupTrainer],
        shards: list[str],
        sequential: bool = False,
    ) -> None:
        super().__init__(name, transport)
        self.sequential = sequential
        self.cfg = cfg
        self.trainers = {t.group: t for t in trainers}
        self.shards = shards
        self.task: dict | None = None
        self.wrapping = False
        """`wrap_up` arrived for the task in hand: end it after the update in flight."""
        self.started = False
        self.syncing = False
        self.drift_check_interval = cfg.drift_check_interval
        self.failed = False
        """A task of this learner failed (`fail_task`): it takes no other."""
        self.task_began = (0.0, 0)
        """(monotonic time, updates) when the task in hand was granted: its info's rates."""

    def work(self) -> bool:
        if not self.started:
            return self.start_up()
        if self.failed:  # the commander ends the job (fail_task)
            return False
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

    def in_flight(self) -> bool:
        return self.collective_in_flight() or super().in_flight()

    def collective_in_flight(self) -> bool:
        return any(
            t.handle is not None or t.sync is not None or t.drift is not None
            for t in self.trainers.values()
        )

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
        # Version 0: never published (a fresh run). A resumed server holds every version a
        # learner's file holds: a cut waits for this push (CheckpointCoordinator.starting_learners).
        for trainer in trainers:
            if trainer.version == 0:
                self.publish(trainer)
        return True

    def handle_task(self, msg: Message) -> None:
        self.task, self.asked, self.wrapping = msg.meta, False, False
        self.task_began = (time.monotonic(), self.updates())
        for group, target in msg.meta.get("train", {}).items():
            self.switch(self.trainers[group], target["keys"], int(target["generation"]))
            self.publish(self.trainers[group])
        for trainer in self.trainers.values():
            trainer.remaining, trainer.unfinished = msg.meta["updates"], 0
            trainer.attempt, trainer.dry = 0, set()
            trainer.stats, trainer.dropped, trainer.parts, trainer.empty = [], {}, {}, 0
            if trainer.on_policy and trainer.remaining:  # (PSRO's retarget task has none)
                self.request_fragments(trainer, msg.meta["take"].get(trainer.group, {}))

    def handle_wrap_up(self, msg: Message) -> None:
        """A checkpoint or a stop waits for this task: end it after the update in flight."""
        if self.task is not None and msg.meta["task_id"] == self.task["task_id"]:
            self.wrapping = True

    def handle_sample(self, msg: Message) -> None:
        trainer = self.trainers[msg.meta["group"]]
        trainer.awaiting.discard(msg.src)
        if msg.meta.get("empty"):
            if self.sequential:
                self.try_next_shard(trainer)
            else:  # drain mode (ReplayShard.nothing_to_wait_for)
                trainer.dry.add(msg.src)
            return
        if not trainer.on_policy:
            trainer.samples.append(msg)
            trainer.attempt = 0
            return
        trainer.parts[msg.src] = msg
        dropped = int(msg.meta.get("dropped", 0))
        trainer.dropped[msg.src] = trainer.dropped.get(msg.src, 0) + dropped
        if not trainer.awaiting:
            trainer.samples.append(self.join_parts(trainer))

    def switch(self, trainer: GroupTrainer, keys: dict[str, str], generation: int) -> None:
        """Train new policies from fresh networks (PSRO's next best response): every member
        of the group builds the same ones, and the old policies stay frozen where published."""
        if trainer.retarget is None:
            raise RuntimeError(f"group {trainer.group} cannot switch policies in this job")
        target = trainer.retarget(dict(keys), generation)
        trainer.earlier_updates += trainer.algo.updates
        trainer.algo, trainer.specs, trainer.servers = target.algo, target.specs, target.servers
        trainer.keys, trainer.generation = dict(keys), generation
        trainer.samples.clear()  # batches of the old policies' generation
        trainer.version, trainer.announced, trainer.unpushed = 0, False, False

    # -- batches ------------------------------------------------------------------------------
    def request_samples(self, trainer: GroupTrainer) -> None:
        """Off-policy: keep one request in flight per shard while this task needs batches.
        Deterministic mode asks for one batch at a time, after the last update's priorities
        went out, from its shards in turn: update u's batch comes from shard u mod S, so a
        resume (which restores the update count) asks where the uninterrupted run would. A
        shard that holds none of the group's items answers at once, empty, and the update
        asks shard u + 1 mod S, and so on (`try_next_shard`): what each shard holds at the
        learn phase is the run's state, not timing, so a resume still asks where it did."""
        if trainer.on_policy:
            return
        if self.sequential:
            idle = trainer.steps is None and not trainer.samples and not trainer.awaiting
            if idle and trainer.remaining:
                turn = (trainer.updates + trainer.attempt) % len(self.shards)
                self.ask_for_batch(trainer, self.shards[turn])
            return
        if self.wrapping and trainer.averager.size == 1:
            self.end_when_empty_handed(trainer)
            return
        if trainer.dry >= set(self.shards):  # see `end_when_empty_handed`
            trainer.dry.clear()
        wanted = trainer.remaining - len(trainer.samples) - (trainer.steps is not None)
        for shard in self.shards:
            if wanted <= len(trainer.awaiting):
                return
            if shard not in trainer.awaiting and shard not in trainer.dry:
                self.ask_for_batch(trainer, shard)

    def end_when_empty_handed(self, trainer: GroupTrainer) -> None:
        """A lone learner told to wrap up asks for no more batches; with no update in flight,
        no batch in hand and none on its way, no update is left to end after, so its task ends
        now: in drain mode every shard answers at once (empty when it cannot serve).

        Asking on matters elsewhere. Every shard answered empty while no wrap-up came: a task
        granted as the drain of a concurrently written checkpoint ended, the shards' `relax`
        off still on its way; asked again, they serve. A member of a group cannot end alone
        (its group ends on an update's average): it asks until a shard serves it."""
        idle = trainer.steps is None and not trainer.samples and not trainer.awaiting
        if idle and trainer.remaining:
            trainer.unfinished, trainer.remaining = trainer.remaining, 0

    def try_next_shard(self, trainer: GroupTrainer) -> None:
        """Deterministic mode: the shard asked holds none of the group's items; the next in
        the rotation is asked. When none of this learner's shards holds any, a lone learner
        skips the task's updates (counted as empty); the next round's collection fills them.
        A member of a larger group cannot skip alone (its group averages every update)."""
        trainer.attempt += 1
        if trainer.attempt < len(self.shards):
            return
        trainer.attempt = 0
        if trainer.averager.size > 1:
            raise ConfigError(
                f"{self.name}: none of its replay shards {', '.join(self.shards)} holds an item "
                f"of group {trainer.group} at a learn phase (deterministic mode: member j of a "
                "group of n learners samples only shards j, j+n, ...)",
                "raise replay.learning_starts, so that every shard holds the group's items "
                "before learning starts",
            )
        trainer.empty += trainer.remaining
        trainer.remaining = 0

    def ask_for_batch(self, trainer: GroupTrainer, shard: str) -> None:
        trainer.awaiting.add(shard)
        meta = {"group": trainer.group, "n": self.cfg.batch_size}
        if trainer.generation:
            meta["generation"] = trainer.generation
        self.send("sample_request", shard, meta)

    def request_fragments(self, trainer: GroupTrainer, take: dict[str, list[list[int]]]) -> None:
        """On-policy: ask each shard for the fragments the commander assigned this learner
        (ranges of insert ids), none older than `max_policy_lag` versions behind the one
        about to train on them."""
        min_version = trainer.version - trainer.items.replay.max_policy_lag
        for shard in self.shards:
            if shard in take:
                trainer.awaiting.add(shard)
                meta = {"group": trainer.group, "ranges": take[shard], "min_version": min_version}
                self.send("sample_request", shard, meta)
        if not trainer.awaiting:  # nothing assigned: an empty batch (see GroupTrainer.empty)
            trainer.samples.append(self.join_parts(trainer))

    def join_parts(self, trainer: GroupTrainer) -> Message:
        """The fragments of every shard's reply, in shard order, as one batch."""
        replies = [trainer.parts[s].arrays for s in self.shards if s in trainer.parts]
        parts = [p for p in replies if p is not None]
        if parts:
            batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        else:
            spec = trainer.items
            batch = {c.name: np.empty((0, *spec.item_shape(c)), c.dtype) for c in spec.columns}
        trainer.parts = {}
        return Message("sample", "", self.name, {"group": trainer.group}, batch)

    # -- updates ------------------------------------------------------------------------------
    def train_step(self, trainer: GroupTrainer) -> bool:
        """Advance the update in flight when its average is in, or start the next one."""
        if trainer.drift is not None:
            return self.check_drift(trainer)
        if trainer.steps is None:
            if trainer.remaining == 0 or not trainer.samples:
                return False
            return self.begin_update(trainer)
        assert trainer.handle is not None
        if not trainer.averager.ready(trainer.handle):
            return False
        return self.advance(trainer, self.read_average(trainer, trainer.handle))

    def begin_update(self, trainer: GroupTrainer) -> bool:
        msg = trainer.samples.popleft()
        assert msg.arrays is not None
        batch = {c: msg.arrays[c] for c in trainer.items.names}
        if trainer.on_policy and not items_in(batch):
            trainer.empty += 1
            if trainer.averager.size == 1:  # nothing to learn from, and no one to keep pace with
                trainer.remaining -= 1
                self.publish(trainer)
                return True
        weights = msg.arrays.get("weights") if trainer.prioritized else None
        trainer.steps = trainer.algo.update(batch, weights)
        trainer.in_flight = msg
        return self.advance(trainer, None)

    def advance(self, trainer: GroupTrainer, average: np.ndarray | None) -> bool:
        """Run the update to its next average (None: its first), or to its end (an update with
        nothing to average ends at once). An exception of the algorithm fails the task."""
        assert trainer.steps is not None
        result: UpdateResult | None = None
        try:
            try:
                vector = next(trainer.steps) if average is None else trainer.steps.send(average)
            except StopIteration as done:
                result = done.value
                check_losses(trainer, done.value)
        except Exception as err:  # noqa: BLE001 - reported, then the commander ends the job
            self.fail_task(trainer, err)
            return True
        if result is None:
            trainer.handle = self.start_average(trainer, vector)
        else:
            self.end_update(trainer, result)
        return True

    def fail_task(self, trainer: GroupTrainer, err: Exception) -> None:
        """notify_fail_learner_task: tell the commander which task of which group failed,
        after how many updates and why, with the traceback; it records the failure and ends
        the job. This learner does nothing more meanwhile (its group's weights are half
        updated). Reporting first, rather than raising here, lets the run's record hold it:
        an abort from this rank could end the commander before the report arrived."""
        assert self.task is not None
        trainer.steps, trainer.handle, trainer.in_flight = None, None, None
        meta = {
            "task_id": self.task["task_id"],
            "group": trainer.group,
            "updates": trainer.updates,
            "cause": f"{type(err).__name__}: {err}",
            "traceback": "".join(traceback.format_exception(err)),
            "sent_bulk": self.sent_bulk,
        }
        self.send("task_failed", "commander", meta)
        self.task, self.failed = None, True

    def start_average(self, trainer: GroupTrainer, vector: np.ndarray) -> Handle:
        """Average a vector over the group; in a group of several, with this member's wish
        to wrap up the task appended (one float: the group decides together)."""
        if trainer.averager.size > 1:
            vector = np.append(np.asarray(vector, dtype=np.float32), np.float32(self.wrapping))
        return trainer.averager.start(vector)

    def read_average(self, trainer: GroupTrainer, handle: Handle) -> np.ndarray:
        average = trainer.averager.result(handle)
        if trainer.averager.size == 1:
            return average
        trainer.wrap_agreed = trainer.wrap_agreed or bool(average[-1] > 0)
        return average[:-1]

    def wrap_up(self, trainer: GroupTrainer) -> None:
        """End an off-policy task after this update when it was asked to (see the module's
        docstring): alone, on this learner's word; in a group, on the group's."""
        alone = trainer.averager.size == 1
        if (self.wrapping if alone else trainer.wrap_agreed) and not trainer.on_policy:
            trainer.unfinished, trainer.remaining = trainer.remaining, 0
        trainer.wrap_agreed = False

    def end_update(self, trainer: GroupTrainer, result: UpdateResult) -> None:
        trainer.steps, trainer.handle = None, None
        trainer.remaining -= 1
        self.wrap_up(trainer)
        trainer.averaged += 1
        msg, trainer.in_flight = trainer.in_flight, None
        if msg is None or msg.arrays is None or items_in(msg.arrays):
            trainer.stats.append(result.stats)
        if trainer.prioritized and result.priorities is not None and msg is not None:
            self.send_priorities(trainer, msg, result.priorities)
        if trainer.on_policy or trainer.algo.updates % self.cfg.push_interval == 0:
            self.publish(trainer)
        else:
            trainer.unpushed = True
        self.start_drift_check(trainer)

    def start_drift_check(self, trainer: GroupTrainer) -> None:
        """Every `drift_check_interval` averaged updates, gather the group's weight digests."""
        interval = self.drift_check_interval
        if trainer.averager.size > 1 and interval > 0 and trainer.averaged % interval == 0:
            row = np.array([trainer.algo.updates, digest(trainer.algo.group_weights())])
            trainer.drift = trainer.averager.start_gather(row)

    def check_drift(self, trainer: GroupTrainer) -> bool:
        """Compare the group's weight digests; no update starts before they are in."""
        assert trainer.drift is not None
        if not trainer.averager.ready(trainer.drift):
            return False
        rows = trainer.averager.result(trainer.drift)
        trainer.drift = None
        problem = drift_report(rows, trainer.members or [self.name])
        if problem is not None:
            raise RuntimeError(
                f"learners of group {trainer.group} drifted apart after {trainer.averaged} "
                f"averaged updates: {problem}"
            )
        return True

    def send_priorities(self, trainer: GroupTrainer, msg: Message, priorities: np.ndarray) -> None:
        assert msg.arrays is not None
        arrays = {
            "indices": msg.arrays["indices"],
            "insert_ids": msg.arrays["insert_ids"],
            "td": priorities,
        }
        self.send("priorities", msg.src, {"group": trainer.group}, arrays)

    def publish(self, trainer: GroupTrainer) -> None:
        """A new version of every policy of the group; the group's root sends it."""
        trainer.version += 1
        trainer.unpushed = False
        if not trainer.pushes_weights:
            return
        for key, weights in trainer.algo.publish().items():
            meta: dict[str, Any] = {"key": key}
            if not trainer.announced:
                meta["spec"] = trainer.specs[key].to_json()
            self.send("weights_push", trainer.servers[key], meta, {"weights": weights})
        trainer.announced = True

    def finish_task(self) -> None:
        assert self.task is not None
        for trainer in self.trainers.values():
            if trainer.unpushed:
                self.publish(trainer)
        self.send(
            "task_done",
            "commander",
            {
                "task_id": self.task["task_id"],
                "stats": self.task_stats(),
                "info": self.task_info(),
                "sent_bulk": self.sent_bulk,
            },
        )
        self.task = None

    def task_stats(self) -> dict:
        per_group = {}
        for group, trainer in self.trainers.items():
            rows = trainer.stats
            mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}
            per_group[group] = {
                **mean,
                "updates": trainer.updates,
                "version": trainer.version,
                "dropped": dict(trainer.dropped),
                "empty_updates": trainer.empty,
                "unfinished": trainer.unfinished,
            }
        return {"role": self.name, "groups": per_group}

    def task_info(self) -> dict:
        """What DI-engine's update_learner_info carries: this learner's updates, the task's
        updates and their rate, the learning rate and each group's mean losses."""
        began, updates_before = self.task_began
        seconds = time.monotonic() - began
        done = self.updates() - updates_before
        losses = {
            group: {k: float(np.mean([r[k] for r in t.stats])) for k in loss_keys(t.stats)}
            for group, t in self.trainers.items()
        }
        return {
            "updates": self.updates(),
            "task_updates": done,
            "seconds": round(seconds, 4),
            "updates_per_s": round(done / seconds, 2) if seconds > 0 else None,
            "lr": self.cfg.lr,
            "losses": losses,
        }

    def state(self) -> dict:
        import torch

        groups = {
            g: {
                "algo": nest(t.algo.state_dict()),
                "version": t.version,
                "keys": json.dumps(t.keys),
                "generation": t.generation,
                "earlier_updates": t.earlier_updates,
            }
            for g, t in self.trainers.items()
        }
        rng = torch.get_rng_state().numpy()
        return {**super().state(), "groups": groups, "torch_rng": rng}

    def load_state(self, tree: dict) -> None:
        import torch

        for group, entry in tree["groups"].items():
            trainer = self.trainers[group]
            keys = json.loads(entry.get("keys", "{}"))
            if keys and keys != trainer.keys:  # a PSRO run checkpointed after a switch
                self.switch(trainer, keys, int(entry["generation"]))
            trainer.algo.load_state_dict(flatten(entry["algo"]))
            trainer.earlier_updates = int(entry.get("earlier_updates", 0))
            trainer.version = int(entry["version"])
            trainer.announced = trainer.version > 0
        torch.set_rng_state(torch.from_numpy(np.array(tree["torch_rng"], dtype=np.uint8)))

    def counters(self) -> dict:
        """The stop acknowledgement carries the updates this learner applied."""
        return {**super().counters(), "updates": self.updates()}

    def updates(self) -> int:
        return sum(t.updates for t in self.trainers.values())

    def close(self) -> None:
        """Also release each group's averager (torch.distributed's process group)."""
        super().close()
        for trainer in self.trainers.values():
            trainer.averager.close()


def check_losses(trainer: GroupTrainer, result: UpdateResult) -> None:
    """The NaN guard of every algorithm (a plugin's included): an update whose loss is not a
    finite number fails its task here, before its weights are published to the collectors."""
    bad = {
        k: result.stats[k] for k in loss_keys([result.stats]) if not np.isfinite(result.stats[k])
    }
    if bad:
        losses = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise FloatingPointError(
            f"update {trainer.updates} of group {trainer.group} gave a non-finite loss "
            f"({losses}); lower learner.lr, or check the rewards' scale"
        )


def loss_keys(rows: list[dict]) -> list[str]:
    """The loss statistics of an algorithm's update rows (`loss`, `policy_loss`, ...)."""
    return [k for k in rows[0] if k.endswith("loss")] if rows else []


def items_in(batch: dict[str, np.ndarray]) -> int:
    """How many items a batch holds (every column has one row per item)."""
    return len(next(iter(batch.values())))
