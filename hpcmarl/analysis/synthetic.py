"""Replay logs of known episodes, written with the real writer, for tests and benchmarks.

`write_synthetic_log` plays a collector: `num_envs` copies step together, every agent gets a
row per copy per step, fragments are laid out [agent, env copy, step] exactly as
`FragmentBuilder` does, and episode ids are handed out per copy as the collector's
`EpisodeTracker` does. Rewards are multiples of 0.5, so every sum is exact in float32 and
float64 and a test can demand equality. With `early_finish`, agents other than the first may
finish before their episode does and then get padding rows (zero observation and reward,
terminated), as `ParallelCopy` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..storage.replay_log import ReplayLogWriter


@dataclass
class Truth:
    """What the written log holds, computed while writing it."""

    agents: list[str]
    episodes: dict[int, tuple[int, list[float]]] = field(default_factory=dict)
    """Complete episodes: id -> (length, return per agent)."""
    actions: dict[str, np.ndarray] = field(default_factory=dict)
    """Action counts per agent over all rows."""
    rewards: dict[str, float] = field(default_factory=dict)
    rows: int = 0
    """Rows per agent (= env steps of the collector)."""


@dataclass
class _Copy:
    episode: int
    step: int = 0
    length: int = 0
    finish: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)


def write_synthetic_log(
    path: str | Path,
    *,
    agents: tuple[str, ...] = ("agent_0",),
    policy_of: dict[str, str] | None = None,
    num_envs: int = 2,
    fragment_length: int = 8,
    fragments: int = 20,
    obs_dim: int = 3,
    n_actions: int = 3,
    flush_every: int = 2,
    max_length: int = 15,
    early_finish: bool = False,
    seed: int = 0,
    close: bool = True,
) -> tuple[Truth, ReplayLogWriter]:
    """Write `fragments` fragments and return the truth and the writer (closed if `close`)."""
    policy_of = policy_of or dict.fromkeys(agents, "shared")
    writer = ReplayLogWriter(
        path,
        agents=list(agents),
        policy_of=policy_of,
        obs_dims=dict.fromkeys(agents, obs_dim),
        n_actions=dict.fromkeys(agents, n_actions),
        env_id="Synthetic-v0",
        flush_every=flush_every,
        meta={"synthetic": True, "seed": seed},
    )
    sim = _Simulator(list(agents), num_envs, max_length, early_finish, seed)
    truth = Truth(list(agents), actions={a: np.zeros(n_actions, np.int64) for a in agents})
    for version in range(fragments):
        columns = sim.fragment(fragment_length, obs_dim, n_actions, version, truth)
        for policy in sorted(set(policy_of.values())):
            members = [k for k, a in enumerate(agents) if policy_of[a] == policy]
            batch = {n: c[members].reshape(-1, *c.shape[3:]) for n, c in columns.items()}
            writer.append(batch)
        writer.end_fragment()
    truth.rows = fragments * fragment_length * num_envs
    if close:
        writer.close()
    return truth, writer


class _Simulator:
    def __init__(
        self, agents: list[str], num_envs: int, max_length: int, early: bool, seed: int
    ) -> None:
        self.agents, self.max_length, self.early = agents, max_length, early
        self.rng = np.random.default_rng(seed)
        self.count = 0
        self.copies = [self._new_episode() for _ in range(num_envs)]

    def _new_episode(self) -> _Copy:
        length = int(self.rng.integers(1, self.max_length + 1))
        finish = [length - 1] * len(self.agents)
        if self.early:
            finish = [length - 1] + [int(self.rng.integers(0, length)) for _ in self.agents[1:]]
        copy = _Copy(self.count, length=length, finish=finish, returns=[0.0] * len(self.agents))
        self.count += 1
        return copy

    def fragment(
        self, length: int, obs_dim: int, n_actions: int, version: int, truth: Truth
    ) -> dict[str, np.ndarray]:
        """Columns shaped [agent, env copy, step, ...], as the fragment builder holds them."""
        a, e = len(self.agents), len(self.copies)
        cols = _allocate(a, e, length, obs_dim)
        cols["agent_id"][:] = np.arange(a)[:, None, None]
        cols["policy_version"][:] = version
        for t in range(length):
            for i, copy in enumerate(self.copies):
                self._step(cols, i, t, copy, n_actions, truth)
                if copy.step == copy.length:
                    truth.episodes[copy.episode] = (copy.length, copy.returns)
                    self.copies[i] = self._new_episode()
        return cols

    def _step(self, cols: dict, i: int, t: int, copy: _Copy, n_actions: int, truth: Truth) -> None:
        for k, agent in enumerate(self.agents):
            live = copy.step <= copy.finish[k]
            reward = float(self.rng.integers(-4, 5)) * 0.5 if live else 0.0
            action = int(self.rng.integers(n_actions))
            row = (k, i, t)
            width = cols["observations"].shape[-1]
            cols["observations"][row] = self.rng.standard_normal(width) if live else 0.0
            cols["next_observations"][row] = self.rng.standard_normal(width) if live else 0.0
            cols["actions"][row] = action
            cols["rewards"][row] = reward
            # every third episode ends by a time limit for the first agent
            cut = copy.step == copy.length - 1 and k == 0 and copy.episode % 3 == 0
            cols["terminations"][row] = copy.step >= copy.finish[k] and not cut
            cols["truncations"][row] = cut
            cols["episode_id"][row] = copy.episode
            cols["step"][row] = copy.step
            copy.returns[k] += reward
            truth.actions[agent][action] += 1
            truth.rewards[agent] = truth.rewards.get(agent, 0.0) + reward
        copy.step += 1


def _allocate(a: int, e: int, length: int, obs: int) -> dict[str, np.ndarray]:
    lead = (a, e, length)
    return {
        "observations": np.zeros((*lead, obs), "<f4"),
        "actions": np.zeros(lead, "<i8"),
        "rewards": np.zeros(lead, "<f4"),
        "next_observations": np.zeros((*lead, obs), "<f4"),
        "terminations": np.zeros(lead, bool),
        "truncations": np.zeros(lead, bool),
        "agent_id": np.zeros(lead, "<i2"),
        "episode_id": np.zeros(lead, "<i8"),
        "step": np.zeros(lead, "<i4"),
        "policy_version": np.zeros(lead, "<i8"),
    }
