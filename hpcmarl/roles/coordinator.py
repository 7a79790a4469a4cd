"""The commander's side of a coordinated checkpoint: one consistent cut of every table.

1. Quiesce: no new tasks; replay shards drain (insert and sample without the ratio) so that
   running collector and learner tasks can finish.
2. Cut: once no task runs and every learner has asked for its first task (which counts the
   weights it pushed at start-up), every stateful role is asked for its state, with the number
   of bulk messages (batches, priorities, weight pushes) each producer sent it before the cut;
   a role snapshots its state only after receiving exactly those, so nothing in flight is left
   out, and says so (`snapshotted`, with the bytes it will write). The commander's own state is
   taken at the same moment.
3. Write: every role writes its snapshot on a thread while its loop goes on, and work resumes
   as soon as every role has snapshotted: collectors collect and learners learn while a replay
   shard writes many GiB. A checkpoint that ends the run keeps everything still instead.
4. Commit: when every role reported its file (`checkpointed`), the commander writes its own
   file, then the manifest, and moves `latest`; only then does the checkpoint exist.

A stop requested during the write waits for the commit: a signal (Slurm's warning) stops the
run with this checkpoint, so a resumed run redoes only what ran during the write; the end of
a run that asks for a final checkpoint takes a new one after it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..storage.checkpoint import FileRecord, commit_checkpoint, next_checkpoint_id, write_role_state
from ..storage.writer import snapshot, tree_nbytes

if TYPE_CHECKING:
    from .commander import Commander

STATEFUL_KINDS = ("param_server", "replay_shard", "learner", "collector")
WRITE_RATE_FLOOR = 50e6
"""Bytes per second below which a checkpoint's write counts as hung: the timeout grows by the
snapshot's bytes at this rate (a shared filesystem under load still writes faster)."""
SHARED_WRITE_RATE_FLOOR = 10e6
"""The same while work goes on: writer threads yield the CPU to the run (storage.writer), so on
a node the ranks fill they write slower."""

Then = tuple[str, int]
"""(stop reason, exit code): the run stops once the checkpoint is committed."""


@dataclass
class Cut:
    """A checkpoint in progress."""

    id: str
    then: Then | None
    started: float = field(default_factory=time.monotonic)
    requested: bool = False
    cutting: set[str] = field(default_factory=set)
    """Roles asked for their state that have not snapshotted it yet."""
    writing: set[str] = field(default_factory=set)
    """Roles whose file is not written yet."""
    records: list[FileRecord] = field(default_factory=list)
    commander_state: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0
    cut_s: float = 0.0
    slowest_write_s: float = 0.0
    follow: Then | None = None
    """A final checkpoint asked for while this one was written: taken once this one commits."""
    begun: tuple[float, int] = (0.0, 0)
    """(training clock, env steps) when the checkpoint began: what it cost the run follows."""
    resumed: tuple[float, int] | None = None
    """(training clock, env steps) when work resumed, every role having snapshotted; None
    while it has not (or, for a checkpoint that ends the run, never)."""

    @property
    def written_concurrently(self) -> bool:
        """Work goes on while the files are written (every role snapshotted, no stop ahead)."""
        return self.requested and not self.cutting and self.then is None and self.follow is None


class CheckpointCoordinator:
    """Runs the steps above from the commander's loop, never blocking it."""

    def __init__(self, commander: Commander) -> None:
        self.commander = commander
        self.cut: Cut | None = None
        self.taken: list[str] = []
        self.sent_bulk: dict[str, dict[str, int]] = {}
        self.last_time = time.monotonic()
        self.last_updates = 0

    @property
    def blocking(self) -> bool:
        """Whether the commander must hold new tasks back: a cut is being taken, or the run
        stops after the checkpoint being written."""
        return self.cut is not None and not self.cut.written_concurrently

    def note_sent(self, role: str, sent_bulk: dict[str, int]) -> None:
        """A task report's cumulative count of bulk messages per destination."""
        self.sent_bulk[role] = dict(sent_bulk)

    def forget(self, role: str) -> None:
        """A role whose rank died: a cut neither waits for its file nor expects its messages;
        the shards stop counting what it sent, once they hear of the loss themselves."""
        self.sent_bulk.pop(role, None)
        if self.cut is not None:
            self.cut.cutting.discard(role)
            self.cut.writing.discard(role)

    def starting_learners(self) -> set[str]:
        """Learners that have reported no bulk count yet: their start-up push of their groups'
        weights (sent before any task) is counted by their first task request, and a cut taken
        before it could leave a server's file without a version a learner's file holds."""
        return set(self.commander.learners) - set(self.sent_bulk)

    def due(self, updates: int) -> bool:
        cfg = self.commander.cfg.checkpoint
        if self.cut is not None:
            return False
        by_time = cfg.interval_s > 0 and time.monotonic() - self.last_time >= cfg.interval_s
        by_updates = cfg.every_updates > 0 and updates - self.last_updates >= cfg.every_updates
        return by_time or by_updates

    def begin(self, then: Then | None = None, fresh: bool = False) -> None:
        """Start a checkpoint. If one is in progress, the run stops after it (`then`), or, with
        `fresh`, after a new one taken once it commits (a final checkpoint must hold the end
        state, not the state of a cut that work has moved past)."""
        cut = self.cut
        if cut is None:
            run_dir = self.commander.cfg.runtime.run_dir
            stats = self.commander.stats
            self.cut = Cut(
                next_checkpoint_id(run_dir), then, begun=(stats.elapsed(), stats.env_steps)
            )
            self.commander.relax_shards(True)
            self.commander.wrap_up_learners()
        elif then is not None and cut.then is None and cut.follow is None:
            if fresh and cut.requested and not cut.cutting:
                cut.follow = then
            else:
                cut.then = then

    def poll(self) -> bool:
        cut = self.cut
        if cut is None:
            return False
        self.check_timeout(cut)
        if not cut.requested:
            if self.commander.running or self.starting_learners():
                return False
            self.request_states(cut)
            return True
        if cut.cutting or cut.writing:
            return False
        self.commit(cut)
        return True

    def request_states(self, cut: Cut) -> None:
        commander = self.commander
        roles = [
            name
            for name, kind in commander.topology.kind_of.items()
            if kind in STATEFUL_KINDS and name not in commander.lost_peers
        ]
        expect: dict[str, dict[str, int]] = {}
        for src, per_dst in self.sent_bulk.items():
            for dst, count in per_dst.items():
                expect.setdefault(dst, {})[src] = count
        meta = {"id": cut.id, "run_dir": commander.cfg.runtime.run_dir, "expect": expect}
        for role in roles:
            commander.send("checkpoint", role, meta)
        cut.requested, cut.cutting, cut.writing = True, set(roles), set(roles)
        cut.commander_state = snapshot(commander.state())
        cut.counters = commander.stats.counters()
        cut.nbytes = tree_nbytes(cut.commander_state)

    def on_snapshotted(self, role: str, meta: dict[str, Any]) -> None:
        cut = self.cut
        if cut is None or meta["id"] != cut.id or role not in cut.cutting:
            return
        cut.cutting.discard(role)
        cut.nbytes += int(meta.get("bytes", 0))
        if not cut.cutting:
            cut.cut_s = time.monotonic() - cut.started
            if cut.written_concurrently:
                stats = self.commander.stats
                cut.resumed = (stats.elapsed(), stats.env_steps)
                self.commander.relax_shards(False)

    def on_checkpointed(self, role: str, meta: dict[str, Any]) -> None:
        cut = self.cut
        if cut is None or meta["id"] != cut.id:
            return
        cut.records.append(FileRecord(**meta["record"]))
        cut.slowest_write_s = max(cut.slowest_write_s, float(meta.get("seconds", 0.0)))
        cut.writing.discard(role)

    def commit(self, cut: Cut) -> None:
        commander = self.commander
        cfg = commander.cfg
        self.taken.append(cut.id)
        state = {**cut.commander_state, "checkpoints": list(self.taken)}
        record = write_role_state(cfg.runtime.run_dir, cut.id, "commander", state)
        info = {
            "counters": cut.counters,
            "world": commander.topology.rank_of,
            "world_size": commander.topology.world_size,
            "config_sha256": config_digest(commander.cfg),
            "groups": commander.topology.groups,
            "keys": commander.population.keys(),
        }
        commit_checkpoint(
            cfg.runtime.run_dir, cut.id, [*cut.records, record], info, keep=cfg.checkpoint.keep
        )
        self.cut, self.last_time = None, time.monotonic()
        self.last_updates = commander.stats.total_updates()
        total = time.monotonic() - cut.started
        commander.sink.say(
            f"hpcmarl: checkpoint {cut.id} written "
            f"({cut.counters.get('env_steps', 0)} env steps, {total:.1f} s: "
            f"cut in {cut.cut_s:.1f} s, {cut.nbytes / 1e6:.1f} MB written in "
            f"{cut.slowest_write_s:.1f} s{' while work went on' if cut.resumed else ''})"
        )
        commander.sink.record(
            "checkpoint",
            {
                "id": cut.id,
                "env_steps": cut.counters.get("env_steps", 0),
                "bytes": cut.nbytes,
                "cut_s": round(cut.cut_s, 3),
                "write_s": round(cut.slowest_write_s, 3),
                "total_s": round(total, 3),
                "begin_time_s": round(cut.begun[0], 3),
                "begin_env_steps": cut.begun[1],
                "commit_time_s": round(commander.stats.elapsed(), 3),
                "commit_env_steps": commander.stats.env_steps,
                **(
                    {"resume_time_s": round(cut.resumed[0], 3), "resume_env_steps": cut.resumed[1]}
                    if cut.resumed
                    else {}
                ),
            },
        )
        if cut.follow is not None:
            self.begin(then=cut.follow)
        elif cut.then is not None:
            reason, code = cut.then
            commander.begin_stop(f"{reason}; checkpoint {cut.id}", exit_code=code)

    def check_timeout(self, cut: Cut) -> None:
        limit = self.commander.cfg.checkpoint.timeout_s
        if cut.requested and not cut.cutting:
            limit += cut.nbytes / (SHARED_WRITE_RATE_FLOOR if cut.resumed else WRITE_RATE_FLOOR)
        if time.monotonic() - cut.started > limit:
            raise RuntimeError(
                f"checkpoint {cut.id} not finished after {limit:g} s; " + self.waiting_for(cut)
            )

    def waiting_for(self, cut: Cut) -> str:
        """Who holds the checkpoint up and doing what, with the fix for that stage: tasks that
        do not end (an evaluation of an env without a time limit) before the cut, a slow
        filesystem after it."""
        if cut.requested:
            silent = ", ".join(sorted(cut.cutting or cut.writing))
            return (
                f"{cut.nbytes / 1e6:.0f} MB to write; waiting for: {silent}; raise "
                "checkpoint.timeout_s if the run directory's filesystem is this slow"
            )
        running = self.commander.running.items()
        busy = [f"{role} (running {task_id})" for task_id, role in sorted(running)]
        busy += [f"{learner} (starting)" for learner in sorted(self.starting_learners())]
        return (
            f"waiting for tasks to end before the cut: {', '.join(busy)}; a task that never "
            "ends is a bug, or an evaluation whose episodes are too long: lower "
            "commander.eval_max_episode_steps"
        )


RESUMABLE_CHANGES = (
    "commander",
    "checkpoint",
    "runtime",
    "replay_log",
    "topology.collectors",
    "topology.replay_shards",
    "topology.colocate",
)
"""Job keys a resumed run may change; any other change makes it a different job."""


def config_digest(cfg: Any) -> str:
    """Digest of the job minus what a resume may change, to recognise a run's own checkpoints."""
    from ..config.loader import job_to_dict

    plain = job_to_dict(cfg)
    for key in RESUMABLE_CHANGES:
        section, _, name = key.partition(".")
        if name:
            plain.get(section, {}).pop(name, None)
        else:
            plain.pop(section, None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()
