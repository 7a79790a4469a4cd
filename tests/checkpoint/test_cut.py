"""The cut at start-up, on real roles in one process: learners push their first weights before
any task, and under MPI a large push can land after a later control message (the commander's
checkpoint request). A checkpoint asked for just then must still hold, in the parameter
server's file, every version the learners' files say they published; otherwise a resumed run
names a version no server has, and its first matchup or collect task waits for it forever (a
PSRO job stopped by Slurm's warning during start-up hung so in CI)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import LocalTransport
from hpcmarl.config.loader import load_job
from hpcmarl.core import Role
from hpcmarl.launch.build import build_roles
from hpcmarl.roles.commander import Commander
from hpcmarl.storage.checkpoint import latest_checkpoint
from hpcmarl.testing.world import OneRank


class SlowPushes(LocalTransport):
    """Holds weight pushes back while `holding`, as a slow bulk receive under MPI would."""

    def __init__(self, rank_of: dict[str, int]) -> None:
        super().__init__(rank_of, 0)
        self.holding = True
        self.held: list[Message] = []

    def send(self, msg: Message) -> None:
        if self.holding and msg.kind == "weights_push":
            self.held.append(msg)
        else:
            super().send(msg)

    def release(self) -> None:
        self.holding = False
        for msg in self.held:
            super().send(msg)
        self.held = []


def poll(roles: list[Role], rounds: int) -> None:
    for _ in range(rounds):
        for role in roles:
            if not role.finished:
                role.poll()


def test_a_cut_during_start_up_waits_for_the_learners_first_push(tmp_path: Path) -> None:
    cfg = load_job("jobs/kuhn_psro.yaml", [f"runtime.run_dir={tmp_path}"])
    world = OneRank(cfg)
    transport = SlowPushes(world.topology.rank_of)
    roles = build_roles(cfg, world.spec, world.topology, transport, None, str(tmp_path))
    commander = next(role for role in roles if isinstance(role, Commander))
    (server,) = world.topology.names("param_server")
    learners = [role for role in roles if role.kind == "learner"]
    for role in roles:
        role.start()
    # The learners start up and push (held back); then the checkpoint is asked for.
    while not all(learner.started for learner in learners):  # type: ignore[attr-defined]
        for learner in learners:
            learner.poll()
    assert transport.held, "the learners pushed nothing at start-up"
    commander.checkpoints.begin()
    poll(roles, 50)
    cut = commander.checkpoints.cut
    assert cut is not None and server in cut.cutting, "the server was cut without the push"
    transport.release()
    deadline = time.monotonic() + 60
    while commander.checkpoints.cut is not None and time.monotonic() < deadline:
        poll(roles, 1)
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    tables = checkpoint.read_role(server)["tables"]
    checked = 0
    for learner in learners:
        learned = checkpoint.read_role(learner.name)["groups"]
        for entry in learned.values():
            published = int(entry["version"])
            assert published == 1
            for key in json.loads(entry["keys"]).values():
                spec, policy = key.split("/", 1)
                assert int(tables[spec][policy]["version"]) == published, (key, tables)
                assert "weights" in tables[spec][policy], key
                checked += 1
    assert checked == 2  # one policy per player


STARVED_SHARD = [
    "commander.stop_value=null",
    "commander.eval_interval_s=1000",
    "checkpoint.interval_s=0",
    "topology.learners=1",
    "topology.replay_shards=2",
    # Compact rows: each collector feeds one home shard, replay0 those of collectors 0 and 2,
    # replay1 that of collector 1, so replay0 reaches learning_starts first.
    "topology.collectors=3",
    "replay.ignore_obs_next=true",
    "replay.learning_starts=300",
    "collector.fragments_per_task=1",
]


@pytest.mark.parametrize("end", ["cut", "stop"])
def test_a_learner_task_waiting_on_a_shard_below_learning_starts_ends(
    tmp_path: Path, end: str
) -> None:
    """A learner task keeps a sample request at every shard, and a shard holds one it cannot
    serve until inserts come. Once collection stops for a checkpoint or the end, none may
    come: a request at a shard below `learning_starts` held the cut (and the final stop)
    until its timeout, while the other shard could be sampled and the task had begun."""
    cfg = load_job("jobs/default.yaml", [*STARVED_SHARD, f"runtime.run_dir={tmp_path}"])
    world = OneRank(cfg)
    roles = build_roles(cfg, world.spec, world.topology, world.transport, None, str(tmp_path))
    commander = next(role for role in roles if isinstance(role, Commander))
    ready, starved = (next(r for r in roles if r.name == n) for n in ("replay0", "replay1"))
    learner = next(role for role in roles if role.kind == "learner")
    collectors = [role for role in roles if role.kind == "collector"]
    (group,) = learner.trainers  # type: ignore[attr-defined]
    trainer = learner.trainers[group]  # type: ignore[attr-defined]
    starts = cfg.replay.learning_starts
    for role in roles:
        role.start()
    poll_until(roles, lambda: ready.tables[group].size >= starts, "replay0 to fill")  # type: ignore[attr-defined]
    # Collection paused (the collectors' tasks in flight end after the cut or stop begins):
    # the learner's task starts, with a request waiting at the starved shard.
    others = [role for role in roles if role not in collectors]
    poll_until(others, lambda: starved.name in trainer.awaiting, "a learner task")
    # The starved shard's size when the learner's task ended: below learning_starts, so the
    # task ended without its request there being served. (After a cut, collection goes on
    # while the checkpoint is written, and may fill the shard.)
    size_at_task_end: list[int] = []

    def ended(done: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            if learner.task is None and not size_at_task_end:  # type: ignore[attr-defined]
                size_at_task_end.append(starved.tables[group].size)  # type: ignore[attr-defined]
            return done() and bool(size_at_task_end)

        return check

    if end == "cut":  # committed only once no task runs
        commander.checkpoints.begin()
        taken = ended(lambda: commander.checkpoints.taken == ["000001"])
        poll_until(roles, taken, "the checkpoint")
    else:
        commander.request_stop("step budget reached")  # with the final checkpoint (at_end)
        poll_until(roles, ended(lambda: commander.finished), "the stop")
        assert commander.exit_code == 0
        assert trainer.unfinished > 0 and learner.task is None  # type: ignore[attr-defined]
    assert size_at_task_end[0] < starts, size_at_task_end


def poll_until(roles: list[Role], done: Callable[[], bool], what: str, limit_s: float = 30) -> None:
    """Poll every role until `done()`; a wait past `limit_s` fails, naming what it waited for."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"waited {limit_s:g} s for {what}"
        poll(roles, 1)
