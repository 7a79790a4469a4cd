"""The transport under real mpirun: bulk and control round trips, in order, byte-equal."""

from __future__ import annotations

import pytest

from .conftest import ROOT, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi" / "scripts" / "transport_roundtrip.py")


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_round_trip_is_byte_equal_and_ordered(ranks: int) -> None:
    result = run_mpi(ranks, [SCRIPT], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok") == ranks


@pytest.mark.mpi
def test_huge_arrays_travel_in_chunks() -> None:
    # A lowered chunk size makes the 3 MB array travel in many pieces, as > 2 GiB ones would.
    result = run_mpi(2, [SCRIPT], timeout=120, env={"HPCMARL_CHUNK_BYTES": "65536"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok") == 2


@pytest.mark.mpi
def test_refilled_staging_never_corrupts_messages_in_flight() -> None:
    script = str(ROOT / "tests" / "mpi" / "scripts" / "staging_digests.py")
    result = run_mpi(2, [script], timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok") == 2
