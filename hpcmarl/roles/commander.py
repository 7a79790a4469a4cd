"""The commander (rank 0): hands out work, evaluates, decides when to stop, shuts down in order.

Collectors and learners ask for tasks; the commander asks its schedule (`schedules/`) which to
grant, and grants them while task space is left (DI-engine's SoloCommander). It owns the
population registry: it announces every policy key to its parameter server at start, and the
schedule's tasks bind agents to keys. Evaluations' mean (team) return against `stop_value`, the
step budget, the wall-time limit or an interrupt ends the run. Shutdown goes in phases so that
nobody waits for a message that cannot come: collectors stop and shards serve freely (draining)
until running learner tasks end; then learners, parameter servers and shards stop and
acknowledge.
"""

from __future__ import annotations

import time
from collections import deque

from ..algos.catalog import resolve_algorithm
from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..config.schema import JobConfig
from ..core import Role
from ..errors import ReportedFailure
from ..launch import signals
from ..launch.scaling import take_requests
from ..launch.topology import Topology
from ..metrics import MetricsSink, run_dir_line
from ..population import Population, server_for
from ..schedules import PSRO, Context, FreeRunning, Grant, Lockstep, OnPolicy, Schedule, Situation
from .coordinator import CheckpointCoordinator
from .run_stats import RunStats
from .task_space import TaskSpace

EXIT_CHECKPOINTED = 75
"""Exit code of a run stopped by a signal after writing its checkpoint: requeue and resume."""


class Commander(Role):
    """Schedules collector and learner tasks and owns the stop condition."""

    kind = "commander"
    hears_lost_peers = False

    def __init__(
        self,
        transport: LocalTransport,
        cfg: JobConfig,
        topology: Topology,
        sink: MetricsSink,
        population: Population,
        bindings: dict[str, str],
    ) -> None:
        super().__init__("commander", transport)
        self.cfg, self.topology, self.sink = cfg, topology, sink
        self.population = population
        self.collectors = topology.names("collector")
        self.learners = topology.names("learner")
        space = cfg.commander.collector_task_space or len(self.collectors)
        self.collector_space = TaskSpace(space)
        self.learner_space = TaskSpace(len(self.learners))
        self.waiting_collectors: deque[str] = deque()
        self.retired: list[str] = []
        """Collectors `python -m hpcmarl scale` retired, in order: they take no task."""
        self.parked: set[str] = set()
        """Retired collectors that asked for a task: they get one when put back to work."""
        self.last_control = time.monotonic()
        self.waiting_learners: set[str] = set()
        self.learner_info: dict[str, dict] = {}
        """Each learner's info from its last task (`update_learner_info`)."""
        self.running: dict[str, str] = {}
        self.stats = RunStats(cfg.commander, offline=bool(cfg.offline.dataset))
        self.last_progress = time.monotonic()
        self.phase = "running"
        self.stop_reason = ""
        self.exit_code = 0
        self.awaiting_ack: set[str] = set()
        self.phase_started = time.monotonic()
        self.checkpoints = CheckpointCoordinator(self)
        self.schedule = make_schedule(self.schedule_context(bindings))
        self.last_seen = {name: time.monotonic() for name in topology.rank_of if name != self.name}
        self.last_moved = (time.monotonic(), 0, 0)
        """(when, env steps, updates) at the last change of either: `check_stall`."""
        self.last_loop: tuple[float, float] | None = None
        """(monotonic, CPU) time when this loop last ran: `notice_suspension`."""
        self.lost_at: dict[str, float] = {}
        """Collectors lost, each with when the loss was heard: a replacement's row times it."""
        self.respawns: dict[str, dict] = {}
        """Replaced collectors yet to take their first task, each with its `rank_respawned` row."""

    def schedule_context(self, bindings: dict[str, str]) -> Context:
        groups = {
            group: tuple(sorted(members, key=self.topology.rank_of.__getitem__))
            for group, members in self.topology.learners_of_group.items()
        }
        keys = {
            group: tuple(k for k, m in self.population.members.items() if m.group == group)
            for group in groups
        }
        return Context(
            self.cfg,
            tuple(self.collectors),
            tuple(self.topology.names("replay_shard")),
            groups,
            bindings,
            keys,
            {key: member.spec for key, member in self.population.members.items()},
        )

    def start(self) -> None:
        """Announce every policy key to the parameter server that holds it."""
        for key in self.population.keys():
            self.announce(key)

    def announce(self, key: str) -> None:
        """MALib's create_table: the key's parameter server makes its table now."""
        server = server_for(key, self.topology.names("param_server"))
        self.send("create_table", server, {"key": key, "spec": self.population.spec(key).to_json()})

    def add_policies(self) -> None:
        """Policies the schedule adds (a PSRO iteration's best responses) join the population
        and get their tables before any task names them."""
        for spec, group in self.schedule.additions():
            if spec.key not in self.population.members:  # a resumed run re-adds nothing
                self.population.freeze_group(group)
                self.population.add(spec, trainable=True, group=group)
            self.announce(spec.key)

    # -- the loop -------------------------------------------------------------------------
    def work(self) -> bool:
        self.notice_suspension()
        progressed = False
        if self.phase == "running" and self.checkpoints.blocking:
            self.check_signals()
            progressed = self.checkpoints.poll()
        elif self.phase == "running":
            progressed = self.checkpoints.poll()  # a checkpoint written while work goes on
            self.check_between_tasks()
            if self.phase == "running" and not self.checkpoints.blocking:
                progressed = self.grant_tasks() or progressed
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
        self.check_control()
        self.check_shutdown_timeout()
        self.check_heartbeats()
        self.check_stall()
        return self.report_progress() or progressed

    # -- messages -------------------------------------------------------------------------
    def handle_task_request(self, msg: Message) -> None:
        self.checkpoints.note_sent(msg.src, msg.meta.get("sent_bulk", {}))
        if msg.src in self.retired:
            self.parked.add(msg.src)
        elif self.topology.kind_of[msg.src] == "collector":
            self.waiting_collectors.append(msg.src)
        else:
            self.waiting_learners.add(msg.src)

    def handle_task_done(self, msg: Message) -> None:
        role = self.running.pop(msg.meta["task_id"], msg.src)
        self.checkpoints.note_sent(role, msg.meta.get("sent_bulk", {}))
        if self.topology.kind_of[role] == "collector":
            self.collector_space.release()
            kind = msg.meta["kind"]
            self.schedule.on_task_done(role, kind, msg.meta)
            if kind == "eval":
                self.on_eval(msg.meta["eval"])
            elif kind == "collect":
                self.stats.on_collect(msg.meta["collect"])
                self.record_episodes(role, msg.meta["collect"])
        else:
            self.learner_space.release()
            self.stats.on_learn(msg.meta["stats"])
            self.record_learning(msg.meta["stats"])
            self.update_learner_info(role, msg.meta["task_id"], msg.meta.get("info", {}))
            self.schedule.on_task_done(role, "learn", msg.meta)
        self.record_schedule()

    def update_learner_info(self, learner: str, task_id: str, info: dict) -> None:
        """DI-engine's update_learner_info: the learner's info from its last task (updates,
        losses, learning rate, updates per second) is kept as its newest, which a failure of
        its next task reports beside its own, and written as an `update_learner_info` row."""
        self.learner_info[learner] = info
        row = {"role": learner, "task_id": task_id, "env_steps": self.stats.env_steps, **info}
        self.sink.record("update_learner_info", row)

    def record_learning(self, stats: dict) -> None:
        """One `learn` row per group per learner task: the mean of its update statistics."""
        for group, row in stats["groups"].items():
            self.sink.record(
                "learn",
                {"role": stats["role"], "group": group, "env_steps": self.stats.env_steps, **row},
            )

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
        if self.topology.kind_of[role] != "collector":
            self.notify_fail_learner_task(role, msg.meta)  # ends the job
        self.collector_space.release()
        self.schedule.on_task_failed(role, msg.meta)
        self.sink.record("task_failed", {"role": role, **msg.meta})

    def notify_fail_learner_task(self, learner: str, report: dict) -> None:
        """A learner's task failed (its update raised): its space is released, a `task_failed`
        row names the cause, the group and the updates applied, and the job ends with one line
        naming the learner. Unlike a collector's task, a learner's is not retried: the group's
        weights and optimizer live only on its learners, the update left them half done, and a
        data-parallel partner waits inside the average (docs/failure-modes.md)."""
        self.learner_space.release()
        keys = ("task_id", "group", "updates", "cause")
        row = {"role": learner, **{k: report[k] for k in keys}, "env_steps": self.stats.env_steps}
        self.sink.record("task_failed", {**row, "last_info": self.learner_info.get(learner, {})})
        self.report_progress(force=True)
        where = f"task {report['task_id']} of group {report['group']}"
        raise ReportedFailure(
            self.topology.rank_of[learner],
            learner,
            f"{report['cause']} ({where} failed after {report['updates']} updates)",
            report.get("traceback", ""),
        )

    def note_message(self, msg: Message) -> None:
        if msg.src in self.last_seen:
            self.last_seen[msg.src] = time.monotonic()

    def on_peers_lost(self, names: set[str], where: str) -> None:
        """Collectors whose rank died (`launch/losses.py` lets only those go): each one's
        task fails (`notify_fail_collector_task`), the collector task space shrinks by one
        when it held more than the collectors left (`decrease_collector_task_space`), and
        nothing waits for it any more: not the schedule, a checkpoint cut, the heartbeat
        clock nor the shutdown."""
        super().on_peers_lost(names, where)
        lost = [name for name in self.collectors if name in names]
        for collector in lost:
            self.notify_fail_collector_task(collector, f"rank lost: {where}")
            self.collectors.remove(collector)
            if self.collector_space.capacity > len(self.collectors):
                self.decrease_collector_task_space()
            if collector in self.waiting_collectors:
                self.waiting_collectors.remove(collector)
            if collector in self.retired:
                self.retired.remove(collector)
            self.parked.discard(collector)
            self.last_seen.pop(collector, None)
            self.awaiting_ack.discard(collector)
            self.checkpoints.forget(collector)
            self.stats.collectors_lost += 1
            self.lost_at[collector] = time.monotonic()
        if lost:
            self.sink.record(
                "rank_lost",
                {
                    "roles": lost,
                    "where": where,
                    "env_steps": self.stats.env_steps,
                    "collectors_left": len(self.collectors),
                },
            )
            self.sink.say(
                f"hpcmarl: lost {where}; going on with {len(self.collectors)} collectors "
                f"(runtime.fault_tolerance=collectors) at {self.position()}"
            )
        if not self.collectors and self.phase == "running" and not self.stats.offline:
            raise RuntimeError(f"lost every collector ({where}): nothing left to collect")

    def on_peers_back(self, names: set[str]) -> None:
        """Lost collectors that a new rank hosts again (`launch/respawn_run.py`): they take
        tasks again (`increase_collector_task_space` when the space had shrunk for them), the
        heartbeat clock and the shutdown count them, and a `rank_respawned` row follows their
        first task, timed from the loss."""
        super().on_peers_back(names)
        back = [name for name in self.topology.names("collector") if name in names]
        for collector in back:
            if collector in self.collectors:
                continue
            self.collectors.append(collector)
            if self.collector_space.capacity < len(self.collectors) and (
                self.cfg.commander.collector_task_space in (None, 0)
            ):
                self.increase_collector_task_space()
            self.last_seen[collector] = now = time.monotonic()
            lost_at = self.lost_at.pop(collector, now)
            self.respawns[collector] = {
                "role": collector,
                "lost_at": lost_at,
                "respawn_s": round(now - lost_at, 3),
            }
            self.stats.collectors_respawned += 1
            if self.phase != "running":  # the job stops: so does the replacement, at once
                self.send("stop", collector, {"reason": self.stop_reason, "exit_code": 0})
                if self.phase == "draining":
                    self.awaiting_ack.add(collector)
        if back:
            self.sink.say(
                f"hpcmarl: respawned {', '.join(back)}; {len(self.collectors)} collectors "
                f"at {self.position()}"
            )

    def takes_replacements(self) -> bool:
        """A replaced collector gets tasks only while the run goes on."""
        return self.phase == "running"

    def note_first_task(self, collector: str) -> None:
        """A replaced collector's first task: its `rank_respawned` row, with the seconds from
        its loss to this task (the replacement's cost to the run)."""
        row = self.respawns.pop(collector)
        seconds = time.monotonic() - row.pop("lost_at")
        self.sink.record(
            "rank_respawned",
            {**row, "seconds_to_first_task": round(seconds, 3), "env_steps": self.stats.env_steps},
        )

    def notify_fail_collector_task(self, collector: str, cause: str) -> None:
        """The task a lost collector held is released like a failed one; what it inserted
        before it died stays in replay and is trained on once."""
        for task_id, role in list(self.running.items()):
            if role == collector:
                del self.running[task_id]
                self.collector_space.release()
                self.schedule.on_task_failed(collector, {"task_id": task_id, "cause": cause})
                self.sink.record(
                    "task_failed", {"role": collector, "task_id": task_id, "cause": cause}
                )

    def handle_heartbeat(self, msg: Message) -> None:
        """Nothing to do: every message, this one included, proves its sender alive."""

    def notice_suspension(self) -> None:
        """A job suspended whole (`scontrol suspend`, Ctrl-Z: every rank stopped, then
        continued) stopped this loop with its peers, so no one could be heard during the gap:
        the clocks that time the others restart instead of ending a healthy job, and peers
        that resume a moment after this rank get a full heartbeat timeout. A gap of half
        the timeout counts; a rank 0 held up that long by its own work (CPU time went on)
        restarts them too, as the roles it hosts could not send either. Only a suspension
        leaves the run's elapsed time, which `commander.max_wall_time_s` limits."""
        now, cpu = time.monotonic(), time.process_time()
        last, self.last_loop = self.last_loop, (now, cpu)
        if last is None or now - last[0] < self.cfg.runtime.heartbeat_timeout_s / 2:
            return
        gap = now - last[0]
        self.last_seen = dict.fromkeys(self.last_seen, now)
        self.last_moved = (now, *self.last_moved[1:])
        self.phase_started += gap
        if self.checkpoints.cut is not None:
            self.checkpoints.cut.started += gap
        suspended = cpu - last[1] < gap / 2
        if suspended:  # not training: commander.max_wall_time_s does not count it
            self.stats.start += gap
        what = "the job was suspended" if suspended else "rank 0 was busy"
        paused = ", wall time paused" if suspended else ""
        self.sink.say(f"hpcmarl: {what} for {gap:.0f} s; heartbeat clocks restarted{paused}")

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

    def check_stall(self) -> None:
        """Fail, saying what waits on what, when neither env steps nor updates moved for
        `runtime.stall_timeout_s` while every role is alive: a wait cycle (a limiter refusing
        one group's samples while collectors wait on another's) would hang until the time
        limit. A checkpoint in progress has its own timeout."""
        limit = self.cfg.runtime.stall_timeout_s
        now, position = time.monotonic(), (self.stats.env_steps, self.stats.total_updates())
        if position != self.last_moved[1:] or self.phase != "running" or self.checkpoints.cut:
            self.last_moved = (now, *position)
            return
        if limit is not None and now - self.last_moved[0] > limit:
            raise RuntimeError(
                f"stalled: no env step and no update for {limit:g} s at {self.position()}; "
                f"{self.waits()}; raise runtime.stall_timeout_s if this is a long pause"
            )

    def waits(self) -> str:
        """The tasks running, the roles waiting for one, and what the shards' limiters refuse."""
        running = ", ".join(f"{role} ({task})" for task, role in sorted(self.running.items()))
        idle = sorted({*self.waiting_collectors, *self.waiting_learners})
        refusing = [
            f"{shard} refuses {group}'s {what}"
            for shard, counters in sorted(self.stats.replay.items())
            for group, what in sorted(counters.get("refusing", {}).items())
        ]
        return (
            f"tasks running: {running or 'none'}; waiting for a task: {', '.join(idle) or 'none'}"
            f"; limiters: {'; '.join(refusing) or 'none refusing'}"
        )

    def handle_snapshotted(self, msg: Message) -> None:
        self.checkpoints.on_snapshotted(msg.src, msg.meta)

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
        """Stop conditions and periodic checkpoints, when the schedule is at a boundary (in
        deterministic mode: between rounds)."""
        if not self.schedule.at_boundary(self.situation()):
            self.check_signals()
            return
        self.check_stop_conditions()
        if self.phase == "running" and self.checkpoints.due(self.stats.total_updates()):
            self.checkpoints.begin()

    def situation(self) -> Situation:
        """What the schedule may know of the run right now."""
        groups = self.topology.learners_of_group
        return Situation(
            now=time.monotonic(),
            env_steps=self.stats.env_steps,
            updates=self.stats.total_updates(),
            waiting_collectors=tuple(self.waiting_collectors),
            waiting_learners=frozenset(self.waiting_learners),
            running=len(self.running),
            collector_slots=self.collector_space.capacity - self.collector_space.used,
            replay_sizes={g: self.stats.replay_size(g) for g in groups},
        )

    def grant_tasks(self) -> bool:
        """Apply what the schedule decides: the roles stop waiting, their tasks start."""
        grants = self.schedule.grants(self.situation())
        self.add_policies()
        for grant in grants:
            self.apply(grant)
        self.record_schedule()
        return bool(grants)

    def apply(self, grant: Grant) -> None:
        waiting = grant.role in self.waiting_collectors or grant.role in self.waiting_learners
        if not waiting:
            raise RuntimeError(f"the schedule granted a task to {grant.role}, which has one")
        if self.topology.kind_of[grant.role] == "collector":
            if not self.collector_space.acquire():
                raise RuntimeError("the schedule granted collector tasks beyond the task space")
            self.waiting_collectors.remove(grant.role)
            if grant.role in self.respawns:
                self.note_first_task(grant.role)
        else:
            self.learner_space.acquire()
            self.waiting_learners.discard(grant.role)
        self.running[str(grant.task["task_id"])] = grant.role
        self.send("task", grant.role, grant.task)

    def record_schedule(self) -> None:
        for kind, row in self.schedule.records():
            self.sink.record(kind, {**row, "episodes": self.stats.episodes})
        for line in self.schedule.lines():
            self.sink.say(line)

    def check_control(self) -> None:
        """About once a second: requests of `python -m hpcmarl scale` (launch/scaling.py)."""
        now = time.monotonic()
        if now - self.last_control < 1.0 or self.phase != "running":
            return
        self.last_control = now
        for request in take_requests(self.cfg.runtime.run_dir):
            if "error" in request:
                self.sink.say(f"hpcmarl: scale: ignored {request['error']}")
            else:
                self.scale_collectors(int(request["collectors"]))

    def scale_collectors(self, delta: int) -> None:
        """Retire collectors (each ends its task in hand first) or put retired ones back to
        work; the collector task space follows the collectors at work."""
        asked = f"collectors {delta:+d}"
        if self.cfg.commander.deterministic:
            self.sink.say(
                f"hpcmarl: scale: {asked} refused: deterministic mode's schedule "
                "needs every collector"
            )
            return
        working = [c for c in self.collectors if c not in self.retired]
        if delta < 0:
            moved = working[len(working) - min(-delta, len(working) - 1) :]
            self.retired += moved
            for name in moved:
                if name in self.waiting_collectors:
                    self.waiting_collectors.remove(name)
                    self.parked.add(name)
            excess = self.collector_space.capacity - (len(working) - len(moved))
            if excess > 0:  # never more task space than collectors at work
                self.decrease_collector_task_space(excess)
            what = f"{', '.join(moved) or 'none'} retired (one collector always works)"
        else:
            moved = self.retired[len(self.retired) - min(delta, len(self.retired)) :]
            self.retired = self.retired[: len(self.retired) - len(moved)]
            for name in moved:
                if name in self.parked:
                    self.parked.discard(name)
                    self.waiting_collectors.append(name)
            if self.cfg.commander.collector_task_space in (None, 0):
                self.increase_collector_task_space(len(moved))
            what = f"{', '.join(moved) or 'none'} back at work"
            if len(moved) < delta:
                what += f"; {delta - len(moved)} more would need new ranks (not yet)"
        at_work = len(self.collectors) - len(self.retired)
        self.sink.say(f"hpcmarl: scale: {asked}: {what}; {at_work} collectors at work")
        self.sink.record(
            "scale",
            {"asked": delta, "moved": moved, "at_work": at_work, "env_steps": self.stats.env_steps},
        )

    def increase_collector_task_space(self, n: int = 1) -> None:
        """Resume paused collectors."""
        self.collector_space.increase(n)

    def decrease_collector_task_space(self, n: int = 1) -> None:
        """Pause collectors: running tasks finish, their next requests wait."""
        self.collector_space.decrease(n)

    # -- evaluation and stopping ----------------------------------------------------------
    def on_eval(self, result: dict) -> None:
        value = result["return_mean"]
        self.stats.on_eval(result)
        row = {
            "time_s": round(self.stats.elapsed(), 2),
            "env_steps": self.stats.env_steps,
            "updates": self.stats.total_updates(),
            **result,
        }
        self.sink.record("eval", row)
        agents = result.get("agent_returns", {})
        per_agent = ""
        if len(agents) > 1:
            per_agent = " (" + ", ".join(f"{a} {r:.1f}" for a, r in agents.items()) + ")"
        cut = result.get("truncated", 0)
        cut_note = f" ({cut} cut at commander.eval_max_episode_steps)" if cut else ""
        self.sink.say(
            f"hpcmarl: eval return {value:.1f} +- {result['return_std']:.1f}{per_agent} over "
            f"{result['episodes']} episodes{cut_note} at {self.position()}"
        )
        target, in_a_row = self.cfg.commander.stop_value, self.cfg.commander.stop_evals
        if target is None or self.phase != "running":
            return
        recent = self.stats.eval_returns[-in_a_row:]  # checkpointed with the run's stats
        if len(recent) == in_a_row and min(recent) >= target:
            times = f" in {in_a_row} evaluations in a row" if in_a_row > 1 else ""
            self.request_stop(f"stop_value reached (eval return {value:.1f} >= {target:g}{times})")

    def check_stop_conditions(self) -> None:
        c = self.cfg.commander
        if self.check_signals():
            return
        done = self.schedule.stop_reason()
        if done is not None:
            self.request_stop(done)
        elif self.stats.env_steps >= c.max_env_steps:
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
            self.checkpoints.begin(then=(reason, 0), fresh=True)
        elif self.checkpoints.cut is not None:  # stop once the checkpoint being written is in
            self.checkpoints.begin(then=(reason, 0))
        else:
            self.begin_stop(reason)

    def begin_stop(self, reason: str, exit_code: int = 0) -> None:
        self.stop_reason, self.exit_code = reason, exit_code
        self.relax_shards(True)
        self.wrap_up_learners()
        self.stop_roles(self.collectors, next_phase="draining")

    def wrap_up_learners(self) -> None:
        """A checkpoint or a stop waits for the learner tasks in hand: each ends after its
        update in flight, whatever `updates_per_task` is. Deterministic mode keeps its tasks
        whole: their length is part of the schedule a resume replays."""
        if self.cfg.commander.deterministic:
            return
        for task_id, role in self.running.items():
            if self.topology.kind_of[role] == "learner":
                self.send("wrap_up", role, {"task_id": task_id})

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
        self.sink.say(run_dir_line(self.cfg.runtime.run_dir))
        self.finish()

    def close(self) -> None:
        self.sink.close(self.exit_code)

    def position(self) -> str:
        """How far training is: env steps, or (offline, where there are none) updates."""
        if self.stats.offline:
            return f"{self.stats.total_updates()} updates"
        return f"{self.stats.env_steps} env steps"

    def state(self) -> dict:
        return {
            "stats": self.stats.state(),
            "checkpoints": list(self.checkpoints.taken),
            "schedule": self.schedule.state(),
            "population": self.population.state(),
        }

    def load_state(self, tree: dict) -> None:
        self.stats.load_state(tree["stats"])
        self.schedule.load_state(tree["schedule"])
        self.population.load_state(tree["population"])
        self.checkpoints.taken = list(tree["checkpoints"])
        self.sink.resumed(self.stats.counters())
        self.sink.say(
            f"hpcmarl: resumed from checkpoint {self.checkpoints.taken[-1]} at {self.position()}"
        )

    def report_progress(self, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self.last_progress < self.cfg.commander.progress_interval_s:
            return False
        self.last_progress = now
        self.sink.progress(self.stats.progress_row(self.schedule.progress()))
        return True


def make_schedule(ctx: Context) -> Schedule:
    """Deterministic mode's rounds, or the free-running schedule of the algorithm's kind."""
    on_policy = resolve_algorithm(ctx.cfg.learner.algo).on_policy
    if ctx.cfg.psro.enabled:
        return PSRO(ctx)
    if ctx.cfg.commander.deterministic:
        return Lockstep(ctx, on_policy)
    return OnPolicy(ctx) if on_policy else FreeRunning(ctx)
