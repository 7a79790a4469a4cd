"""The commander's books of on-policy fragments: what was planned, which fragments each shard
holds, which each learner takes, and which weight versions collection must use.

Per group, with B = `batch_fragments` fragments per update and L = `max_policy_lag`:

- items are numbered in the order collect tasks are granted; batch k is items [kB, (k+1)B);
- a collect task may start while the items planned but not yet trained stay within (L+1)*B,
  so collectors run ahead of the learners by at most L updates;
- its items will be trained, at the latest, in batch j ahead of the next one to be assigned,
  by the version published then, `version + training + j`; the task must act with at least
  that minus L, and is granted only once that version exists;
- a shard acknowledges each batch it inserts with the batch's insert ids, and the collector
  reports those ranges with its task, so the books know exactly which fragments of which task
  each shard holds;
- batch k is assigned once every task planned to fill it has finished and the shards hold B
  fragments: the fragments of the oldest-planned tasks, split over the group's learners as
  ranges of insert ids per shard. No two learners race for a fragment, and a deterministic run
  takes the same fragments every time.

Shards still drop fragments older than the lag (and count them); by this construction they
should not have to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Range = tuple[int, str, int, int]
"""(planned position of its task, shard, first insert id, count) of fragments held."""


@dataclass
class GroupBook:
    """One group's counts."""

    batch: int
    lag: int
    keys: tuple[str, ...]
    held: list[Range] = field(default_factory=list)
    """Fragments inserted and not yet assigned, as ranges."""
    planned: int = 0
    """Items of collect tasks granted so far (the next task's first item number)."""
    assigned: int = 0
    """Items assigned to learners so far."""
    training: int = 0
    """Batches assigned whose update has not been reported."""
    version: int = 1
    """The group's published weight version, as learners last reported it."""
    starts: dict[str, int] = field(default_factory=dict)
    """Running collect task -> the number of its first item."""

    @property
    def queued(self) -> int:
        return sum(n for _, _, _, n in self.held)


class FragmentLedger:
    """The on-policy books of every group."""

    def __init__(
        self,
        groups: dict[str, tuple[int, int, tuple[str, ...]]],
        shards: tuple[str, ...],
        items_per_task: int,
    ) -> None:
        """`groups`: group -> (batch fragments, max policy lag, keys)."""
        self.shards = shards
        self.per_task = items_per_task
        self.books = {g: GroupBook(b, lag, keys) for g, (b, lag, keys) in groups.items()}

    # -- collection -----------------------------------------------------------------------------
    # A collect task fills every group's books unless it names the ones it records (PSRO: the
    # learning player's group only).
    def filled(self, groups: list[str] | None) -> list[GroupBook]:
        return list(self.books.values()) if groups is None else [self.books[g] for g in groups]

    def may_collect(self, groups: list[str] | None = None) -> bool:
        """Another task fits in its groups' windows and its versions are published."""
        for book in self.filled(groups):
            if book.planned - book.assigned + self.per_task > (book.lag + 1) * book.batch:
                return False
            if book.version < self.required_version(book):
                return False
        return True

    def required_version(self, book: GroupBook) -> int:
        ahead = (book.planned + self.per_task - 1 - book.assigned) // book.batch
        return max(1, book.version + book.training + ahead - book.lag)

    def versions(self, groups: list[str] | None = None) -> dict[str, int]:
        """The versions the next collect task must act with, by key."""
        return {k: self.required_version(b) for b in self.filled(groups) for k in b.keys}

    def planned(self, group: str) -> int:
        """Items of the group's collect tasks granted so far."""
        return self.books[group].planned

    def on_granted(self, task_id: str, groups: list[str] | None = None) -> None:
        for book in self.filled(groups):
            book.starts[task_id] = book.planned
            book.planned += self.per_task

    def on_collected(self, task_id: str, items: dict[str, dict[str, list[list[int]]]]) -> None:
        """A collect task ended (done or failed) having had `items` inserted: group -> shard ->
        [first insert id, count] ranges."""
        for group, book in self.books.items():
            start = book.starts.pop(task_id, -1)
            for shard, ranges in items.get(group, {}).items():
                book.held += [(start, shard, int(first), int(n)) for first, n in ranges]

    # -- training -------------------------------------------------------------------------------
    def ready(self, group: str) -> bool:
        """The group's next batch is complete on the shards."""
        book = self.books[group]
        end = book.assigned + book.batch
        pending = any(start < end for start in book.starts.values())
        return not pending and book.queued >= book.batch

    def assign(
        self, group: str, learners: tuple[str, ...]
    ) -> dict[str, dict[str, list[list[int]]]]:
        """learner -> shard -> [first insert id, count] ranges to take: the B fragments of the
        oldest-planned tasks, split evenly over the learners."""
        book = self.books[group]
        order = {s: i for i, s in enumerate(self.shards)}
        pool = sorted(book.held, key=lambda r: (r[0], order.get(r[1], len(order)), r[2]))
        takes: dict[str, dict[str, list[list[int]]]] = {}
        for j, learner in enumerate(learners):
            need = book.batch // len(learners) + (j < book.batch % len(learners))
            take: dict[str, list[list[int]]] = {}
            while need and pool:
                start, shard, first, n = pool[0]
                k = min(n, need)
                take.setdefault(shard, []).append([first, k])
                need -= k
                if k == n:
                    pool.pop(0)
                else:
                    pool[0] = (start, shard, first + k, n - k)
            takes[learner] = take
        book.held = pool
        book.assigned += book.batch
        book.training += 1
        return takes

    def on_trained(self, group: str, version: int) -> None:
        """One learner of the group reported its update (each member reports the same version;
        the first report closes the batch)."""
        book = self.books[group]
        if version > book.version:
            book.version = version
            book.training = max(0, book.training - 1)

    # -- checkpoints ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            g: {
                "shards": list(self.shards),
                "held": [list(r) for r in b.held],
                "planned": b.planned,
                "assigned": b.assigned,
                "training": b.training,
                "version": b.version,
            }
            for g, b in self.books.items()
        }

    def load_state(self, tree: dict[str, Any]) -> None:
        """Restore the books; with another number of shards, hold what a resume re-deals to
        each new shard (item i of the saved queues to shard i mod S, numbered from 0)."""
        for group, saved in tree.items():
            book = self.books[group]
            held: list[Range] = [(int(a), str(s), int(f), int(n)) for a, s, f, n in saved["held"]]
            if tuple(saved["shards"]) != self.shards:
                total = sum(n for _, _, _, n in held)
                counts = dealt_counts(total, self.shards)
                held = [(-1, shard, 0, n) for shard, n in counts.items() if n]
            book.held = held
            book.planned, book.assigned = int(saved["planned"]), int(saved["assigned"])
            book.training, book.version = int(saved["training"]), int(saved["version"])
            book.starts = {}


def dealt_counts(total: int, shards: tuple[str, ...]) -> dict[str, int]:
    """How many of `total` items shard j gets when item i goes to shard i mod len(shards)."""
    n = len(shards)
    return {shard: len(range(j, total, n)) for j, shard in enumerate(shards)}
