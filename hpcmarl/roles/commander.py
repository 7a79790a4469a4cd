"""The commander (rank 0): hands out work, evaluates, decides when to stop, shuts down in order.

Collectors and learners ask for tasks; the commander grants them while task space is left
(DI-engine's SoloCommander). Every `eval_interval_s` the next collector task is a greedy
evaluation; its mean return against `stop_value`, the step budget, the wall-time limit or an
interrupt ends the run. Shutdown goes in phases so that nobody waits for a message that cannot
come: collectors stop and shards serve freely (draining) until running learner tasks end; then
learners, parameter servers and shards stop and acknowledge.
"""

from __future__ import annotations

import time
from collections import deque

from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..config.schema import JobConfig
from ..core import Role
from ..launch import signals
from ..launch.topology import Topology
from ..metrics import MetricsSink
from .coordinator import CheckpointCoordinator
from .free_running import FreeRunning
from .lockstep import Lockstep
from .run_stats import RunStats
from .task_space import TaskSpace

EXIT_CHECKPOINTED = 75
"""Exit code of a run stopped by a signal after writing its checkpoint: requeue and resume."""


class Commander(Role):
    """Schedules collector and learner tasks and owns the stop condition."""

    kind = "commander"

    def __init__(
        self, transport: LocalTransport, cfg: JobConfig, topology: Topology, sink: MetricsSink
    ) -> None:
        super().__init__("commander", transport)
        self.cfg, self.topology, self.sink = cfg, topology, sink
        self.collectors = topology.names("collector")
        self.learners = topology.names("learner")
        space = cfg.commander.collector_task_space or len(self.collectors)
        self.collector_space = TaskSpace(space)
        self.learner_space = TaskSpace(len(self.learners))
        self.waiting_collectors: deque[str] = deque()
        self.waiting_learners: set[str] = set()
        self.running: dict[str, str] = {}
        self.stats = RunStats(cfg.commander, offline=bool(cfg.offline.dataset))
        self.last_progress = time.monotonic()
        self.phase = "running"
        self.stop_reason = ""
        self.exit_code = 0
        self.awaiting_ack: set[str] = set()
        self.phase_started = time.monotonic()
        self.checkpoints = CheckpointCoordinator(self)
        self.lockstep = Lockstep(self) if cfg.commander.deterministic else None
        self.schedule: Lockstep | FreeRunning = self.lockstep or FreeRunning(self)
        self.last_seen = {name: time.monotonic() for name in topology.rank_of if name != self.name}

    # -- the loop -------------------------------------------------------------------------
    def work(self) -> bool:
        progressed = False
        if self.phase == "running" and self.checkpoints.active:
            self.check_signals()
            progressed = self.checkpoints.poll()
        elif self.phase == "running":
            self.check_between_tasks()
            if self.phase == "running" and not self.checkpoints.active:
                progressed = self.grant_tasks()
        if self.phase == "draining" and self.drained():
            self.stop_roles(
                self.learners
                + self.topology.names("param_server")
                + self.topology.names("replay_shard"),
                next_phase="stopping",
            )
        if self.phase == "stopping" and not self.awaiting_ack:
            self.conclude()
            return True
        self.check_shutdown_timeout()
        self.check_heartbeats()
        return self.report_progress() or progressed

    # -- messages -------------------------------------------------------------------------
    def handle_task_request(self, msg: Message) -> None:
        if self.topology.kind_of[msg.src] == "collector":
            self.waiting_collectors.append(msg.src)
        else:
            self.waiting_learners.add(msg.src)

    def handle_task_done(self, msg: Message) -> None:
        role = self.running.pop(msg.meta["task_id"], msg.src)
        self.checkpoints.note_sent(role, msg.meta.get("sent_bulk", {}))
        if self.topology.kind_of[role] == "collector":
            self.collector_space.release()
            if "eval" in msg.meta:
                self.on_eval(msg.meta["eval"])
            else:
                self.stats.on_collect(msg.meta["collect"])
                self.record_episodes(role, msg.meta["collect"])
                if self.lockstep is not None:
                    self.lockstep.on_collect(msg.meta["collect"])
        else:
            self.learner_space.release()
            self.stats.on_learn(msg.meta["stats"])
            if self.lockstep is not None:
                self.lockstep.on_learn(msg.meta["stats"])

    def record_episodes(self, collector: str, stats: dict) -> None:
        """One `episode` row per finished training episode, for offline analysis to check."""
        for episode_id, ret, length in zip(
            stats["episode_ids"], stats["episode_returns"], stats["episode_lengths"], strict=True
        ):
            self.sink.record(
                "episode",
                {
                    "collector": collector,
                    "episode_id": episode_id,
                    "return": ret,
                    "length": length,
                    "env_steps": self.stats.env_steps,
                },
            )

    def handle_task_failed(self, msg: Message) -> None:
        """notify_fail: the task's space is released and the failure recorded."""
        role = self.running.pop(msg.meta["task_id"], msg.src)
        self.checkpoints.note_sent(role, msg.meta.get("sent_bulk", {}))
        space = self.collector_space if self.topology.kind_of[role] == "collector" else None
        (space or self.learner_space).release()
        self.sink.record("task_failed", {"role": role, **msg.meta})

    def note_message(self, msg: Message) -> None:
        if msg.src in self.last_seen:
            self.last_seen[msg.src] = time.monotonic()

    def handle_heartbeat(self, msg: Message) -> None:
        """Nothing to do: every message, this one included, proves its sender alive."""

    def check_heartbeats(self) -> None:
        """Abort, naming them, when roles went silent: a hung rank must not burn the
        allocation until its time limit."""
        limit = self.cfg.runtime.heartbeat_timeout_s
        now = time.monotonic()
        silent = sorted(name for name, seen in self.last_seen.items() if now - seen > limit)
        if silent:
            names = ", ".join(f"{n} (rank {self.topology.rank_of[n]})" for n in silent)
            raise RuntimeError(
                f"no heartbeat for {limit:g} s from {names}: stopped, hung or "
                "starved of CPU; raise runtime.heartbeat_timeout_s if overloaded"
            )

    def handle_checkpointed(self, msg: Message) -> None:
        self.checkpoints.on_checkpointed(msg.src, msg.meta)

    def handle_stats(self, msg: Message) -> None:
        self.stats.on_role_stats(msg.meta)

    def handle_stopped(self, msg: Message) -> None:
        self.awaiting_ack.discard(msg.src)
        self.last_seen.pop(msg.src, None)
        for task_id, role in list(self.running.items()):
            if role == msg.src and self.topology.kind_of[role] == "collector":
                del self.running[task_id]

    # -- scheduling -----------------------------------------------------------------------
    def check_between_tasks(self) -> None:
        """Stop conditions and periodic checkpoints; in deterministic mode only between rounds."""
        if self.lockstep is not None and not self.lockstep.at_boundary:
            self.check_signals()
            return
        self.check_stop_conditions()
        if self.phase == "running" and self.checkpoints.due(self.stats.total_updates()):
            self.checkpoints.begin()

    def grant_tasks(self) -> bool:
        return self.schedule.advance()

    def learner_groups(self) -> list[list[str]]:
        groups = {tuple(sorted(m)) for m in self.topology.learners_of_policy.values()}
        return [list(g) for g in sorted(groups)]

    def increase_collector_task_space(self, n: int = 1) -> None:
        """Resume paused collectors."""
        self.collector_space.increase(n)

    def decrease_collector_task_space(self, n: int = 1) -> None:
        """Pause collectors: running tasks finish, their next requests wait."""
        self.collector_space.decrease(n)

    # -- evaluation and stopping ----------------------------------------------------------
    def on_eval(self, result: dict) -> None:
        self.schedule.eval_done()
        value = result["return_mean"]
        self.stats.eval_returns.append(value)
        row = {
            "time_s": round(self.stats.elapsed(), 2),
            "env_steps": self.stats.env_steps,
            "updates": self.stats.total_updates(),
            **result,
        }
        self.sink.record("eval", row)
        self.sink.say(
            f"hpcmarl: eval return {value:.1f} +- {result['return_std']:.1f} over "
            f"{result['episodes']} episodes at {self.position()}"
        )
        target = self.cfg.commander.stop_value
        if target is not None and value >= target and self.phase == "running":
            self.request_stop(f"stop_value reached (eval return {value:.1f} >= {target:g})")

    def check_stop_conditions(self) -> None:
        c = self.cfg.commander
        if self.check_signals():
            return
        if self.stats.env_steps >= c.max_env_steps:
            self.request_stop("step budget reached")
        elif c.max_updates and self.stats.total_updates() >= c.max_updates:
            self.request_stop("update budget reached")
        elif c.max_wall_time_s and self.stats.elapsed() >= c.max_wall_time_s:
            self.request_stop("wall-time limit reached")

    def check_signals(self) -> bool:
        """Slurm's warning (USR1), preemption (TERM) or Ctrl-C: checkpoint, then stop with 75."""
        if not signals.requested():
            return False
        reason = f"interrupted by {signals.requested()}; checkpointed at the time limit"
        self.checkpoints.begin(then=(reason, EXIT_CHECKPOINTED))
        return True

    def request_stop(self, reason: str) -> None:
        """Stop, after a final checkpoint when the job asks for one."""
        if self.cfg.checkpoint.at_end:
            self.checkpoints.begin(then=(reason, 0))
        else:
            self.begin_stop(reason)

    def begin_stop(self, reason: str, exit_code: int = 0) -> None:
        self.stop_reason, self.exit_code = reason, exit_code
        self.relax_shards(True)
        self.stop_roles(self.collectors, next_phase="draining")

    def relax_shards(self, on: bool) -> None:
        for shard in self.topology.names("replay_shard"):
            self.send("relax", shard, {"on": on})

    def stop_roles(self, roles: list[str], next_phase: str) -> None:
        for role in roles:
            self.send("stop", role, {"reason": self.stop_reason, "exit_code": self.exit_code})
        self.awaiting_ack |= set(roles)
        self.phase, self.phase_started = next_phase, time.monotonic()

    def drained(self) -> bool:
        """Collectors acknowledged and no learner is inside a task."""
        collectors_left = self.awaiting_ack & set(self.collectors)
        learners_busy = any(self.topology.kind_of[r] == "learner" for r in self.running.values())
        return not collectors_left and not learners_busy

    def check_shutdown_timeout(self) -> None:
        if self.phase == "running":
            return
        if time.monotonic() - self.phase_started > self.cfg.runtime.shutdown_timeout_s:
            silent = sorted(self.awaiting_ack | set(self.running.values()))
            ranks = ", ".join(f"{r} (rank {self.topology.rank_of[r]})" for r in silent)
            raise RuntimeError(f"shutdown timed out in phase {self.phase}; silent: {ranks}")

    def conclude(self) -> None:
        self.report_progress(force=True)
        line = (
            f"hpcmarl: finished: {self.stop_reason} after {self.position()}, "
            f"{self.stats.elapsed():.1f} s"
        )
        self.sink.record(
            "finished",
            {
                "reason": self.stop_reason,
                "env_steps": self.stats.env_steps,
                "time_s": round(self.stats.elapsed(), 2),
            },
        )
        self.sink.say(line)
        self.finish()

    def position(self) -> str:
        """How far training is: env steps, or (offline, where there are none) updates."""
        if self.stats.offline:
            return f"{self.stats.total_updates()} updates"
        return f"{self.stats.env_steps} env steps"

    def state(self) -> dict:
        tree = {"stats": self.stats.state(), "checkpoints": list(self.checkpoints.taken)}
        if self.lockstep is not None:
            tree["lockstep"] = self.lockstep.state()
        return tree

    def load_state(self, tree: dict) -> None:
        self.stats.load_state(tree["stats"])
        if self.lockstep is not None and "lockstep" in tree:
            self.lockstep.load_state(tree["lockstep"])
        self.checkpoints.taken = list(tree["checkpoints"])
        self.sink.say(
            f"hpcmarl: resumed from checkpoint {self.checkpoints.taken[-1]} at {self.position()}"
        )

    def report_progress(self, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self.last_progress < self.cfg.commander.progress_interval_s:
            return False
        self.last_progress = now
        self.sink.progress(self.stats.progress_row())
        return True
