"""A lost rank replaced by a spawned one (comm/respawn.py, `MpiTransport.rebind`).

The survivors of a world that lost a rank shrink it, spawn a replacement and merge with it;
their transports then reach the replacement under the lost rank's role, and each other under
their new ranks, and still deliver what was sent on the old world before (hpcmarl/testing/
respawn_world.py checks every message's bytes and sender). The run of a job does not use this
yet: its roles are not rebound (docs/failure-modes.md).
"""

from __future__ import annotations

import json

import pytest

from ..mpi.conftest import run_mpi
from .test_failures import open_mpi

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not open_mpi(), reason="respawning needs Open MPI's ULFM"),
]


@pytest.mark.parametrize("lose", [2, 0])
def test_a_lost_rank_is_replaced_and_every_message_arrives(lose: int) -> None:
    """Rank 0 lost too: the spawn's root is then the first survivor."""
    args = ["-m", "hpcmarl.testing.respawn_world", "--lose", str(lose)]
    result = run_mpi(4, args, timeout=120, env={"HPCMARL_FAULT_TOLERANCE": "collectors"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert sum("shrink, spawn and merge took" in line for line in lines) == 3, result.stdout
    (timing,) = [json.loads(line) for line in lines if line.startswith("{")]
    print(f"respawn {timing['respawn_s']} s; replacement heard {timing['to_first_s']} s")
    assert timing["to_first_s"] >= timing["respawn_s"] > 0
