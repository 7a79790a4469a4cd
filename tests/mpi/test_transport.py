"""The transport under real mpirun: bulk and control round trips, in order, byte-equal."""

from __future__ import annotations

import pytest

from .conftest import ROOT, run_mpi

SCRIPTS = ROOT / "tests" / "mpi" / "scripts"


def assert_every_rank_ok(script: str, ranks: int, timeout: float, env: dict | None = None) -> None:
    """Run `tests/mpi/scripts/SCRIPT` on `ranks` ranks: each must print "rank R: ok"."""
    result = run_mpi(ranks, [str(SCRIPTS / script)], timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok") == ranks


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_round_trip_is_byte_equal_and_ordered(ranks: int) -> None:
    assert_every_rank_ok("transport_roundtrip.py", ranks, timeout=120)


@pytest.mark.mpi
def test_a_message_up_to_the_inline_limit_is_one_mpi_message() -> None:
    assert_every_rank_ok("transport_frames.py", 2, timeout=120)


@pytest.mark.mpi
def test_huge_arrays_travel_in_chunks() -> None:
    # A lowered chunk size makes the 3 MB array travel in many pieces, as > 2 GiB ones would.
    env = {"HPCMARL_CHUNK_BYTES": "65536"}
    assert_every_rank_ok("transport_roundtrip.py", 2, timeout=120, env=env)


@pytest.mark.mpi
def test_refilled_staging_never_corrupts_messages_in_flight() -> None:
    assert_every_rank_ok("staging_digests.py", 2, timeout=180)


@pytest.mark.mpi
def test_an_idle_rank_wakes_on_its_doorbell_not_its_timeout() -> None:
    # Each waiting rank may sleep a minute; the ring of rank 0's messages must end the wait.
    assert_every_rank_ok("doorbell_wakeup.py", 3, timeout=150)


@pytest.mark.mpi
def test_a_frame_its_receiver_has_not_matched_rings_it_again() -> None:
    assert_every_rank_ok("doorbell_rings_again.py", 2, timeout=120)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_batched_credits_hold_a_fast_producer_to_its_window(ranks: int) -> None:
    assert_every_rank_ok("credit_backpressure.py", ranks, timeout=180)
