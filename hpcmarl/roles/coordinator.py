"""The commander's side of a coordinated checkpoint: one consistent cut of every table.

1. Quiesce: no new tasks; replay shards drain (insert and sample without the ratio) so that
   running collector and learner tasks can finish.
2. Cut: once no task runs, every stateful role is asked to write its file, with the number of
   bulk messages (batches, priorities, weight pushes) each producer sent it before the cut;
   a role writes only after receiving exactly those, so nothing in flight is left out.
3. Commit: when every role has acknowledged, the commander writes its own file, then the
   manifest, and moves `latest`; only then does the checkpoint exist. Work resumes, or the run
   stops if the checkpoint was taken for a signal or the end of the run.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..storage.checkpoint import FileRecord, commit_checkpoint, next_checkpoint_id, write_role_state

if TYPE_CHECKING:
    from .commander import Commander

STATEFUL_KINDS = ("param_server", "replay_shard", "learner", "collector")


@dataclass
class Cut:
    """A checkpoint in progress."""

    id: str
    then: tuple[str, int] | None
    """(stop reason, exit code) when the run stops after this checkpoint, else None."""
    started: float = field(default_factory=time.monotonic)
    requested: bool = False
    waiting: set[str] = field(default_factory=set)
    records: list[FileRecord] = field(default_factory=list)


class CheckpointCoordinator:
    """Runs the three steps above from the commander's loop, never blocking it."""

    def __init__(self, commander: Commander) -> None:
        self.commander = commander
        self.cut: Cut | None = None
        self.taken: list[str] = []
        self.sent_bulk: dict[str, dict[str, int]] = {}
        self.last_time = time.monotonic()
        self.last_updates = 0

    @property
    def active(self) -> bool:
        return self.cut is not None

    def note_sent(self, role: str, sent_bulk: dict[str, int]) -> None:
        """A task report's cumulative count of bulk messages per destination."""
        self.sent_bulk[role] = dict(sent_bulk)

    def due(self, updates: int) -> bool:
        cfg = self.commander.cfg.checkpoint
        by_time = cfg.interval_s > 0 and time.monotonic() - self.last_time >= cfg.interval_s
        by_updates = cfg.every_updates > 0 and updates - self.last_updates >= cfg.every_updates
        return by_time or by_updates

    def begin(self, then: tuple[str, int] | None = None) -> None:
        """Start a checkpoint (or, if one runs, make it stop the run when done)."""
        if self.cut is not None:
            self.cut.then = self.cut.then or then
            return
        run_dir = self.commander.cfg.runtime.run_dir
        self.cut = Cut(next_checkpoint_id(run_dir), then)
        self.commander.relax_shards(True)

    def poll(self) -> bool:
        cut = self.cut
        if cut is None:
            return False
        self.check_timeout(cut)
        if not cut.requested:
            if self.commander.running:
                return False
            self.request_files(cut)
            return True
        if cut.waiting:
            return False
        self.commit(cut)
        return True

    def request_files(self, cut: Cut) -> None:
        topology = self.commander.topology
        roles = [n for n, k in topology.kind_of.items() if k in STATEFUL_KINDS]
        expect: dict[str, dict[str, int]] = {}
        for src, per_dst in self.sent_bulk.items():
            for dst, count in per_dst.items():
                expect.setdefault(dst, {})[src] = count
        meta = {"id": cut.id, "run_dir": self.commander.cfg.runtime.run_dir, "expect": expect}
        for role in roles:
            self.commander.send("checkpoint", role, meta)
        cut.requested, cut.waiting = True, set(roles)

    def on_checkpointed(self, role: str, meta: dict[str, Any]) -> None:
        cut = self.cut
        if cut is None or meta["id"] != cut.id:
            return
        cut.records.append(FileRecord(**meta["record"]))
        cut.waiting.discard(role)

    def commit(self, cut: Cut) -> None:
        commander = self.commander
        cfg = commander.cfg
        self.taken.append(cut.id)
        record = write_role_state(cfg.runtime.run_dir, cut.id, "commander", commander.state())
        info = {
            "counters": commander.stats.counters(),
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
        commander.sink.say(
            f"hpcmarl: checkpoint {cut.id} written "
            f"({commander.position()}, "
            f"{time.monotonic() - cut.started:.1f} s)"
        )
        commander.sink.record("checkpoint", {"id": cut.id, "env_steps": commander.stats.env_steps})
        commander.relax_shards(False)
        if cut.then is not None:
            reason, code = cut.then
            commander.begin_stop(f"{reason}; checkpoint {cut.id}", exit_code=code)

    def check_timeout(self, cut: Cut) -> None:
        limit = self.commander.cfg.checkpoint.timeout_s
        if time.monotonic() - cut.started > limit:
            silent = sorted(cut.waiting) or sorted(set(self.commander.running.values()))
            raise RuntimeError(
                f"checkpoint {cut.id} not finished after {limit:g} s; "
                f"waiting for: {', '.join(silent)}"
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
