"""Role contracts: what every role on every rank promises.

A role is an object whose `poll()` does a bounded amount of work and says whether it made
progress. A rank's loop polls its roles and sleeps briefly when none did, so roles never block
and many ranks can share few cores. Roles talk only through messages (see comm/protocol.py).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from .comm.protocol import KINDS, Message
from .comm.transport import LocalTransport

if TYPE_CHECKING:
    from .storage.writer import CheckpointWriter

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
    hears_lost_peers = True
    """Whether messages a peer sent before its rank died are still handled: a shard inserts
    a lost collector's last batches; the commander, which already failed its task, drops its
    reports."""
    heartbeat_interval_s = 2.0
    """Set from the job at start-up (runtime.heartbeat_interval_s)."""

    def __init__(self, name: str, transport: LocalTransport) -> None:
        self.name = name
        self.transport = transport
        self.inbox: deque[Message] = transport.register(name)
        self.finished = False
        self.exit_code = 0
        self.polls = 0
        self.asked = False
        self._last_report = 0.0
        self._last_heartbeat = 0.0
        self.sent_bulk: dict[str, int] = {}
        self.received_bulk: dict[str, int] = {}
        self.checkpoint_request: dict[str, Any] | None = None
        self.checkpoint_writer: CheckpointWriter | None = None
        self.lost_peers: set[str] = set()
        """Roles on ranks that died during the run (`on_peers_lost`): nothing more comes
        from them, and nothing sent to them arrives."""

    def send(
        self, kind: str, dst: str, meta: dict[str, Any] | None = None, arrays: Batch | None = None
    ) -> None:
        assert kind in KINDS, f"unknown message kind {kind}"
        if arrays is not None:
            self.sent_bulk[dst] = self.sent_bulk.get(dst, 0) + 1
        self.transport.send(Message(kind, self.name, dst, meta or {}, arrays))

    def start(self) -> None:
        """Called once every role of the rank exists: the place for first messages."""

    def poll(self) -> bool:
        """Handle waiting messages, then do one bounded step of work."""
        self.polls += 1
        handled = 0
        while self.inbox and handled < self.max_messages_per_poll and not self.finished:
            msg = self.inbox.popleft()
            handled += 1
            if not self.hears_lost_peers and msg.src in self.lost_peers:
                continue
            if msg.arrays is not None:
                self.received_bulk[msg.src] = self.received_bulk.get(msg.src, 0) + 1
            self.note_message(msg)
            getattr(self, f"handle_{msg.kind}")(msg)
        if self.finished:
            return handled > 0
        self.heartbeat()
        if self.checkpoint_request is not None and self.write_checkpoint_when_ready():
            return True
        if self.checkpoint_writer is not None and self.checkpoint_writer.done():
            self.report_checkpoint_written()
            return True
        return self.work() or handled > 0

    def note_message(self, msg: Message) -> None:
        """Called for every message received, before its handler."""

    def on_peers_lost(self, names: set[str], where: str) -> None:
        """Peers whose rank died (`launch/losses.py`; `where` names ranks and hosts): a
        checkpoint cut stops waiting for their bulk messages. Roles that keep state per peer
        extend this."""
        self.lost_peers |= names

    def on_peers_back(self, names: set[str]) -> None:
        """Lost peers replaced by a new rank (`launch/respawn_run.py`): their messages count
        again, from zero, as the replacement counts what it sends from zero. Roles that keep
        state per peer extend this."""
        self.lost_peers -= names
        for name in names:
            self.received_bulk.pop(name, None)
            self.sent_bulk.pop(name, None)

    def takes_replacements(self) -> bool:
        """Whether a replacement for a lost peer is still of use to this role
        (`runtime.respawn_collectors`; the commander says no once the run stops)."""
        return True

    def in_flight(self) -> bool:
        """Something only polling finishes is under way (a collective, a checkpoint written on
        a thread): the rank must keep polling instead of waiting for a peer's message."""
        return self.checkpoint_request is not None or self.checkpoint_writer is not None

    def collective_in_flight(self) -> bool:
        """A collective of this role's is under way: its peers wait on this rank's MPI calls,
        so the rank polls closely (`progress.COLLECTIVE_SLEEP_MAX_S`)."""
        return False

    def heartbeat(self) -> None:
        """Tell the commander this role is alive, every `heartbeat_interval_s`."""
        now = time.monotonic()
        if self.name != "commander" and now - self._last_heartbeat >= self.heartbeat_interval_s:
            self._last_heartbeat = now
            self.send("heartbeat", "commander")

    # -- coordinated checkpoints ------------------------------------------------------------
    def handle_checkpoint(self, msg: Message) -> None:
        self.checkpoint_request = msg.meta

    def write_checkpoint_when_ready(self) -> bool:
        """Snapshot this role's state once every bulk message sent to it before the cut arrived,
        and start writing it on a thread.

        The commander knows how many batches, priorities and weight pushes each producer sent
        here before it quiesced; waiting for exactly those makes every role's file part of one
        consistent cut, with nothing in flight left out. The role then goes on with its work
        while the file is written (`report_checkpoint_written` follows).
        """
        from .storage.writer import CheckpointWriter, tree_nbytes
        from .testing.faults import write_delay

        request = self.checkpoint_request
        assert request is not None
        expected = request.get("expect", {}).get(self.name, {})
        waiting = (src for src in expected if src not in self.lost_peers)
        if any(self.received_bulk.get(src, 0) < expected[src] for src in waiting):
            return False
        tree, ckpt_id = self.snapshot(), request["id"]
        delay = write_delay(self.kind, self.name)
        self.checkpoint_writer = CheckpointWriter(
            request["run_dir"], ckpt_id, self.name, tree, delay
        )
        self.send("snapshotted", "commander", {"id": ckpt_id, "bytes": tree_nbytes(tree)})
        self.checkpoint_request = None
        return True

    def report_checkpoint_written(self) -> None:
        """The file is on disk (or its write failed, raised here in the role's own loop)."""
        writer = self.checkpoint_writer
        assert writer is not None
        record = writer.result()
        self.checkpoint_writer = None
        meta = {"id": writer.ckpt_id, "record": vars(record), "seconds": writer.seconds}
        self.send("checkpointed", "commander", meta)

    def snapshot(self) -> dict[str, Any]:
        """The state to write for the cut, safe from what the role does while it is written."""
        from .storage.writer import snapshot

        return snapshot(self.state())

    def state(self) -> dict[str, Any]:
        """Everything this role needs to continue as if never stopped (a tree for HDF5)."""
        return {"sent_bulk": dict(self.sent_bulk), "received_bulk": dict(self.received_bulk)}

    def load_state(self, tree: dict[str, Any]) -> None:
        """Restore what `state()` saved; message counters restart, the peers are new."""

    def ask_for_task(self) -> bool:
        """Ask the commander for work, once: the request stays queued there until granted. It
        carries the bulk messages sent so far, as task reports do: a learner's start-up push is
        sent before any task, and a checkpoint cut must wait for it too."""
        if self.asked:
            return False
        self.asked = True
        self.send("task_request", "commander", {"sent_bulk": dict(self.sent_bulk)})
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

    def handle_stop(self, msg: Message) -> None:
        """Acknowledge with our counters and stop; the run's exit code becomes ours too.

        Roles say what their acknowledgement carries by extending `counters()`, never by
        overriding this: a rank's exit code is its roles' codes, and only this sets them.
        """
        self.exit_code = int(msg.meta.get("exit_code", 0))
        self.send("stopped", msg.src, self.counters())
        self.finish()

    def finish(self) -> None:
        """Stop for good: receive nothing more."""
        self.finished = True
        self.transport.unregister(self.name)

    def close(self) -> None:
        """Release the files this role holds open; called when the rank's loop ends, whether
        it finished or failed, so that what the role wrote is complete before the rank exits."""
