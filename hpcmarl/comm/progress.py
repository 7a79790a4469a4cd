"""Waiting without spinning: the idle backoff and the pool of outstanding requests.

Sixteen ranks may share two cores, so an idle rank must sleep, but a busy one must not: the
backoff doubles its sleep while nothing happens and resets the moment something does.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .failures import is_peer_failure, may_be_peer_failure

if TYPE_CHECKING:
    from .doorbell import Doorbell
    from .failures import LostRanks


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

    def __init__(self, failures: LostRanks | None = None) -> None:
        self._requests: list[Any] = []
        self._keepalive: list[Any] = []
        self._dests: list[int | None] = []
        self._rings: list[bool] = []
        self.arrived: set[int] = set()
        """Ranks that sends named since the caller last cleared this."""
        self.failures = failures
        """Under Open MPI's fault tolerance (failures.py): a send to a rank that died
        completes in error, and is dropped instead of ending this rank."""

    def add(
        self, request: Any, keepalive: Any, dest: int | None = None, rings: bool = True
    ) -> None:
        """Keep `request` and the buffer it reads; `dest` rings its doorbell on arrival unless
        `rings` is false (the body of a message whose header rang already)."""
        self._requests.append(request)
        self._keepalive.append(keepalive)
        self._dests.append(dest)
        self._rings.append(rings and dest is not None)

    def __len__(self) -> int:
        return len(self._requests)

    def test(self) -> int:
        """Release every completed request; return how many completed."""
        if not self._requests:
            return 0
        try:
            done = _testsome()(self._requests)
        except Exception as err:
            if self.failures is None or not may_be_peer_failure(err):
                raise
            done = self._test_each()
        if not done:
            return 0
        finished = set(done)
        if len(finished) == len(self._requests):  # all of them: the usual case of a poll
            dests = zip(self._dests, self._rings, strict=True)
            self.arrived.update(d for d, rings in dests if rings and d is not None)
            self._requests, self._keepalive, self._dests, self._rings = [], [], [], []
            return len(finished)
        self.arrived.update(
            d for i in finished if self._rings[i] and (d := self._dests[i]) is not None
        )
        keep = [i for i in range(len(self._requests)) if i not in finished]
        self._requests = [self._requests[i] for i in keep]
        self._keepalive = [self._keepalive[i] for i in keep]
        self._dests = [self._dests[i] for i in keep]
        self._rings = [self._rings[i] for i in keep]
        return len(finished)

    def _test_each(self) -> list[int]:
        """After a peer died: test the requests one by one, and count a send to a dead rank as
        done (dropped). Any other failure is ours, and raises."""
        assert self.failures is not None
        self.failures.refresh()
        done = []
        for i, request in enumerate(self._requests):
            try:
                if request.Test():
                    done.append(i)
            except Exception as err:
                if not is_peer_failure(err) or self._dests[i] not in self.failures.known:
                    raise
                done.append(i)
        return done

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
