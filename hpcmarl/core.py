"""Role contracts: what every role on every rank promises.

A role is an object whose `poll()` does a bounded amount of work and says whether it made
progress. A rank's loop polls its roles and sleeps briefly when none did, so roles never block
and many ranks can share few cores. Roles talk only through messages (see comm/protocol.py).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from .comm.protocol import KINDS, Message
from .comm.transport import LocalTransport

Batch = dict[str, np.ndarray]
"""A batch: column name -> array, all with the same leading length."""


def policy_key(strategy_spec_id: str, policy_id: str) -> str:
    """The parameter-server table key of one policy of one strategy spec."""
    return f"{strategy_spec_id}/{policy_id}"


class Role:
    """Base of commander, parameter server, replay shard, learner and collector.

    Subclasses implement `handle_<kind>` for each message kind they receive and `work()` for
    what they do between messages; `poll()` ties the two together.
    """

    kind = "role"
    max_messages_per_poll = 32

    def __init__(self, name: str, transport: LocalTransport) -> None:
        self.name = name
        self.transport = transport
        self.inbox: deque[Message] = transport.register(name)
        self.finished = False
        self.polls = 0
        self.asked = False
        self._last_report = 0.0

    def send(
        self, kind: str, dst: str, meta: dict[str, Any] | None = None, arrays: Batch | None = None
    ) -> None:
        assert kind in KINDS, f"unknown message kind {kind}"
        self.transport.send(Message(kind, self.name, dst, meta or {}, arrays))

    def start(self) -> None:
        """Called once every role of the rank exists: the place for first messages."""

    def poll(self) -> bool:
        """Handle waiting messages, then do one bounded step of work."""
        self.polls += 1
        handled = 0
        while self.inbox and handled < self.max_messages_per_poll and not self.finished:
            msg = self.inbox.popleft()
            getattr(self, f"handle_{msg.kind}")(msg)
            handled += 1
        if self.finished:
            return handled > 0
        return self.work() or handled > 0

    def ask_for_task(self) -> bool:
        """Ask the commander for work, once: the request stays queued there until granted."""
        if self.asked:
            return False
        self.asked = True
        self.send("task_request", "commander")
        return True

    def report_stats(self, interval_s: float = 1.0) -> bool:
        """Send `counters()` to the commander at most every `interval_s` seconds."""
        now = time.monotonic()
        if now - self._last_report < interval_s:
            return False
        self._last_report = now
        self.send("stats", "commander", self.counters())
        return True

    def counters(self) -> dict[str, Any]:
        """What this role reports to the commander."""
        return {"role": self.name}

    def work(self) -> bool:
        """One bounded step of the role's own work; True when something happened."""
        return False

    def finish(self) -> None:
        """Stop for good: receive nothing more."""
        self.finished = True
        self.transport.unregister(self.name)
