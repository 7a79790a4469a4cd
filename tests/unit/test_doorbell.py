"""Doorbells: a ring wakes a waiting rank, rings coalesce, a missing peer is harmless, and the
backoff waits long only when allowed and only once backed off."""

from __future__ import annotations

import secrets
import threading
import time

import pytest

from hpcmarl.comm.doorbell import Doorbell, NetworkDoorbell, address, host_address, supported
from hpcmarl.comm.progress import COLLECTIVE_SLEEP_MAX_S, Backoff

pytestmark = pytest.mark.skipif(not supported(), reason="doorbells need Linux's abstract sockets")


@pytest.fixture
def bells() -> tuple[Doorbell, Doorbell]:
    token = secrets.token_hex(8)
    first, second = Doorbell(token, 0, [0, 1]), Doorbell(token, 1, [0, 1])
    yield first, second
    first.close()
    second.close()


def test_addresses_are_abstract_and_distinct_per_world_and_rank() -> None:
    assert address("a", 0).startswith(b"\0")
    assert len({address("a", 0), address("a", 1), address("b", 0)}) == 3


def test_a_ring_wakes_the_waiting_peer(bells: tuple[Doorbell, Doorbell]) -> None:
    first, second = bells
    ringer = threading.Timer(0.05, first.ring, args=(1,))
    ringer.start()
    assert second.wait(30.0)  # woken by the ring, not by the timeout
    ringer.join()  # the ringer counts its ring after the send that woke us: let it finish
    assert (first.rings_sent, second.wakeups) == (1, 1)


def test_rings_made_while_busy_are_kept_and_consumed_by_one_wait(
    bells: tuple[Doorbell, Doorbell],
) -> None:
    first, second = bells
    for _ in range(5):
        first.ring(1)
    assert second.wait(30.0)
    assert not second.wait(0.0)  # all five consumed at once


def test_a_wait_without_a_ring_times_out(bells: tuple[Doorbell, Doorbell]) -> None:
    _, second = bells
    assert not second.wait(0.01)
    assert second.wakeups == 0


def test_ringing_a_rank_without_a_bell_or_outside_the_world_is_silent(
    bells: tuple[Doorbell, Doorbell],
) -> None:
    first, second = bells
    second.close()  # the peer ended
    first.ring(1)
    first.ring(7)  # not a peer at all
    assert first.rings_sent == 0


def test_backoff_waits_long_only_when_allowed_and_backed_off(
    bells: tuple[Doorbell, Doorbell],
) -> None:
    first, second = bells
    backoff = Backoff(min_s=1e-4, max_s=2e-3, doorbell=second, wait_s=30.0)
    start = time.monotonic()
    while backoff._next < backoff.max_s:  # short sleeps only, even when allowed to wait
        backoff.sleep(may_wait=True)
    backoff.sleep(may_wait=False)  # backed off, but something is in flight: max_s only
    assert time.monotonic() - start < 10.0 and second.wakeups == 0
    threading.Timer(0.05, first.ring, args=(1,)).start()
    backoff.sleep(may_wait=True)  # the long wait, ended by the ring
    assert second.wakeups == 1
    assert backoff._next == backoff.min_s  # a ring means a message: poll closely again


def test_a_world_with_an_unreachable_peer_is_found_out_at_start_up() -> None:
    # Rank 1 never bound its bell (another network namespace, say): rank 0 cannot reach it.
    lonely = Doorbell(secrets.token_hex(8), 0, [0, 1])
    try:
        assert not lonely.reaches_every_peer()
    finally:
        lonely.close()


def test_every_peer_is_reached_when_all_bells_exist(bells: tuple[Doorbell, Doorbell]) -> None:
    first, second = bells
    assert first.reaches_every_peer() and second.reaches_every_peer()


def test_a_network_bell_wakes_its_peer_and_hears_hellos() -> None:
    """The UDP bells of a world over several hosts, here both at the loopback address."""
    first, second = NetworkDoorbell(0), NetworkDoorbell(1)
    addresses: list[tuple[str, int] | None] = [
        ("127.0.0.1", first.port),
        ("127.0.0.1", second.port),
    ]
    try:
        first.connect(addresses)
        second.connect(addresses)
        first.say_hello()
        second.say_hello()
        assert first.heard_every_peer(5.0) and second.heard_every_peer(5.0)
        ringer = threading.Timer(0.05, first.ring, args=(1,))
        ringer.start()
        assert second.wait(30.0)
        ringer.join()
        assert (first.rings_sent, second.wakeups) == (1, 1)
    finally:
        first.close()
        second.close()


def test_a_network_bell_that_hears_no_hello_says_so() -> None:
    lonely = NetworkDoorbell(0)
    try:
        lonely.connect([None, ("127.0.0.1", 9)])  # a peer that never says hello
        assert not lonely.heard_every_peer(0.2)
    finally:
        lonely.close()


def test_a_host_name_that_resolves_to_a_loopback_address_gets_no_network_bell() -> None:
    assert host_address("localhost") is None
    assert host_address("no-such-host.invalid") is None


def test_backoff_polls_closely_while_a_collective_is_in_flight(
    bells: tuple[Doorbell, Doorbell],
) -> None:
    """A collective moves only when its rank calls MPI and rings no bell: however far the
    backoff had gone, its sleeps stay within COLLECTIVE_SLEEP_MAX_S while one is in flight."""
    for bell in (None, bells[1]):
        backoff = Backoff(min_s=1e-4, max_s=2e-3, doorbell=bell, wait_s=30.0)
        while backoff._next < backoff.max_s:
            backoff.sleep()
        for _ in range(20):
            backoff.sleep(may_wait=True, collective=True)  # never the 30 s wait
            assert backoff._next <= COLLECTIVE_SLEEP_MAX_S
        if bell is not None:
            assert bell.wakeups == 0
