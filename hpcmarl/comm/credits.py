"""Batched credits: a consumer returns its producers' credits a batch at a time.

A producer may have at most `window` messages unacknowledged with a consumer; each message it
sends spends one credit, and the consumer gives a credit back for each message it has taken in.
One credit message per data message doubles the messages on the wire, and across hosts that
second message costs about as much as a small data message. `CreditReturn` owes the credits
instead and sends a peer's owed credits as one message when

    owed[peer] >= batch

or when `flush` is called: at the end of a pass that found nothing more to read, so a producer
that has stopped sending is never left waiting for credits that sit here.

Choosing `batch`: a consumer that streams (flushes only when idle) takes `batch = window // 2`.
When a batch of credits leaves, the producer still holds (or has in flight) the other
`window - batch >= batch` messages' worth, enough to keep sending while the credits travel
back, so batching never stalls it. A consumer that flushes at the end of every pass (the
replay shard) may take `batch = window`: no credit waits longer than the pass that earned it.
Back-pressure is unchanged either way: no credit is given before its message has been taken
in, so a slow consumer still holds a fast producer to `window` messages in flight, and nothing
buffers without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class CreditReturn:
    """Credits owed to each producer, sent back in batches (module docstring: the formula)."""

    def __init__(self, send: Callable[[str, dict[str, Any]], None], batch: int) -> None:
        self.send = send
        """Sends one credit message: (producer, meta with `n` and `inserted`)."""
        self.batch = max(1, batch)
        self.owed: dict[str, int] = {}
        self.messages = 0
        """Credit messages sent so far (the benchmark reports them per data message)."""

    def owe(self, peer: str, extra: dict[str, Any] | None = None) -> None:
        """One more message of `peer` taken in. An `extra` payload (an on-policy queue's
        insert ids) goes back at once, with whatever else is owed to that peer."""
        owed = self.owed.get(peer, 0) + 1
        if extra is not None or owed >= self.batch:
            self.owed.pop(peer, None)
            self._send(peer, owed, extra or {})
        else:
            self.owed[peer] = owed

    def flush(self) -> bool:
        """Send every owed credit; True when something was sent."""
        if not self.owed:
            return False
        owed, self.owed = self.owed, {}
        for peer, n in owed.items():
            self._send(peer, n, {})
        return True

    def _send(self, peer: str, n: int, extra: dict[str, Any]) -> None:
        self.messages += 1
        self.send(peer, {"n": n, "inserted": n, **extra})
