"""Episodes rebuilt from rows that arrive in any chunking, holding only the unfinished ones.

Rows of one episode are scattered: env copies interleave, agents come in blocks, a fragment or
a read chunk may end mid-episode, and a checkpoint's shards split it. So every chunk is folded
into one record per episode id (rows and reward sums per agent, last step seen, how many agents
are done at it), merged with the records still open, and an episode is emitted once it is
complete: every one of the `team` agents done (terminated or truncated) at its last step, and
`team * (last step + 1)` rows held, i.e. no step missing. What never completes (cut at the start
of a ring buffer, still running at the end of a file) is counted as incomplete.

Everything is vectorised over runs (consecutive rows of one episode and agent), so the cost per
row is a few numpy passes and the Python work is per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class EpisodeRecords:
    """One row per episode (or part of one): the columns below, aligned."""

    ids: np.ndarray
    """Episode ids (int64)."""
    rows: np.ndarray
    """Rows held per agent, [n, agents] (int64)."""
    returns: np.ndarray
    """Reward sums per agent, [n, agents] (float64)."""
    last: np.ndarray
    """Largest `step` seen (int64); the episode's length is `last + 1`."""
    done: np.ndarray
    """Agents done (terminated or truncated) at step `last` (int64)."""
    end: np.ndarray
    """Where the episode's last row lies in its table, as a fraction (float64)."""

    @classmethod
    def empty(cls, agents: int) -> EpisodeRecords:
        i, f = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return cls(i, np.zeros((0, agents), np.int64), np.zeros((0, agents)), i, i, f)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, index: np.ndarray) -> EpisodeRecords:
        return EpisodeRecords(*(getattr(self, f.name)[index] for f in fields(self)))

    @property
    def lengths(self) -> np.ndarray:
        return self.last + 1

    @property
    def team_returns(self) -> np.ndarray:
        """The sum over agents, which is what the commander logs as an episode's return."""
        return self.returns.sum(axis=1)


def concat(a: EpisodeRecords, b: EpisodeRecords) -> EpisodeRecords:
    return EpisodeRecords(
        *(np.concatenate([getattr(a, f.name), getattr(b, f.name)]) for f in fields(a))
    )


def runs(
    cols: dict[str, np.ndarray], agents: int, first_row: int, table_rows: int
) -> EpisodeRecords:
    """One record per run of consecutive rows with the same episode id and agent."""
    episode, agent, step = cols["episode_id"], cols["agent_id"], cols["step"]
    n = len(episode)
    change = episode[1:] != episode[:-1]
    if agent[0] != agent[-1] or not (agent == agent[0]).all():
        change |= agent[1:] != agent[:-1]
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    ends = np.append(starts[1:], n)
    who = (np.arange(len(starts)), agent[starts].astype(np.int64))
    rows = np.zeros((len(starts), agents), np.int64)
    rows[who] = ends - starts
    returns = np.zeros((len(starts), agents))
    returns[who] = np.add.reduceat(cols["rewards"], starts, dtype=np.float64)
    last = np.maximum.reduceat(step, starts).astype(np.int64)
    end = (first_row + ends) / table_rows
    return EpisodeRecords(
        episode[starts], rows, returns, last, _done_at_last(cols, starts, ends, last), end
    )


def _done_at_last(
    cols: dict[str, np.ndarray], starts: np.ndarray, ends: np.ndarray, last: np.ndarray
) -> np.ndarray:
    """1 where the run's agent is done at the run's last step. Collectors write steps in
    order, so that is the run's last row; other orders take the slow path."""
    step, done = cols["step"], cols["done"]
    if np.array_equal(step[ends - 1], last):
        return done[ends - 1].astype(np.int64)
    at_last = done & (step == np.repeat(last, ends - starts))
    return np.logical_or.reduceat(at_last, starts).astype(np.int64)


def merge(rec: EpisodeRecords) -> EpisodeRecords:
    """One record per episode id: rows and returns add up, the last step is the largest, and
    only agents done at that step count as done."""
    if not len(rec):
        return rec
    rec = rec.take(np.argsort(rec.ids, kind="stable"))
    starts = np.flatnonzero(np.concatenate([[True], rec.ids[1:] != rec.ids[:-1]]))
    counts = np.diff(np.append(starts, len(rec)))
    last = np.maximum.reduceat(rec.last, starts)
    at_last = rec.last == np.repeat(last, counts)
    return EpisodeRecords(
        ids=rec.ids[starts],
        rows=np.add.reduceat(rec.rows, starts, axis=0),
        returns=np.add.reduceat(rec.returns, starts, axis=0),
        last=last,
        done=np.add.reduceat(rec.done * at_last, starts),
        end=np.maximum.reduceat(rec.end, starts),
    )


class EpisodeFold:
    """Feeds chunks in, gets complete episodes out; `finish` hands back the incomplete ones."""

    def __init__(self, team: int, agents: int) -> None:
        self.team = team
        self.agents = agents
        self.open = EpisodeRecords.empty(agents)

    def add(self, cols: dict[str, np.ndarray], first_row: int, table_rows: int) -> EpisodeRecords:
        """Fold in one chunk of rows (columns episode_id, agent_id, step, rewards, and `done`:
        terminated or truncated) that start at `first_row` of a table of `table_rows`."""
        if not len(cols["episode_id"]):
            return EpisodeRecords.empty(self.agents)
        merged = merge(concat(self.open, runs(cols, self.agents, first_row, table_rows)))
        complete = (merged.done >= self.team) & (
            merged.rows.sum(axis=1) == self.team * (merged.last + 1)
        )
        self.open = merged.take(~complete)
        return merged.take(complete)

    def finish(self) -> EpisodeRecords:
        left, self.open = self.open, EpisodeRecords.empty(self.agents)
        return left
