"""A collector: steps environments with the latest weights and ships fragments to replay.

It works in tasks from the commander: collect `fragments` fragments with the task's epsilon, or
evaluate greedily for `episodes` episodes. Fragments go round robin to the replay shards that
have granted credit; without credit the collector stops stepping, which is how a full pipeline
slows it down. Weights are pulled from the parameter servers with at most one pull in flight
per policy, and only weights newer than those held come back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..algos.dqn import QActor
from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..core import Batch, Role
from .acting import act_all
from .evaluation import Evaluation
from .fragment import FragmentBuilder
from .state_tree import restore_rng, rng_state

MAX_ENV_FAILURES = 3


class Collector(Role):
    """Runs one vector environment (all agents) and feeds the replay shards."""

    kind = "collector"

    def __init__(
        self,
        name: str,
        transport: LocalTransport,
        env: Any,
        actors: dict[str, QActor],
        policy_of: dict[str, str],
        keys: dict[str, str],
        ps_of_policy: dict[str, str],
        shards: list[str],
        fragment_length: int,
        sync_every: int,
        seed: int,
        make_eval_env: Callable[[int, int | None], Any],
        remake_env: Callable[[], Any] | None = None,
        deterministic: bool = False,
        replay_log: Any = None,
    ) -> None:
        super().__init__(name, transport)
        self.env, self.actors, self.policy_of = env, actors, policy_of
        self.keys, self.ps_of_policy, self.shards = keys, ps_of_policy, shards
        self.sync_every, self.make_eval_env = sync_every, make_eval_env
        self.remake_env = remake_env
        self.deterministic = deterministic
        self.replay_log = replay_log
        self.env_failures = 0
        self.unacked = 0
        self.shipped = 0
        self.rng = np.random.default_rng(seed)
        obs_dims = {a: env.obs_dim(a) for a in env.agents}
        self.fragment = FragmentBuilder(
            env.agents, policy_of, obs_dims, fragment_length, env.num_envs
        )
        self.versions = {policy: 0 for policy in actors}
        self.pulling: set[str] = set()
        self.credits = {shard: 0 for shard in shards}
        self.next_shard = 0
        self.outbox: deque[tuple[str, Batch]] = deque()
        self.task: dict | None = None
        self.evaluation: Evaluation | None = None
        self.episodes = EpisodeTracker(env.num_envs, index=int(name.removeprefix("collector")))
        self.obs = env.reset()
        self.fragments_sent = 0
        self.env_steps = 0

    def work(self) -> bool:
        if self.task is None:
            return self.ask_for_task()
        if self.task["kind"] == "eval":
            return self.evaluate()
        if self.outbox:
            return self.ship_fragments()
        if self.fragments_sent >= self.task["fragments"]:
            return self.finish_task()
        if self.deterministic and self.pulling:
            return False  # the task's weights first
        self.step_env(self.task["epsilon"])
        return True

    def handle_task(self, msg: Message) -> None:
        self.task, self.asked, self.fragments_sent = msg.meta, False, 0
        self.episodes.start_task()
        if self.task["kind"] == "eval":
            self.pull_weights()
            env = self.make_eval_env(self.task["episodes"], self.task.get("seed"))
            self.evaluation = Evaluation(env, self.actors, self.policy_of)
        elif self.deterministic:
            self.start_seeded_episodes(self.task["seed"], self.task["versions"])

    def start_seeded_episodes(self, seed: int, versions: dict[str, int]) -> None:
        """Deterministic mode: every task starts fresh episodes from seeds the schedule fixes,
        with the newest weights, so no environment state needs saving between tasks."""
        self.obs = self.env.reset(seed=seed)
        self.episodes.restart()
        self.fragment.reset()
        self.pull_weights(versions)

    def handle_credit(self, msg: Message) -> None:
        self.credits[msg.src] += msg.meta["n"]
        self.unacked -= msg.meta.get("inserted", 0)

    def handle_weights(self, msg: Message) -> None:
        assert msg.arrays is not None
        policy = self.policy_of_key(msg.meta["key"])
        self.actors[policy].set_weights(msg.arrays["weights"])
        self.transport.recycle(msg.arrays)
        self.versions[policy] = msg.meta["version"]
        self.pulling.discard(policy)

    def handle_not_newer(self, msg: Message) -> None:
        self.pulling.discard(self.policy_of_key(msg.meta["key"]))

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
        return {**super().state(), "rng": rng_state(self.rng), "episodes": episodes}

    def load_state(self, tree: dict) -> None:
        restore_rng(self.rng, tree["rng"])
        self.episodes.count = int(tree["episodes"]["count"])
        self.episodes.ids = np.array(tree["episodes"]["ids"], np.int64)
        self.env_steps = int(tree["episodes"]["env_steps"])
        if not self.deterministic:  # its episodes were cut; deterministic tasks start fresh ones
            self.episodes.restart()

    def policy_of_key(self, key: str) -> str:
        return key.split("/", 1)[1]

    def step_env(self, epsilon: float) -> None:
        """One step of every env copy; a full fragment moves to the outbox."""
        actions = act_all(self.actors, self.policy_of, self.obs, epsilon, self.rng)
        try:
            step = self.env.step(actions)
        except Exception as err:  # noqa: BLE001 - an environment may fail; the task is lost
            self.abandon_task(err)
            return
        for agent in self.env.agents:
            policy = self.policy_of[agent]
            self.fragment.add(
                agent,
                {
                    "observations": self.obs[agent],
                    "actions": actions[agent],
                    "rewards": step.rewards[agent],
                    "next_observations": step.next_observations[agent],
                    "terminations": step.terminations[agent],
                    "truncations": step.truncations[agent],
                    "episode_id": self.episodes.ids,
                    "step": self.episodes.lengths,
                    "policy_version": self.versions[policy],
                },
            )
        self.episodes.record(step)
        self.obs = step.observations
        self.env_steps += self.env.num_envs
        if self.fragment.advance():
            self.env_failures = 0
            batches = self.fragment.batches()
            if self.replay_log is not None:
                for policy, batch in batches.items():
                    self.replay_log.append(policy, batch)
            self.outbox.extend(batches.items())
            self.fragment.reset()
            self.fragments_sent += 1
            if self.fragments_sent % self.sync_every == 0:
                self.pull_weights()

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
        meta = {"task_id": self.task["task_id"], "cause": cause, "sent_bulk": self.sent_bulk}
        self.send("task_failed", "commander", meta)
        self.env = self.remake_env()
        self.obs = self.env.reset()
        self.fragment.reset()
        self.episodes.restart()
        self.task = None

    def ship_fragments(self) -> bool:
        """Send waiting batches to shards with credit, in round robin; False when none has."""
        shipped = False
        while self.outbox:
            shard = self.shard_with_credit()
            if shard is None:
                break
            policy, batch = self.outbox.popleft()
            self.credits[shard] -= 1
            self.send("batch", shard, {"policy": policy}, batch)
            self.unacked, self.shipped, shipped = self.unacked + 1, self.shipped + 1, True
        return shipped

    def shard_with_credit(self) -> str | None:
        if self.deterministic:  # a fixed rotation, waiting for that shard's credit
            shard = self.shards[self.shipped % len(self.shards)]
            return shard if self.credits[shard] > 0 else None
        for offset in range(len(self.shards)):
            shard = self.shards[(self.next_shard + offset) % len(self.shards)]
            if self.credits[shard] > 0:
                self.next_shard = (self.next_shard + offset + 1) % len(self.shards)
                return shard
        return None

    def pull_weights(self, min_versions: dict[str, int] | None = None) -> None:
        """Ask for newer weights; `min_versions` (deterministic mode) names the versions the
        parameter server must have before it answers."""
        for policy, key in self.keys.items():
            if policy not in self.pulling:
                self.pulling.add(policy)
                meta = {
                    "key": key,
                    "have_version": self.versions[policy],
                    "min_version": (min_versions or {}).get(policy, 0),
                }
                self.send("weights_pull", self.ps_of_policy[policy], meta)

    def evaluate(self) -> bool:
        """Greedy episodes on a separate env, after the pulls asked for at task start landed."""
        assert self.evaluation is not None and self.task is not None
        if self.pulling:
            return False
        if not self.evaluation.step():
            return True
        stats = self.evaluation.summary()
        stats["versions"] = dict(self.versions)
        self.send(
            "task_done",
            "commander",
            {"task_id": self.task["task_id"], "eval": stats, "sent_bulk": self.sent_bulk},
        )
        self.task, self.evaluation = None, None
        return True

    def finish_task(self) -> bool:
        assert self.task is not None
        if self.deterministic and self.unacked:
            return False  # the next collector's batches must land after all of ours
        stats = self.episodes.task_summary()
        stats.update(
            env_steps=self.task["fragments"] * self.fragment.length * self.env.num_envs,
            versions=dict(self.versions),
        )
        self.send(
            "task_done",
            "commander",
            {"task_id": self.task["task_id"], "collect": stats, "sent_bulk": self.sent_bulk},
        )
        self.task = None
        return True


class EpisodeTracker:
    """Episode ids, lengths and returns of each env copy; finished episodes since task start."""

    def __init__(self, num_envs: int, index: int) -> None:
        self.base = index * 10**9
        self.count = num_envs
        self.ids = self.base + np.arange(num_envs, dtype=np.int64)
        self.lengths = np.zeros(num_envs, np.int32)
        self.returns = np.zeros(num_envs, np.float64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.finished_ids: list[int] = []

    def restart(self) -> None:
        """Fresh episodes in every copy (their environment was recreated)."""
        n = len(self.ids)
        self.ids = self.base + self.count + np.arange(n, dtype=np.int64)
        self.count += n
        self.lengths[:] = 0
        self.returns[:] = 0.0

    def start_task(self) -> None:
        self.finished_returns, self.finished_lengths, self.finished_ids = [], [], []

    def record(self, step: Any) -> None:
        self.returns += sum(step.rewards.values())
        self.lengths += 1
        for i in np.flatnonzero(step.episode_ended):
            self.finished_returns.append(float(self.returns[i]))
            self.finished_lengths.append(int(self.lengths[i]))
            self.finished_ids.append(int(self.ids[i]))
            self.returns[i], self.lengths[i] = 0.0, 0
            self.ids[i] = self.base + self.count
            self.count += 1

    def task_summary(self) -> dict:
        return {
            "episode_returns": self.finished_returns,
            "episode_lengths": self.finished_lengths,
            "episode_ids": self.finished_ids,
        }
