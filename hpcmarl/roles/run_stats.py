"""What the commander knows about the run: counters folded from every role's reports."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from ..config.schema import CommanderConfig


class RunStats:
    """Env steps, episodes, updates, replay fill, versions and evaluations, as reported."""

    def __init__(self, budget: CommanderConfig, offline: bool = False) -> None:
        self.start = time.monotonic()
        self.budget = budget
        self.offline = offline
        """Offline, no env steps are taken and collectors hold no weights but the evaluator's."""
        self.env_steps = 0
        self.episodes = 0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.updates: dict[str, int] = {}
        self.versions: dict[str, int] = {}
        self.collector_versions: dict[str, int] = {}
        self.replay: dict[str, dict[str, Any]] = {}
        self.eval_returns: list[float] = []
        self.eval_agent_returns: dict[str, float] = {}
        """Per agent, the mean return of the last evaluation."""
        self.collectors_lost = 0
        """Collectors whose rank died while the run went on (runtime.fault_tolerance)."""
        self.collectors_respawned = 0
        """Lost collectors a new rank hosts again (runtime.respawn_collectors)."""
        self._last = (self.start, 0, 0)

    def counters(self) -> dict[str, Any]:
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "updates": self.total_updates(),
            "time_s": round(self.elapsed(), 2),
        }

    def state(self) -> dict[str, Any]:
        return {
            **self.counters(),
            "recent_returns": np.array(self.recent_returns, np.float64),
            "eval_returns": np.array(self.eval_returns, np.float64),
            "updates_by_learner": [[k, v] for k, v in self.updates.items()],
            "eval_agent_returns": dict(self.eval_agent_returns),
        }

    def load_state(self, tree: dict[str, Any]) -> None:
        """Counters continue where they stopped; so does the training clock."""
        self.env_steps, self.episodes = int(tree["env_steps"]), int(tree["episodes"])
        self.recent_returns.extend(float(x) for x in tree["recent_returns"])
        self.eval_returns = [float(x) for x in tree["eval_returns"]]
        self.updates = {k: int(v) for k, v in tree["updates_by_learner"]}
        self.eval_agent_returns = {k: float(v) for k, v in tree["eval_agent_returns"].items()}
        self.start = time.monotonic() - float(tree["time_s"])
        self._last = (time.monotonic(), self.env_steps, self.total_updates())

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def on_collect(self, stats: dict[str, Any]) -> None:
        self.env_steps += stats["env_steps"]
        self.episodes += len(stats["episode_returns"])
        self.recent_returns.extend(stats["episode_returns"])
        for key, version in stats["versions"].items():
            self.collector_versions[key] = version

    def on_learn(self, stats: dict[str, Any]) -> None:
        for group, row in stats["groups"].items():
            self.updates[f"{stats['role']}/{group}"] = int(row["updates"])

    def on_eval(self, result: dict[str, Any]) -> None:
        self.eval_returns.append(float(result["return_mean"]))
        self.eval_agent_returns = dict(result.get("agent_returns", {}))

    def on_role_stats(self, stats: dict[str, Any]) -> None:
        """Parameter servers report versions by key, shards their tables' sizes by group."""
        for key, version in stats.get("versions", {}).items():
            self.versions[key] = max(self.versions.get(key, 0), version)
        if "sizes" in stats:
            self.replay[stats["role"]] = stats

    def total_updates(self) -> int:
        return sum(self.updates.values())

    def replay_size(self, group: str) -> int:
        """Items of `group` on the fullest shard (what a learner can be served from)."""
        return max((s["sizes"].get(group, 0) for s in self.replay.values()), default=0)

    def replay_fill(self) -> float:
        held = sum(sum(s["sizes"].values()) for s in self.replay.values())
        room = sum(s["capacity"] * len(s["sizes"]) for s in self.replay.values())
        return held / room if room else 0.0

    def replay_evicted(self) -> int:
        return sum(sum(s["evicted"].values()) for s in self.replay.values())

    def replay_dropped(self) -> int:
        """On-policy fragments dropped for being older than the lag allows."""
        return sum(sum(s.get("dropped", {}).values()) for s in self.replay.values())

    def version_lag(self) -> int | None:
        """How many versions the newest weights are ahead of those the collectors last used."""
        if self.offline:
            return None
        lags = [max(0, v - self.collector_versions.get(k, 0)) for k, v in self.versions.items()]
        return max(lags) if lags else None

    def progress_row(self, schedule_done: float | None = None) -> dict[str, Any]:
        """The progress line's figures; `schedule_done` is the fraction of the schedule's own
        budget done (PSRO's iterations), None when it has none."""
        now, updates = time.monotonic(), self.total_updates()
        then, steps_then, updates_then = self._last
        dt = max(now - then, 1e-9)
        self._last = (now, self.env_steps, updates)
        steps_per_s = (self.env_steps - steps_then) / dt
        updates_per_s = (updates - updates_then) / dt
        return {
            "time_s": round(now - self.start, 2),
            "env_steps": self.env_steps,
            "env_steps_per_s": round(steps_per_s, 1),
            "updates": updates,
            "updates_per_s": round(updates_per_s, 1),
            "episodes": self.episodes,
            "train_return": _mean(self.recent_returns),
            "eval_return": self.eval_returns[-1] if self.eval_returns else None,
            "eval_agent_returns": dict(self.eval_agent_returns),
            "replay_fill": round(self.replay_fill(), 4),
            "replay_evicted": self.replay_evicted(),
            "replay_dropped": self.replay_dropped(),
            "version_lag": self.version_lag(),
            "collectors_lost": self.collectors_lost,
            "collectors_respawned": self.collectors_respawned,
            "eta_s": self.eta(steps_per_s, updates_per_s, schedule_done),
        }

    def eta(
        self, steps_per_s: float, updates_per_s: float, schedule_done: float | None = None
    ) -> float | None:
        """Seconds to the first budget that will run out at the current rates. A schedule with
        a budget of its own (PSRO's iterations) is timed by it: elapsed x left / done. Its env
        steps and updates come in phases (none while it scores), so their rates would time
        the job's step budget, which such a job sets out of reach (kuhn_psro: 10^8)."""
        if schedule_done is None:
            left = self.rate_estimates(steps_per_s, updates_per_s)
        elif schedule_done > 0:
            left = [self.elapsed() * (1.0 - schedule_done) / schedule_done]
        else:
            left = []
        if self.budget.max_wall_time_s:
            left.append(self.budget.max_wall_time_s - self.elapsed())
        return round(max(0.0, min(left)), 1) if left else None

    def rate_estimates(self, steps_per_s: float, updates_per_s: float) -> list[float]:
        """Seconds left to the env-step and update budgets at the current rates."""
        b, left = self.budget, []
        if steps_per_s > 0 and not self.offline:
            left.append((b.max_env_steps - self.env_steps) / steps_per_s)
        if b.max_updates and updates_per_s > 0:
            left.append((b.max_updates - self.total_updates()) / updates_per_s)
        return left


def _mean(values: deque[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None
