"""The cut at start-up, on real roles in one process: learners push their first weights before
any task, and under MPI a large push can land after a later control message (the commander's
checkpoint request). A checkpoint asked for just then must still hold, in the parameter
server's file, every version the learners' files say they published; otherwise a resumed run
names a version no server has, and its first matchup or collect task waits for it forever (a
PSRO job stopped by Slurm's warning during start-up hung so in CI)."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
