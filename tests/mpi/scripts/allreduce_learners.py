"""Real `Learner` roles of one group, driven by hand: start apart, a late member, a drift.

Imported by allreduce_check.py, which hands over the group's averager. Each member hosts its
learner on a `LocalTransport` whose commander, parameter server and replay shard are plain
inboxes; the script plays those roles by putting task and sample messages in the inbox.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from hpcmarl.algos.dqn import DQN
from hpcmarl.algos.networks import get_flat, set_flat
from hpcmarl.comm.allreduce import SoloAverager, digest
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import LocalTransport
from hpcmarl.config.schema import JobConfig
from hpcmarl.roles.learner import GroupTrainer, Learner
from hpcmarl.testing.groups import group_of

DRIFT_CHECK_INTERVAL = 5


def make_learner(
    av: SoloAverager, members: list[str], shards: tuple[str, ...] = ("replay0",)
) -> Learner:
    job = JobConfig()
    job.learner.drift_check_interval = DRIFT_CHECK_INTERVAL
    job.replay.prioritized = False
    group = group_of(4, 2)
    algo = DQN(group, job, seed=av.rank)  # every member starts from different weights
    items, specs = DQN.item_spec(group, job), DQN.policy_specs(group, job)
    servers = dict.fromkeys(specs, "ps0")
    trainer = GroupTrainer("shared", algo, items, specs, av, av.rank == 0, servers, members)
    transport = LocalTransport({}, 0)
    for peer in ("commander", "ps0", *shards):
        transport.register(peer)
    return Learner(members[av.rank], transport, job.learner, [trainer], list(shards))


def poll_until(
    learner: Learner, done: Callable[[], bool], what: str, timeout_s: float = 60.0
) -> int:
    """Poll the learner (never blocking) until `done()`; return how many polls it took."""
    polls, deadline = 0, time.monotonic() + timeout_s
    while not done():
        learner.poll()
        polls += 1
        assert time.monotonic() < deadline, f"{learner.name}: {what} never happened"
        time.sleep(0.001)
    return polls


def give_task(learner: Learner, batch: dict, task_id: int, updates: int, late_s: float) -> int:
    """Grant a task, deliver its batches `late_s` later, poll until the task is done."""
    inbox = learner.inbox
    inbox.append(
        Message("task", "commander", learner.name, {"task_id": task_id, "updates": updates})
    )
    commander = learner.transport.inboxes["commander"]
    deadline = time.monotonic() + late_s
    meta = {"group": "shared"}
    samples = [Message("sample", "replay0", learner.name, meta, dict(batch))] * updates

    def finished() -> bool:
        if samples and time.monotonic() >= deadline:
            inbox.extend(samples)
            samples.clear()
        return any(m.kind == "task_done" and m.meta["task_id"] == task_id for m in commander)

    return poll_until(learner, finished, f"task {task_id}")


def weights_row(learner: Learner) -> np.ndarray:
    algo = learner.trainers["shared"].algo
    return np.array([algo.updates, digest(algo.group_weights())])


def check_learners(av: SoloAverager, members: list[str], batch: dict) -> None:
    learner = make_learner(av, members)
    poll_until(learner, lambda: learner.started, "start-up")
    rows = av.gather(weights_row(learner))
    assert (rows == rows[0]).all(), f"members still apart after the start broadcast: {rows}"
    late = av.size - 1
    polls = give_task(learner, batch, 1, 12, late_s=0.5 if av.rank == late else 0.0)
    assert av.rank == late or polls > 50, f"{learner.name} blocked: {polls} polls"
    rows = av.gather(weights_row(learner))
    assert (rows == rows[0]).all() and rows[0][0] == 12, f"members apart after a task: {rows}"
    check_wrap_beside_a_starved_shard(av, members, batch)
    if av.rank == late:  # a learner gone astray: one weight off by a little
        algo = learner.trainers["shared"].algo
        assert isinstance(algo, DQN)
        weights = get_flat(algo.q)
        weights[0] += 1e-3
        set_flat(algo.q, weights)
    try:
        give_task(learner, batch, 2, 4, late_s=0.0)
    except RuntimeError as err:
        text = str(err)
        assert f"{members[late]} differ from" in text and "group shared" in text, text
        return
    raise AssertionError("a drifted learner went unnoticed")


def check_wrap_beside_a_starved_shard(av: SoloAverager, members: list[str], batch: dict) -> None:
    """A free-running task keeps a request at every shard. Once collection stops for a
    checkpoint or the end, a shard below `learning_starts` answers it empty (drain mode) while
    the other serves at once: the members, told to wrap up at different times, still end the
    task after the same update, with no request left in flight, and ask the starved shard no
    more in that task."""
    learner = make_learner(av, members, ("replay0", "replay1"))
    poll_until(learner, lambda: learner.started, "start-up")
    task = {"task_id": 3, "updates": 10**9}
    learner.inbox.append(Message("task", "commander", learner.name, task))
    inboxes, held, asked = learner.transport.inboxes, [], 0
    wrap_at = time.monotonic() + 0.2 * (1 + av.rank)

    def shards_answer() -> bool:
        nonlocal asked
        for msg in drained(inboxes["replay0"]):
            learner.inbox.append(Message("sample", "replay0", learner.name, msg.meta, dict(batch)))
        requests = drained(inboxes["replay1"])
        held.extend(requests)  # below learning_starts: held, as a shard does
        asked += len(requests)
        if held and time.monotonic() >= wrap_at:
            if not learner.wrapping:
                learner.inbox.append(Message("wrap_up", "commander", learner.name, task))
            empty = {"group": "shared", "items": 0, "empty": True}
            learner.inbox.extend(Message("sample", "replay1", learner.name, empty) for _ in held)
            held.clear()
        return any(m.kind == "task_done" for m in inboxes["commander"])

    poll_until(learner, shards_answer, "the wrapped task")
    rows = av.gather(weights_row(learner))
    assert (rows == rows[0]).all() and rows[0][0] > 0, f"members apart after a wrap: {rows}"
    trainer = learner.trainers["shared"]
    assert trainer.unfinished > 0 and not trainer.awaiting, learner.name
    assert asked == 1, f"{learner.name} asked the starved shard {asked} times"


def drained(inbox: deque[Message]) -> list[Message]:
    """The messages an inbox holds, taken out of it."""
    taken = list(inbox)
    inbox.clear()
    return taken
