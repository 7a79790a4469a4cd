"""Waiting without spinning: the idle backoff and the pool of outstanding requests.

Sixteen ranks may share two cores, so an idle rank must sleep, but a busy one must not: the
backoff doubles its sleep while nothing happens and resets the moment something does.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .doorbell import Doorbell


COLLECTIVE_SLEEP_MAX_S = 1e-4
"""Longest sleep while a collective of the rank's is in flight: it moves only when the rank
calls MPI, and no peer rings a bell for it. With sleeps of up to 2 ms, the default job at
`-n 16` on 2 local hosts (its two learners averaging over TCP every update) made 142 env
steps/s in each of 5 runs; with this cap 249, against 284 on one host."""


class Backoff:
    """Sleep min_s, 2*min_s, 4*min_s ... up to max_s while idle; `reset()` on progress.

    With a doorbell (doorbell.py) every sleep ends early when a peer's message rings, and once
    the polls have backed off to `max_s` an idle rank that may (`sleep(may_wait=True)`) waits
    up to `wait_s` for a ring instead of waking every `max_s` to poll. While a collective is in
    flight (`sleep(collective=True)`) no sleep is longer than `COLLECTIVE_SLEEP_MAX_S`."""

    def __init__(
        self,
        min_s: float = 5e-5,
        max_s: float = 2e-3,
        doorbell: Doorbell | None = None,
        wait_s: float = 0.0,
    ) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self.doorbell = doorbell
        self.wait_s = max(wait_s, max_s)
        self._next = min_s

    def reset(self) -> None:
        self._next = self.min_s

    def sleep(self, may_wait: bool = False, collective: bool = False) -> None:
        longest = min(self.max_s, COLLECTIVE_SLEEP_MAX_S) if collective else self.max_s
        self._next = min(self._next, longest)
        if self.doorbell is None:
            time.sleep(self._next)
        else:
            backed_off = self._next >= self.max_s
            waits = may_wait and backed_off and not collective
            if self.doorbell.wait(self.wait_s if waits else self._next):
                self.reset()  # a message is here or on its way: poll closely for a while
                return
        self._next = min(self._next * 2.0, longest)


def _testsome() -> Any:
    """mpi4py's Testsome, imported on first use so that one-process runs never load MPI."""
    global _TESTSOME
    if _TESTSOME is None:
        from mpi4py import MPI

        _TESTSOME = MPI.Request.Testsome
    return _TESTSOME


_TESTSOME: Any = None


class RequestPool:
    """Owns outstanding nonblocking sends and the buffers they read from.

    A buffer handed to `Isend` must live, unmodified, until its request completes; keeping the
    buffer next to its request here is what guarantees that. A request may name the rank it
    goes to: `test` then collects it in `arrived`, for the transport to ring that rank's
    doorbell once more (a send that completes late, say to a peer not yet connected, may reach
    the peer after the ring made when it was posted).
    """

    def __init__(self) -> None:
        self._requests: list[Any] = []
        self._keepalive: list[Any] = []
        self._dests: list[int | None] = []
        self.arrived: set[int] = set()
        """Ranks that sends named since the caller last cleared this."""

    def add(self, request: Any, keepalive: Any, dest: int | None = None) -> None:
        self._requests.append(request)
        self._keepalive.append(keepalive)
        self._dests.append(dest)

    def __len__(self) -> int:
        return len(self._requests)

    def test(self) -> int:
        """Release every completed request; return how many completed."""
        if not self._requests:
            return 0
        done = _testsome()(self._requests)
        if not done:
            return 0
        finished = set(done)
        self.arrived.update(d for i in finished if (d := self._dests[i]) is not None)
        self._requests = [r for i, r in enumerate(self._requests) if i not in finished]
        self._keepalive = [k for i, k in enumerate(self._keepalive) if i not in finished]
        self._dests = [d for i, d in enumerate(self._dests) if i not in finished]
        return len(finished)

    def drain(self, timeout_s: float, on_idle: Any = None) -> bool:
        """Complete every request within `timeout_s`; `on_idle` keeps receives flowing meanwhile."""
        deadline = time.monotonic() + timeout_s
        backoff = Backoff()
        while self._requests and time.monotonic() < deadline:
            progressed = self.test() > 0
            if on_idle is not None:
                progressed = on_idle() or progressed
            if progressed:
                backoff.reset()
            else:
                backoff.sleep()
        return not self._requests
