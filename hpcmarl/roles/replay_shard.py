"""A replay shard: one table per training group, fed by collectors, drained by learners.

What a group's table is follows from its algorithm's replay spec: a `ReplayTable` (uniform or
prioritized sampling with replacement, under a samples-per-insert limiter) for off-policy
items, or an `ItemQueue` (each item served once, too-old ones dropped and counted) for
on-policy fragments.

Producer flow is credit based: every collector starts with `insert_credits` batches it may have
in flight here, and gets a credit back only once its batch is inserted. The samples-per-insert
limiter holds batches back when collectors run ahead of learners, so back-pressure reaches the
collectors through withheld credits and nothing queues without bound. Credits are shared by
every group a collector feeds, so one group's limiter holding its batches back would stop the
collection of all; while another group here is starved (a learner waits for its samples and its
limiter wants more inserts), a group's inserts are not held back: agents that leave episodes at
different times fill their groups at different rates, and without this the fast group's full
limiter and the slow group's empty one wait on each other for ever. Consumer flow: a learner
asks for one batch at a time; a replay request waits here until the limiter allows a sample; a
queue request is answered at once with what the queue holds (the commander grants learners
only what it knows was inserted). In deterministic mode nothing is inserted while learners
learn, so a replay request on a table too small to sample is answered at once, empty, and the
learner asks its next shard; so is one in drain mode, when collection has stopped.

Checkpoints: the file is written from the tables' own memory, not from a copy of many GiB, so
while it is written (`writing`) batches wait in `pending_inserts` instead of overwriting rows
the writer still reads. Samples and priority updates go on. A collector's batch for a replay
table gets its credit at once meanwhile, so collectors keep collecting; in deterministic mode,
and for on-policy queues, whose credits carry insert ids, the credit waits for the insert.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..comm.credits import CreditReturn
from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..config.schema import ReplayConfig
from ..core import Role
from ..items.spec import ItemSpec, ReplaySpec
from ..replay.columns import obs_in
from ..replay.compact import CompactTable, StorageForm
from ..replay.compact_items import CompactItemTable
from ..replay.queue import ItemQueue
from ..replay.rate_limiters import SampleToInsertRatio
from ..replay.table import ReplayTable
from .state_tree import flatten, nest


class ReplayShard(Role):
    """Holds the groups' tables and serves inserts and samples."""

    kind = "replay_shard"

    def __init__(
        self,
        name: str,
        transport: LocalTransport,
        cfg: ReplayConfig,
        replay_of: dict[str, ReplaySpec],
        collectors: list[str],
        seed: int,
        deterministic: bool = False,
        dataset: Callable[[], Iterable[tuple[str, dict[str, np.ndarray]]]] | None = None,
        items: dict[str, str] | None = None,
        forms: dict[str, StorageForm] | None = None,
    ) -> None:
        super().__init__(name, transport)
        self.forms = forms or {}
        """Group -> how its table stores its items (MALib's producer options), if compact."""
        self.items = items or {}
        """Group -> its item spec as JSON, saved with the tables so that offline analysis can
        read joint items (episodes, sequences) as the per-agent rows they hold."""
        self.cfg = cfg
        self.tables: dict[str, ReplayTable | CompactTable | ItemQueue] = {}
        self.limiters: dict[str, SampleToInsertRatio] = {}
        # Deterministic mode's schedule fixes the ratio itself; a limiter would react to timing.
        # Offline, nothing is inserted after the start: any number of samples is fine.
        free = deterministic or dataset is not None
        self.deterministic = deterministic
        # learning_starts 0 means "from the first item on": a table cannot serve from nothing.
        starts = max(1, cfg.learning_starts)
        self.ratio = (0.0, 1) if free else (cfg.samples_per_insert, starts)
        self.replay_of, self.seed = replay_of, seed
        self.generations = dict.fromkeys(replay_of, 0)
        """Group -> the generation its table holds (PSRO: the iteration of its best response);
        items of an older one are dropped, a newer one empties the table."""
        self.stale = 0
        self.earlier = {group: {"evicted": 0, "dropped": 0} for group in replay_of}
        """Group -> what the tables it replaced had evicted and dropped (PSRO replaces a group's
        table every iteration), so that the counters a shard reports never go backwards."""
        for group in replay_of:
            self.new_table(group)
        self.pending_inserts: deque[Message] = deque()
        self.pending_samples: deque[Message] = deque()
        self.samples_served = 0
        self.collectors = collectors
        self.credits = CreditReturn(self.send_credit, cfg.insert_credits)
        """Credits owed to collectors, one message per collector at the end of each poll."""
        self.dataset = dataset
        self.restored = False

    def new_table(self, group: str) -> None:
        """An empty table (and limiter) for the group, as its replay spec says."""
        if group in self.tables:
            self.retire(group, self.tables[group])
        replay, cfg = self.replay_of[group], self.cfg
        if replay.on_policy:
            self.tables[group] = ItemQueue(cfg.table_capacity)
            return
        options: dict[str, Any] = {
            "prioritized": replay.selector == "prioritized",
            "alpha": cfg.alpha,
            "beta": cfg.beta,
            "eps": cfg.eps,
            "seed": self.seed + list(self.replay_of).index(group) + 1_000 * self.generations[group],
        }
        form = self.forms.get(group)
        if form is None or not form.compact:
            self.tables[group] = ReplayTable(cfg.table_capacity, **options)
        elif self.joint(group):  # episodes, sequences: each item rebuilds itself
            self.tables[group] = CompactItemTable(cfg.table_capacity, form, **options)
        else:  # transition rows: rebuilt from their runs' other rows
            self.tables[group] = CompactTable(ReplayTable(cfg.table_capacity, **options), form)
        relaxed = self.limiters[group].relaxed if group in self.limiters else False
        self.limiters[group] = SampleToInsertRatio(*self.ratio, cfg.error_buffer)
        self.limiters[group].relaxed = relaxed

    def retire(self, group: str, table: ReplayTable | CompactTable | ItemQueue) -> None:
        """Keep a replaced table's eviction and drop counts in the group's running totals."""
        self.earlier[group]["evicted"] += int(table.evicted)
        self.earlier[group]["dropped"] += int(getattr(table, "dropped", 0))

    def evicted(self, group: str) -> int:
        return self.earlier[group]["evicted"] + int(self.tables[group].evicted)

    def dropped(self, group: str) -> int:
        return self.earlier[group]["dropped"] + int(getattr(self.tables[group], "dropped", 0))

    def joint(self, group: str) -> bool:
        """Whether the group's items are joint (a time axis, then agents), not transitions."""
        return group in self.items and ItemSpec.from_json(self.items[group]).joint

    def current(self, group: str, generation: int) -> bool:
        """Whether a message of `generation` is for what the group's table holds; a newer
        generation first replaces the table with an empty one."""
        if generation > self.generations[group]:
            self.generations[group] = generation
            self.new_table(group)
        return generation == self.generations[group]

    def start(self) -> None:
        if self.dataset is not None and not self.restored:
            self.load_dataset(self.dataset())
        for collector in self.collectors:
            self.send("credit", collector, {"n": self.cfg.insert_credits})

    def on_peers_back(self, names: set[str]) -> None:
        """A replaced collector starts without credit, as every collector does: the credits
        its lost rank held are given again."""
        super().on_peers_back(names)
        for collector in self.collectors:
            if collector in names:
                self.send("credit", collector, {"n": self.cfg.insert_credits})

    def load_dataset(self, batches: Iterable[tuple[str, dict[str, np.ndarray]]]) -> None:
        """Insert this shard's share of an offline dataset, oldest rows first; a large share
        takes a while, so the commander keeps hearing from the shard."""
        for group, batch in batches:
            self.tables[group].insert(batch)
            self.limiters[group].on_insert(len(batch["rewards"]))
            self.heartbeat()

    def handle_batch(self, msg: Message) -> None:
        if self.writing and not self.deterministic and self.credit_early(msg):
            self.credits.owe(msg.src)
            msg.meta["credited"] = True
        self.pending_inserts.append(msg)

    def credit_early(self, msg: Message) -> bool:
        """Whether a batch's credit may go back before its insert: only a replay table's, whose
        credit carries nothing but the permission to send more."""
        table = self.tables.get(msg.meta["group"])
        return table is not None and not isinstance(table, ItemQueue)

    def handle_sample_request(self, msg: Message) -> None:
        if isinstance(self.tables[msg.meta["group"]], ItemQueue):
            self.serve_queue(msg)
        else:
            self.pending_samples.append(msg)

    def handle_priorities(self, msg: Message) -> None:
        assert msg.arrays is not None
        a = msg.arrays
        table = self.tables[msg.meta["group"]]
        assert not isinstance(table, ItemQueue)
        table.update_priorities(a["indices"], a["insert_ids"], a["td"])

    def handle_relax(self, msg: Message) -> None:
        """Drain mode (shutdown, checkpoint): insert and sample without the ratio."""
        for limiter in self.limiters.values():
            limiter.relaxed = bool(msg.meta.get("on", True))

    def send_credit(self, collector: str, meta: dict[str, Any]) -> None:
        """How `self.credits` sends one collector what it is owed."""
        self.send("credit", collector, meta)

    def poll(self) -> bool:
        """The role's poll, then the credits it earned, one message per collector."""
        progressed = super().poll()
        return self.credits.flush() or progressed

    def work(self) -> bool:
        progressed = self.insert_allowed_batches()
        progressed = self.serve_allowed_samples() or progressed
        return self.report_stats() or progressed

    def insert_allowed_batches(self) -> bool:
        """Insert waiting batches in arrival order while their table's limiter allows it (and no
        checkpoint is being written from the tables)."""
        if self.writing:
            return False
        inserted = 0
        starved = self.starved_groups() if self.pending_inserts else set()
        blocked: set[tuple[str, int]] = set()
        """(group, generation) whose limiter said no in this pass: their later batches wait
        without asking again (a dozen batches wait behind a busy learner on most polls)."""
        for _ in range(len(self.pending_inserts)):
            msg = self.pending_inserts.popleft()
            group, generation = msg.meta["group"], msg.meta.get("generation", 0)
            if (group, generation) in blocked:
                self.pending_inserts.append(msg)
                continue
            if not self.current(group, generation):
                self.drop_stale(msg)
                continue
            limiter = self.limiters.get(group)
            held = limiter is not None and not limiter.can_insert()
            if held and not starved - {group}:
                blocked.add((group, generation))
                self.pending_inserts.append(msg)
                continue
            assert msg.arrays is not None
            table = self.tables[group]
            ids: dict[str, Any] | None = None
            if isinstance(table, ItemQueue):  # the ids let the commander assign exact ranges
                ids = {
                    "group": group,
                    "first": table.insert(msg.arrays),
                    "items": msg.meta["items"],
                }
            else:
                table.insert(msg.arrays)
            if limiter is not None:
                limiter.on_insert(len(msg.arrays["rewards"]))
            self.transport.recycle(msg.arrays)
            if msg.src and not msg.meta.get("credited"):  # restored batches owe no credit
                self.credits.owe(msg.src, ids)
            inserted += 1
        return inserted > 0

    def starved_groups(self) -> set[str]:
        """Groups a learner waits on here whose limiter refuses samples for want of inserts."""
        starved = set()
        for msg in self.pending_samples:
            group = msg.meta["group"]
            table = self.tables[group]
            if not self.limiters[group].can_sample(table.size):
                starved.add(group)
        return starved

    def refusals(self) -> dict[str, str]:
        """What each group's limiter refuses now (for the commander's stall report): the
        samples of a starved group (`starved_groups`), else the inserts it holds back."""
        starved = self.starved_groups()
        out = {}
        for group, limiter in self.limiters.items():
            if group in starved:
                waiting = sum(m.meta["group"] == group for m in self.pending_samples)
                out[group] = f"samples ({waiting} requests wait; {limiter!r})"
                continue
            held = sum(m.meta["group"] == group for m in self.pending_inserts)
            if held and not limiter.can_insert():
                out[group] = f"inserts ({held} batches wait; {limiter!r})"
        return out

    def drop_stale(self, msg: Message) -> None:
        """A batch of a generation the group has left behind: not stored, its credit back."""
        assert msg.arrays is not None
        self.stale += 1
        self.transport.recycle(msg.arrays)
        if msg.src and not msg.meta.get("credited"):
            self.credits.owe(msg.src)

    def serve_allowed_samples(self) -> bool:
        served = 0
        for _ in range(len(self.pending_samples)):
            msg = self.pending_samples.popleft()
            group, n = msg.meta["group"], msg.meta["n"]
            self.current(group, msg.meta.get("generation", 0))
            table = self.tables[group]
            assert not isinstance(table, ItemQueue)
            if table.size == 0 or not self.limiters[group].can_sample(table.size):
                if self.nothing_to_wait_for(group):
                    self.send("sample", msg.src, {"group": group, "items": 0, "empty": True})
                else:
                    self.pending_samples.append(msg)
                continue
            columns, info = table.sample(n)
            self.limiters[group].on_sample(n)
            columns["indices"] = info.indices
            columns["insert_ids"] = info.insert_ids
            columns["weights"] = info.weights
            self.send("sample", msg.src, {"group": group, "items": n}, columns)
            served += 1
        self.samples_served += served
        return served > 0

    def nothing_to_wait_for(self, group: str) -> bool:
        """Whether a request the table cannot serve now is answered at once, empty, rather
        than held until inserts let it be served.

        Deterministic mode: a table that cannot serve now never will before the learner's
        task ends (lockstep inserts nothing during the learn phase), so the learner asks its
        next shard. Whether this shard can serve depends only on what was inserted, so a
        resume answers as the run did.

        Otherwise only in drain mode (`relax`: the commander stopped collection for a
        checkpoint or the end): the inserts a table below `learning_starts` waits for may
        never come, and a learner task holding a request here could not end (its trainer is
        done only with no request in flight), so the checkpoint or the stop would wait for
        it for ever. The learner leaves this shard alone for the rest of its task."""
        if not self.deterministic:
            return self.limiters[group].relaxed
        if self.writing:
            return False
        return not any(m.meta["group"] == group for m in self.pending_inserts)

    def serve_queue(self, msg: Message) -> None:
        """Hand out the range of items asked for at once (the fresh ones; an empty answer
        still says how many were dropped as too old)."""
        group, m = msg.meta["group"], msg.meta
        queue = self.tables[group]
        assert isinstance(queue, ItemQueue)
        items, dropped = queue.take(m["ranges"], m["min_version"])
        meta = {
            "group": group,
            "items": 0 if items is None else len(items["actions"]),
            "dropped": dropped,
        }
        self.send("sample", msg.src, meta, items)
        self.samples_served += 1

    def write_checkpoint_when_ready(self) -> bool:
        """Insert what the (relaxed) limiters allow before the file is written: a batch that
        arrived in the same poll as the cut's last expected one belongs in the table, not in
        the file's list of pending inserts."""
        self.insert_allowed_batches()
        return super().write_checkpoint_when_ready()

    @property
    def writing(self) -> bool:
        """A checkpoint is being written from the tables' memory: inserts wait."""
        return self.checkpoint_writer is not None

    def snapshot(self) -> dict:
        """The tables as views of their memory (see the module docstring): inserts wait while
        the file is written."""
        from ..storage.writer import snapshot

        return snapshot(self.state(views=True))

    def state(self, views: bool = False) -> dict:
        pending = {
            str(i): {
                "group": m.meta["group"],
                "generation": m.meta.get("generation", 0),
                "columns": dict(m.arrays or {}),
            }
            for i, m in enumerate(self.pending_inserts)
        }
        return {
            **super().state(),
            "tables": {g: nest(t.state(views=views)) for g, t in self.tables.items()},
            "limiters": {g: dict(lim.state()) for g, lim in self.limiters.items()},
            "pending_inserts": pending,
            "samples_served": self.samples_served,
            "generations": dict(self.generations),
            "earlier": {g: dict(counts) for g, counts in self.earlier.items()},
            "items": dict(self.items),
        }

    def load_state(self, tree: dict) -> None:
        for group, generation in tree.get("generations", {}).items():
            if int(generation) != self.generations[group]:
                self.generations[group] = int(generation)
                self.new_table(group)
        for group, counts in tree.get("earlier", {}).items():
            self.earlier[group] = {k: int(v) for k, v in counts.items()}
        for group, table_state in tree["tables"].items():
            self.tables[group].load_state(obs_in(flatten(table_state), self.obs_dtype(group)))
            if group in self.limiters:
                self.limiters[group].load_state(tree["limiters"][group])
        for i in sorted(tree["pending_inserts"], key=int):
            entry = tree["pending_inserts"][i]
            columns = obs_in(entry["columns"], self.obs_dtype(entry["group"]))
            meta = {
                "group": entry["group"],
                "items": len(next(iter(columns.values()))),
                "generation": int(entry.get("generation", 0)),
            }
            self.pending_inserts.append(Message("batch", "", self.name, meta, columns))
        self.samples_served = int(tree["samples_served"])
        self.restored = True

    def obs_dtype(self, group: str) -> str:
        """The dtype `group`'s items keep observations in (`GroupSpec.obs_dtype`)."""
        if group not in self.items:
            return "<f4"
        columns = {c.name: c.dtype for c in ItemSpec.from_json(self.items[group]).columns}
        return columns.get("observations", "<f4")

    def counters(self) -> dict:
        return {
            "role": self.name,
            "sizes": {g: int(t.size) for g, t in self.tables.items()},
            "capacity": int(self.cfg.table_capacity),
            "inserted": {g: int(t.total_inserted) for g, t in self.tables.items()},
            "evicted": {g: self.evicted(g) for g in self.tables},
            "dropped": {g: self.dropped(g) for g in self.tables},
            "pending_inserts": len(self.pending_inserts),
            "samples_served": self.samples_served,
            "stale": self.stale,
            "refusing": self.refusals(),
        }
