"""A collector: steps environments with the latest weights and ships items to replay.

It works in tasks from the commander: collect `fragments` fragments, or evaluate greedily for
`episodes` episodes. A task binds every agent to a policy key; the collector acts through an
actor per key, built from the PolicySpec that came with the key's first weights reply, and
explores as that actor's algorithm says (the task carries the job's env-step count for
schedules that decay with it). Each training group's writer cuts the steps into its items;
every full fragment becomes one batch per group, dealt to the replay shards with credit in a
round robin of its own per group, so every group's data spreads over every shard. Without
credit the collector stops stepping, which is how a full pipeline slows it down. Weights are
pulled with at most one pull in flight per key, and only weights newer than those held come
back; a task that names versions waits for them before its first step.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..algos.actors import build_actor
from ..algos.contract import Actor, PolicySpec
from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..core import Batch, Role
from ..errors import EnvOutputError
from ..items.writers import ItemWriter, StepRecord
from ..population import server_for
from .acting import Memory, act_all, agents_by_key
from .evaluation import Evaluation
from .state_tree import restore_rng, rng_state

MAX_ENV_FAILURES = 3
STEPS_PER_POLL = 8
"""Env steps one `work()` takes at most: a poll's own bookkeeping (messages, heartbeat, the
task's checks) cost about 2.5 % of a CartPole step each time (docs/benchmarks.md), and a
waiting message still stops the run of steps, as does a fragment's end."""


class Collector(Role):
    """Runs one vector environment (all agents) and feeds the replay shards."""

    kind = "collector"

    def __init__(
        self,
        name: str,
        transport: LocalTransport,
        env: Any,
        writers: dict[str, Any],
        shards: list[str],
        servers: list[str],
        sync_every: int,
        seed: int,
        make_eval_env: Callable[[int, int | None], Any],
        remake_env: Callable[[], Any] | None = None,
        deterministic: bool = False,
        replay_log: Any = None,
        log_writers: dict[str, ItemWriter] | None = None,
        score: Callable[[list[list[Actor]], list[list[float]]], dict[str, float]] | None = None,
        eval_max_steps: int = 10_000,
        stop_grace_s: float = 10.0,
    ) -> None:
        super().__init__(name, transport)
        self.env, self.writers, self.shards, self.servers = env, writers, shards, servers
        self.sync_every, self.make_eval_env = sync_every, make_eval_env
        self.remake_env = remake_env
        self.deterministic = deterministic
        self.replay_log, self.log_writers = replay_log, log_writers or {}
        self.score = score
        """Exploitability of a meta-strategy over populations of actors (PSRO jobs)."""
        self.eval_max_steps = eval_max_steps
        """Steps after which an evaluation episode is cut (`Evaluation`)."""
        self.stop_grace_s = stop_grace_s
        """Seconds an evaluation in hand may go on after a budget's stop (`handle_stop`)."""
        self.stop_held: tuple[Message, float] | None = None
        """A stop that waits for the evaluation in hand, and when it arrived."""
        self.all_writers = [*writers.values(), *self.log_writers.values()]
        self.env_failures = 0
        self.unacked = 0
        self.rng = np.random.default_rng(seed)
        self.actors: dict[str, Actor] = {}
        self.versions: dict[str, int] = {}
        self.pulling: set[str] = set()
        self.bindings: dict[str, str] = {}
        self.by_key: list[tuple[str, list[str]]] = []
        """The task's agents grouped by the key they act with (`agents_by_key`)."""
        self.ready = False
        """The task's actors and versions are in hand (then they stay: versions only grow)."""
        self.agent_versions: dict[str, int] = {}
        """agent -> the version of the weights it acts with, what its items record."""
        self.credits = {shard: 0 for shard in shards}
        self.recorded: set[str] = set(writers)
        """The groups whose items this task ships (PSRO: only the learning player's)."""
        self.greedy_keys: frozenset[str] = frozenset()
        """Keys this task plays greedily (PSRO: the frozen opponents)."""
        self.on_policy = any(w.spec.replay.on_policy for w in writers.values())
        self.dealt = {group: 0 for group in writers}
        """Batches of each group sent so far: where its round robin over the shards stands."""
        self.outbox: deque[tuple[str, Batch]] = deque()
        self.task: dict | None = None
        self.task_items: dict[str, dict[str, list[list[int]]]] = {}
        """On-policy: group -> shard -> [first insert id, count] of this task's batches."""
        self.evaluation: Evaluation | None = None
        self.episodes = EpisodeTracker(env.num_envs, index=int(name.removeprefix("collector")))
        self.obs = env.reset()
        self.masks = env.action_masks
        """The legal actions at `obs` per agent, for envs that have masks (else None)."""
        self.memory = Memory()
        """Recurrent actors' states per agent and env copy, zeroed where episodes start."""
        self.fragments_sent = 0
        self.env_steps = 0

    def work(self) -> bool:
        if self.task is None:
            return self.ask_for_task()
        if self.task["kind"] in ("eval", "matchup"):
            return self.evaluate()
        if self.task["kind"] == "exploitability":
            return self.score_exploitability()
        if self.outbox:
            return self.ship_fragments()
        if self.fragments_sent >= self.task["fragments"]:
            return self.finish_task()
        if not self.weights_ready():
            return False
        for _ in range(STEPS_PER_POLL):
            if not self.step_env() or self.inbox:
                break
        return True

    def handle_task(self, msg: Message) -> None:
        self.task, self.asked, self.fragments_sent = msg.meta, False, 0
        self.bindings, self.ready = dict(msg.meta["bindings"]), False
        self.by_key = agents_by_key(self.bindings)
        self.task_items = {group: {} for group in self.writers}
        self.episodes.start_task()
        self.recorded = set(msg.meta.get("record", self.writers))
        self.greedy_keys = frozenset(msg.meta.get("greedy", ()))
        if self.task["kind"] in ("eval", "matchup"):
            self.pull_weights(self.task.get("versions"))
            env = self.make_eval_env(self.task["episodes"], self.task.get("seed"))
            greedy = frozenset(self.task["greedy"]) if "greedy" in self.task else True
            self.evaluation = Evaluation(
                env, self.actors, self.bindings, greedy, self.eval_max_steps
            )
        elif self.task["kind"] == "exploitability":
            self.pull_weights(self.task["versions"])
        elif self.deterministic or self.task.get("fresh"):
            self.start_seeded_episodes(self.task.get("seed"), self.task.get("versions") or {})
        else:
            self.pull_weights(self.task.get("versions"))

    def start_seeded_episodes(self, seed: int | None, versions: dict[str, int]) -> None:
        """Deterministic mode: every task starts fresh episodes from seeds the schedule fixes,
        with the versions it names, so no environment state needs saving between tasks. A
        `fresh` task (PSRO: opponents drawn per task) starts fresh episodes the same way, so
        that no episode mixes the policies of two tasks."""
        self.obs = self.env.reset(seed=seed)
        self.masks = self.env.action_masks
        self.memory.reset()
        self.episodes.restart()
        self.restart_writers()
        self.pull_weights(versions)

    def handle_credit(self, msg: Message) -> None:
        """A credit back; for an on-policy queue, also the insert ids its batch got, which the
        task's report hands on to the commander."""
        self.credits[msg.src] += msg.meta["n"]
        self.unacked -= msg.meta.get("inserted", 0)
        if "first" in msg.meta:
            ranges = self.task_items.setdefault(msg.meta["group"], {}).setdefault(msg.src, [])
            ranges.append([msg.meta["first"], msg.meta["items"]])

    def handle_weights(self, msg: Message) -> None:
        assert msg.arrays is not None
        key = msg.meta["key"]
        if key not in self.actors:
            self.actors[key] = build_actor(PolicySpec.from_json(msg.meta["spec"]))
        self.actors[key].set_weights(msg.arrays["weights"])
        self.transport.recycle(msg.arrays)
        self.versions[key] = msg.meta["version"]
        self.agent_versions = {a: self.versions.get(k, 0) for a, k in self.bindings.items()}
        self.pulling.discard(key)

    def handle_not_newer(self, msg: Message) -> None:
        self.pulling.discard(msg.meta["key"])

    def counters(self) -> dict:
        return {"role": self.name, "env_steps": self.env_steps}

    def finish(self) -> None:
        if self.replay_log is not None:
            self.replay_log.close()
        super().finish()

    def state(self) -> dict:
        """Counters, RNG and episode bookkeeping; environments cannot be saved, so a resumed
        collector starts fresh episodes (with new ids) and pulls weights first."""
        e = self.episodes
        episodes = {"ids": e.ids, "count": e.count, "env_steps": self.env_steps}
        tree = {**super().state(), "rng": rng_state(self.rng), "episodes": episodes}
        return tree | {"dealt": dict(self.dealt)}

    def load_state(self, tree: dict) -> None:
        restore_rng(self.rng, tree["rng"])
        self.episodes.count = int(tree["episodes"]["count"])
        self.episodes.ids = np.array(tree["episodes"]["ids"], np.int64)
        self.env_steps = int(tree["episodes"]["env_steps"])
        self.dealt.update({group: int(n) for group, n in tree["dealt"].items()})
        if not self.deterministic:  # its episodes were cut; deterministic tasks start fresh ones
            self.episodes.restart()

    # -- stepping -----------------------------------------------------------------------------
    def weights_ready(self) -> bool:
        """Every bound key has an actor, and the versions the task names have arrived; a key
        still short of its version when no pull is in flight (an earlier pull came back with an
        older one) is pulled again."""
        if self.ready:
            return True
        wanted = (self.task or {}).get("versions") or {}
        short = {k: v for k, v in wanted.items() if self.versions.get(k, 0) < v}
        if any(k not in self.pulling for k in short):
            self.pull_weights(short)
        keys = set(self.bindings.values())
        self.ready = not short and all(key in self.actors for key in keys)
        if self.ready:
            self.agent_versions = {a: self.versions[k] for a, k in self.bindings.items()}
        return self.ready

    def step_env(self) -> bool:
        """One step of every env copy; a full fragment moves to the outbox. False when the
        steps of this task must stop here: the fragment ended, or the env failed."""
        assert self.task is not None
        state = self.env.states
        recurrent = dict(self.memory.states)  # what each agent acts from (store swaps arrays)
        actions, extras = act_all(
            self.actors,
            self.bindings,
            self.obs,
            self.rng,
            self.task["env_steps"],
            greedy=self.greedy_keys,
            masks=self.masks,
            memory=self.memory,
            groups=self.by_key,
        )
        try:
            step = self.env.step(actions)
        except EnvOutputError:
            raise  # what the env returns is wrong, and will be again: no retry
        except Exception as err:  # noqa: BLE001 - an environment may fail; the task is lost
            self.abandon_task(err)
            return False
        # every field, in its order: by keyword, this call cost twice as much (about 6 % of
        # the collector's own work per CartPole step)
        record = StepRecord(
            self.obs,
            actions,
            step,
            self.episodes.ids,
            self.episodes.lengths,
            self.agent_versions,
            state,
            extras,
            self.masks,
            recurrent,
        )
        for writer in self.all_writers:
            writer.add(record)
        self.episodes.record(step)
        self.memory.reset(step.episode_ended)
        self.obs, self.masks = step.observations, step.action_masks
        self.env_steps += self.env.num_envs
        if self.advance_writers():
            self.end_fragment()
            return False
        return True

    def advance_writers(self) -> bool:
        full = True
        for writer in self.all_writers:  # every writer advances, whatever the others say
            full = writer.advance() and full
        return full

    def end_fragment(self) -> None:
        self.env_failures = 0
        batches = {g: w.batch() for g, w in self.writers.items() if g in self.recorded}
        if self.replay_log is not None:
            logged = [w.batch() for w in self.log_writers.values()] or list(batches.values())
            for batch in logged:
                self.replay_log.append(batch)
            self.replay_log.end_fragment()
        # an episode writer's fragment may close no item: nothing to send then
        self.outbox.extend((g, b) for g, b in batches.items() if len(b["actions"]))
        self.reset_writers()
        self.fragments_sent += 1
        if self.fragments_sent % self.sync_every == 0:
            self.pull_weights()

    def reset_writers(self) -> None:
        """Fresh buffers for the next fragment; transitions still pending carry over."""
        for writer in self.all_writers:
            writer.reset()

    def restart_writers(self) -> None:
        """Fresh buffers, and nothing pending: the episodes in progress were cut."""
        for writer in self.all_writers:
            writer.reset()
            writer.discard_pending()

    def abandon_task(self, err: Exception) -> None:
        """notify_fail: report the lost task, start a fresh environment, ask for new work.

        A collector whose environment keeps failing (MAX_ENV_FAILURES in a row without one
        complete fragment) raises, which ends the job with the cause.
        """
        self.env_failures += 1
        if self.remake_env is None or self.env_failures >= MAX_ENV_FAILURES:
            raise RuntimeError(f"environment failed {self.env_failures} time(s): {err!r}") from err
        assert self.task is not None
        cause = f"{type(err).__name__}: {err}"
        meta = {
            "task_id": self.task["task_id"],
            "cause": cause,
            "sent_bulk": self.sent_bulk,
            "items": self.task_items,
        }
        self.send("task_failed", "commander", meta)
        self.env = self.remake_env()
        self.obs = self.env.reset()
        self.masks = self.env.action_masks
        self.memory.reset()
        self.restart_writers()
        self.episodes.restart()
        self.task = None

    def ship_fragments(self) -> bool:
        """Send waiting batches to shards with credit, each group in its own round robin;
        False when none has credit."""
        shipped = False
        while self.outbox:
            group, batch = self.outbox[0]
            shard = self.shard_with_credit(group)
            if shard is None:
                break
            self.outbox.popleft()
            self.credits[shard] -= 1
            meta = {"group": group, "items": len(batch["actions"])}
            generation = (self.task or {}).get("generation", 0)
            if generation:
                meta["generation"] = generation
            self.send("batch", shard, meta, batch)
            self.unacked, shipped = self.unacked + 1, True
        return shipped

    def shard_with_credit(self, group: str) -> str | None:
        """The group's next shard in its rotation; deterministic mode waits for that shard's
        credit, otherwise the next shard in the rotation that has credit."""
        n = len(self.shards)
        start = self.dealt[group] % n
        offsets = [0] if self.deterministic else range(n)
        for offset in offsets:
            shard = self.shards[(start + offset) % n]
            if self.credits[shard] > 0:
                self.dealt[group] = start + offset + 1
                return shard
        return None

    def pull_weights(self, min_versions: dict[str, int] | None = None) -> None:
        """Ask for newer weights of every bound key and of the keys of `min_versions`, which
        names the versions the parameter server must have before it answers."""
        keys = set(self.bindings.values()) | set(min_versions or {})
        for key in sorted(keys):
            if key not in self.pulling:
                self.pulling.add(key)
                meta = {
                    "key": key,
                    "have_version": self.versions.get(key, 0),
                    "min_version": (min_versions or {}).get(key, 0),
                }
                self.send("weights_pull", server_for(key, self.servers), meta)

    def evaluate(self) -> bool:
        """Greedy episodes on a separate env, after the pulls asked for at task start landed."""
        assert self.evaluation is not None and self.task is not None
        if self.stop_held is not None and time.monotonic() - self.stop_held[1] > self.stop_grace_s:
            self.evaluation = None
            super().handle_stop(self.stop_held[0])  # too long: the run's end goes first
            return True
        if self.pulling or not self.weights_ready():
            return False
        if not self.evaluation.step():
            return True
        if self.task["kind"] == "matchup":
            self.report_done(matchup=self.evaluation.moments(self.task["players"]))
        else:
            stats = self.evaluation.summary()
            self.report_done(eval=stats | {"versions": dict(self.versions)})
        self.evaluation = None
        if self.stop_held is not None:
            super().handle_stop(self.stop_held[0])
        return True

    def handle_stop(self, msg: Message) -> None:
        """A run that ends by its budget lets the evaluation in hand finish (for up to
        `stop_grace_s`): it is often the one the user reads, the return the run ended with.
        An interrupted or failed run (a non-zero exit code) stops at once."""
        kind = self.task["kind"] if self.task is not None else None
        if self.evaluation is not None and kind == "eval" and not msg.meta.get("exit_code", 0):
            self.stop_held = (msg, time.monotonic())
            return
        super().handle_stop(msg)

    def score_exploitability(self) -> bool:
        """PSRO: the meta-strategy's exploitability, once every population member's final
        weights are here (computed here, not on the commander, which must keep answering)."""
        assert self.task is not None
        if self.pulling or not self.weights_ready():
            return False
        if self.score is None:
            raise RuntimeError("an exploitability task reached a collector of a non-PSRO job")
        populations = [[self.actors[key] for key in keys] for keys in self.task["populations"]]
        self.report_done(exploitability=self.score(populations, self.task["meta"]))
        return True

    def finish_task(self) -> bool:
        """Report the task; on-policy or deterministic, only once its batches are inserted:
        the commander assigns on-policy fragments by what the shards hold, and a deterministic
        round needs every batch in before the next collector's."""
        assert self.task is not None
        if self.unacked and (self.on_policy or self.deterministic):
            return False
        stats = self.episodes.task_summary()
        length = next(iter(self.writers.values())).length
        stats.update(
            env_steps=self.task["fragments"] * length * self.env.num_envs,
            versions=dict(self.versions),
            items=self.task_items,
        )
        self.report_done(collect=stats)
        return True

    def report_done(self, **result: Any) -> None:
        """task_done for the task in hand: its id and kind, what it produced, and the bulk
        messages sent so far (a checkpoint cut waits for exactly those)."""
        assert self.task is not None
        meta = {"task_id": self.task["task_id"], "kind": self.task["kind"], **result}
        self.send("task_done", "commander", meta | {"sent_bulk": self.sent_bulk})
        self.task = None


EPISODES_PER_GENERATION = 10**8
"""Episode ids of one process of a collector: a replacement's start this far above the last
one's (`EpisodeTracker.rebase`), below the next collector's (index x 10**9)."""


RUN_STEPS = 64
"""Steps whose lengths `EpisodeTracker` works out at once (`_plan_run`)."""


class EpisodeTracker:
    """Episode ids, lengths and returns of each env copy; finished episodes since task start.

    It runs every env step, where each numpy call costs about as much as a few dozen Python
    operations: returns are Python floats (the same float64 sums numpy would make), a step's
    lengths a row of a table of the next `RUN_STEPS` steps' lengths made while no episode ends
    (a row, a fresh view, costs about a tenth of the addition that made a fresh array each
    step), and ended episodes are looked for in the flags' bytes (`tobytes` costs a fifth of
    `count_nonzero` and a tenth of `any()`: about 600, 3,000 and 8,000 instructions)."""

    def __init__(self, num_envs: int, index: int) -> None:
        self.base = index * 10**9
        self.count = num_envs
        self.ids = self.base + np.arange(num_envs, dtype=np.int64)
        self.lengths = np.zeros(num_envs, np.int32)
        self._ramp = np.arange(1, RUN_STEPS + 1, dtype=np.int32)[:, None]
        self._plan_run()
        self.returns = [0.0] * num_envs
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.finished_ids: list[int] = []

    def rebase(self, generation: int) -> None:
        """Number episodes apart from every earlier process of this collector: a replacement
        of a lost rank (`generation` 1, 2, ...) must not reuse the ids of the episodes its
        predecessor left in replay (compact tables link a run's frames by episode id)."""
        first = generation * EPISODES_PER_GENERATION  # `count` stays what a checkpoint keeps
        self.ids = self.base + first + np.arange(len(self.ids), dtype=np.int64)
        self.count = first + len(self.ids)

    def restart(self) -> None:
        """Fresh episodes in every copy (their environment was recreated)."""
        n = len(self.ids)
        self.ids = self.base + self.count + np.arange(n, dtype=np.int64)
        self.count += n
        self.lengths = np.zeros(n, np.int32)
        self._plan_run()
        self.returns = [0.0] * n

    def _plan_run(self) -> None:
        """The lengths of the next `RUN_STEPS` steps if no episode ends, a row per step (an
        episode's end plans anew from the lengths it leaves)."""
        self._run, self._next = self.lengths + self._ramp, 0

    def start_task(self) -> None:
        self.finished_returns, self.finished_lengths, self.finished_ids = [], [], []

    def record(self, step: Any) -> None:
        """Count the step; close the episodes it ended (most steps end none: one test)."""
        # the agents' float32 rewards added in agent order, as sum() would (its 0 + the first
        # changes nothing that reaches a return)
        total = functools.reduce(np.add, step.rewards.values())
        returns = self.returns
        for i, reward in enumerate(total.tolist()):
            returns[i] += reward
        if self._next == RUN_STEPS:
            self._plan_run()
        self.lengths, self._next = self._run[self._next], self._next + 1
        if 1 in step.episode_ended.tobytes():  # a True is the byte 1
            self._close(step.episode_ended.nonzero()[0].tolist())

    def _close(self, ended: list[int]) -> None:
        self.lengths = self.lengths.copy()  # the run's row may be in a step record
        for i in ended:
            self.finished_returns.append(self.returns[i])
            self.finished_lengths.append(int(self.lengths[i]))
            self.finished_ids.append(int(self.ids[i]))
            self.returns[i], self.lengths[i] = 0.0, 0
            self.ids[i] = self.base + self.count
            self.count += 1
        self._plan_run()

    def task_summary(self) -> dict:
        return {
            "episode_returns": self.finished_returns,
            "episode_lengths": self.finished_lengths,
            "episode_ids": self.finished_ids,
        }
