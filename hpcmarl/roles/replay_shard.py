"""A replay shard: one replay table per policy, fed by collectors, drained by learners.

Producer flow is credit based: every collector starts with `insert_credits` batches it may have
in flight here, and gets a credit back only once its batch is inserted. The samples-per-insert
limiter holds batches back when collectors run ahead of learners, so back-pressure reaches the
collectors through withheld credits and nothing queues without bound. Consumer flow: a learner
asks for one batch at a time; the request waits here until the limiter allows a sample.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..config.schema import ReplayConfig
from ..core import Role
from ..replay.rate_limiters import SampleToInsertRatio
from ..replay.table import ReplayTable
from .state_tree import flatten, nest


class ReplayShard(Role):
    """Holds replay tables and serves inserts and samples under a rate limiter."""

    kind = "replay_shard"

    def __init__(
        self,
        name: str,
        transport: LocalTransport,
        cfg: ReplayConfig,
        policies: list[str],
        collectors: list[str],
        seed: int,
        deterministic: bool = False,
        dataset: Callable[[], Iterable[tuple[str, dict[str, np.ndarray]]]] | None = None,
    ) -> None:
        super().__init__(name, transport)
        self.cfg = cfg
        self.tables = {
            p: ReplayTable(
                cfg.table_capacity,
                prioritized=cfg.prioritized,
                alpha=cfg.alpha,
                beta=cfg.beta,
                eps=cfg.eps,
                seed=seed + i,
            )
            for i, p in enumerate(policies)
        }
        # Deterministic mode's schedule fixes the ratio itself; a limiter would react to timing.
        # Offline, nothing is inserted after the start: any number of samples is fine.
        free = deterministic or dataset is not None
        ratio = (0.0, 1) if free else (cfg.samples_per_insert, cfg.learning_starts)
        self.limiters = {p: SampleToInsertRatio(*ratio, cfg.error_buffer) for p in policies}
        self.pending_inserts: deque[Message] = deque()
        self.pending_samples: deque[Message] = deque()
        self.samples_served = 0
        self.collectors = collectors
        self.dataset = dataset
        self.restored = False

    def start(self) -> None:
        if self.dataset is not None and not self.restored:
            self.load_dataset(self.dataset())
        for collector in self.collectors:
            self.send("credit", collector, {"n": self.cfg.insert_credits})

    def load_dataset(self, batches: Iterable[tuple[str, dict[str, np.ndarray]]]) -> None:
        """Insert this shard's share of an offline dataset, oldest rows first; a large share
        takes a while, so the commander keeps hearing from the shard."""
        for policy, batch in batches:
            self.tables[policy].insert(batch)
            self.limiters[policy].on_insert(len(batch["rewards"]))
            self.heartbeat()

    def handle_batch(self, msg: Message) -> None:
        self.pending_inserts.append(msg)

    def handle_sample_request(self, msg: Message) -> None:
        self.pending_samples.append(msg)

    def handle_priorities(self, msg: Message) -> None:
        assert msg.arrays is not None
        a = msg.arrays
        self.tables[msg.meta["policy"]].update_priorities(a["indices"], a["insert_ids"], a["td"])

    def handle_relax(self, msg: Message) -> None:
        """Drain mode (shutdown, checkpoint): insert and sample without the ratio."""
        for limiter in self.limiters.values():
            limiter.relaxed = bool(msg.meta.get("on", True))

    def work(self) -> bool:
        progressed = self.insert_allowed_batches()
        progressed = self.serve_allowed_samples() or progressed
        return self.report_stats() or progressed

    def insert_allowed_batches(self) -> bool:
        """Insert waiting batches in arrival order while their table's limiter allows it."""
        inserted = 0
        for _ in range(len(self.pending_inserts)):
            msg = self.pending_inserts.popleft()
            policy = msg.meta["policy"]
            if not self.limiters[policy].can_insert():
                self.pending_inserts.append(msg)
                continue
            assert msg.arrays is not None
            self.tables[policy].insert(msg.arrays)
            self.limiters[policy].on_insert(len(msg.arrays["rewards"]))
            self.transport.recycle(msg.arrays)
            if msg.src:  # batches restored from a checkpoint owe no credit
                self.send("credit", msg.src, {"n": 1, "inserted": 1})
            inserted += 1
        return inserted > 0

    def serve_allowed_samples(self) -> bool:
        served = 0
        for _ in range(len(self.pending_samples)):
            msg = self.pending_samples.popleft()
            policy, n = msg.meta["policy"], msg.meta["n"]
            table = self.tables[policy]
            if table.size == 0 or not self.limiters[policy].can_sample(table.size):
                self.pending_samples.append(msg)
                continue
            columns, info = table.sample(n)
            self.limiters[policy].on_sample(n)
            columns["indices"] = info.indices
            columns["insert_ids"] = info.insert_ids
            columns["weights"] = info.weights
            self.send("sample", msg.src, {"policy": policy}, columns)
            served += 1
        self.samples_served += served
        return served > 0

    def state(self) -> dict:
        pending = {
            str(i): {"policy": m.meta["policy"], "columns": dict(m.arrays or {})}
            for i, m in enumerate(self.pending_inserts)
        }
        return {
            **super().state(),
            "tables": {p: nest(t.state()) for p, t in self.tables.items()},
            "limiters": {p: dict(lim.state()) for p, lim in self.limiters.items()},
            "pending_inserts": pending,
            "samples_served": self.samples_served,
        }

    def load_state(self, tree: dict) -> None:
        for policy, table_state in tree["tables"].items():
            self.tables[policy].load_state(flatten(table_state))
            self.limiters[policy].load_state(tree["limiters"][policy])
        for i in sorted(tree["pending_inserts"], key=int):
            entry = tree["pending_inserts"][i]
            meta = {"policy": entry["policy"]}
            self.pending_inserts.append(Message("batch", "", self.name, meta, entry["columns"]))
        self.samples_served = int(tree["samples_served"])
        self.restored = True

    def counters(self) -> dict:
        return {
            "role": self.name,
            "sizes": {p: int(t.size) for p, t in self.tables.items()},
            "capacity": int(self.cfg.table_capacity),
            "inserted": {p: int(t.total_inserted) for p, t in self.tables.items()},
            "evicted": {p: int(t.evicted) for p, t in self.tables.items()},
            "pending_inserts": len(self.pending_inserts),
            "samples_served": self.samples_served,
        }
