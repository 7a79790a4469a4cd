"""One pass over replay files, folded into a summary that is plain JSON.

Rows are read `chunk_rows` at a time per table and folded into running summaries (see
`stats`), so memory depends on the chunk size, the number of agents, actions and policy
versions, and the episodes still open, never on the file size. The summary is the single
product: the terminal report, `report.md`, the plots and `--json` are all drawn from it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.hdf5 import StorageError
from .digest import build_summary
from .episodes import EpisodeFold, EpisodeRecords
from .reader import STATS_COLUMNS, Source, Table, chunks, open_sources
from .stats import EpisodeSample, FloatHistogram, IntCounts, Moments, ProgressBins

CHUNK_ROWS = 1 << 16
PROGRESS_BINS = 40
RATE_BINS = 60
SAMPLE = 20_000
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)

EpisodeSink = Callable[[Source, EpisodeRecords], None]


class AgentStats:
    """What one agent's rows hold: items, rewards, actions, episode ends."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.items = 0
        self.rewards, self.reward_hist = Moments(), FloatHistogram()
        self.actions = IntCounts()
        self.action_dims: list[Moments] = []
        """Per dimension of continuous (float vector) actions: their moments."""
        self.terminations = self.truncations = 0
        self.episodes = self.complete = 0
        self.returns = Moments()
        self.progress = ProgressBins(PROGRESS_BINS, 1)

    def add(self, cols: dict[str, np.ndarray]) -> None:
        self.items += len(cols["rewards"])
        self.rewards.add(cols["rewards"])
        self.reward_hist.add(cols["rewards"])
        actions = cols["actions"]
        if actions.ndim == 1 and actions.dtype.kind in "iub":
            self.actions.add(actions)
        elif actions.ndim == 2 and actions.dtype.kind == "f":
            self.action_dims += [Moments() for _ in range(actions.shape[1] - len(self.action_dims))]
            for moments, column in zip(self.action_dims, actions.T, strict=False):
                moments.add(column)
        self.terminations += int(np.count_nonzero(cols["terminations"]))
        self.truncations += int(np.count_nonzero(cols["truncations"]))


class PolicyStats:
    """Per policy: versions of the data (for staleness) and, in checkpoints, priorities."""

    def __init__(self) -> None:
        self.items = 0
        self.versions = IntCounts()
        self.priorities, self.priority_hist = Moments(), FloatHistogram()

    def add(self, cols: dict[str, np.ndarray]) -> None:
        self.items += len(cols["policy_version"])
        self.versions.add(cols["policy_version"])
        if "priorities" in cols:
            self.priorities.add(cols["priorities"])
            self.priority_hist.add(cols["priorities"])


class Analysis:
    """Folds sources in one after another; `summary()` at any point describes all so far."""

    def __init__(
        self, chunk_rows: int = CHUNK_ROWS, on_episodes: EpisodeSink | None = None
    ) -> None:
        self.chunk_rows = chunk_rows
        self.on_episodes = on_episodes
        self.files: list[dict[str, Any]] = []
        self.agents: dict[str, AgentStats] = {}
        self.policies: dict[str, PolicyStats] = {}
        self.returns, self.lengths = Moments(), Moments()
        self.progress = ProgressBins(PROGRESS_BINS, 2)
        self.sample = EpisodeSample(SAMPLE, 2)
        self.incomplete = 0
        self.env_steps = 0
        self.rate: dict[str, Any] | None = None

    def add_source(self, source: Source) -> None:
        for table in source.tables:
            table.require(STATS_COLUMNS)
        fold = EpisodeFold(source.team, len(source.agents))
        names = (*STATS_COLUMNS, "priorities")
        held = np.zeros(len(source.agents), np.int64)
        for table, start, cols in chunks(source, names, self.chunk_rows):
            self._check_agents(source, table, cols["agent_id"])
            cols["done"] = cols["terminations"] | cols["truncations"]
            held += self._fold_rows(source, table, cols)
            self._add_episodes(source, fold.add(cols, start, table.rows))
        left = fold.finish()
        self.incomplete += len(left)
        self._count_episodes(source, left, complete=False)
        self.env_steps += int(held.max(initial=0))  # every agent has a row in every env step
        self.files.append(_file_entry(source))

    def _check_agents(self, source: Source, table: Table, agent: np.ndarray) -> None:
        if len(agent) and (agent.min() < 0 or agent.max() >= len(source.agents)):
            raise StorageError(
                f"{table.file}: {table.group} has agent_id {int(agent.max())}, but the file "
                f"knows {len(source.agents)} agents",
                "the file is damaged or was edited; use the file the run wrote",
            )

    def _fold_rows(self, source: Source, table: Table, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Fold rows into per-agent and per-policy stats; return the rows of each agent."""
        agent = cols["agent_id"]
        held = np.zeros(len(source.agents), np.int64)
        if len(agent) and agent[0] == agent[-1] and bool((agent == agent[0]).all()):
            parts = [(int(agent[0]), cols)]
        else:
            parts = [(int(k), _select(cols, agent == k)) for k in np.unique(agent)]
        for k, part in parts:
            name = source.agents[k]
            self.agents.setdefault(name, AgentStats(table.policy)).add(part)
            held[k] = len(part["rewards"])
        self.policies.setdefault(table.policy, PolicyStats()).add(cols)
        return held

    def _add_episodes(self, source: Source, done: EpisodeRecords) -> None:
        if not len(done):
            return
        values = np.stack([done.team_returns, done.lengths.astype(np.float64)], axis=1)
        self.returns.add(values[:, 0])
        self.lengths.add(values[:, 1])
        self.progress.add(done.end, values)
        self.sample.add(done.ids, values)
        self._count_episodes(source, done, complete=True)
        for k in np.flatnonzero(done.rows.sum(axis=0)):
            stats = self.agents[source.agents[k]]
            held = done.rows[:, k] > 0
            stats.returns.add(done.returns[held, k])
            stats.progress.add(done.end[held], done.returns[held, k : k + 1])
        if self.on_episodes is not None:
            self.on_episodes(source, done)

    def _count_episodes(self, source: Source, rec: EpisodeRecords, complete: bool) -> None:
        for k, n in enumerate((rec.rows > 0).sum(axis=0)):
            if n:
                stats = self.agents.setdefault(
                    source.agents[k], AgentStats(source.policy_of.get(source.agents[k], "?"))
                )
                stats.episodes += int(n)
                stats.complete += int(n) if complete else 0

    def add_rate(self, sources: list[Source]) -> None:
        """Transitions written per second of wall time, from the logs' wall-clock index."""
        self.rate = insertion_rate(sources, self.chunk_rows)

    def summary(self) -> dict[str, Any]:
        return build_summary(self)


def _select(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {name: col[mask] for name, col in cols.items()}


def _file_entry(source: Source) -> dict[str, Any]:
    return {
        "label": source.label,
        "kind": source.kind,
        "files": [str(f) for f in source.files],
        "env_id": source.env_id,
        "agents": source.agents,
        "policy_of": source.policy_of,
        "rows": {f"{t.file.name}:{t.group}": t.rows for t in source.tables},
    }


def insertion_rate(sources: list[Source], chunk_rows: int) -> dict[str, Any] | None:
    indexes = [s.wallclock for s in sources if s.wallclock is not None and len(s.wallclock[0])]
    if not indexes:
        return None
    t0 = min(float(t[0]) for t, _ in indexes)
    t1 = max(float(t[-1]) for t, _ in indexes)
    width = max(t1 - t0, 1e-9) / RATE_BINS
    added = np.zeros(RATE_BINS)
    for time_ds, rows_ds in indexes:
        before = 0
        for start in range(0, len(time_ds), chunk_rows):
            t = time_ds[start : start + chunk_rows]
            total = rows_ds[start : start + chunk_rows].sum(axis=1)
            bins = np.minimum(((t - t0) / width).astype(np.int64), RATE_BINS - 1)
            added += np.bincount(bins, np.diff(total, prepend=before), RATE_BINS)
            before = total[-1]
    return {"t0": t0, "bin_s": width, "transitions_per_s": (added / width).tolist()}


def analyze(
    paths: list[str | Path],
    chunk_rows: int = CHUNK_ROWS,
    on_episodes: EpisodeSink | None = None,
) -> dict[str, Any]:
    """The summary of every replay file named by `paths` (files or run directories)."""
    analysis = Analysis(chunk_rows, on_episodes)
    with ExitStack() as stack:
        sources = open_sources(paths, stack)
        for source in sources:
            analysis.add_source(source)
        analysis.add_rate(sources)
    return analysis.summary()
