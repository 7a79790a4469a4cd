"""A lost rank replaced by a spawned one (comm/respawn.py, `MpiTransport.rebind`).

The survivors of a world that lost a rank shrink it, spawn a replacement and merge with it;
their transports then reach the replacement under the lost rank's role, and each other under
their new ranks, and still deliver what was sent on the old world before (hpcmarl/testing/
respawn_world.py checks every message's bytes and sender), and drop what goes to a lost
role that was not replaced. The run of a job does not use this
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


@pytest.mark.parametrize(("ranks", "lose", "replace"), [(4, "2", 1), (4, "0", 1), (8, "2,5,6", 2)])
def test_lost_ranks_are_replaced_and_every_message_arrives(
    ranks: int, lose: str, replace: int
) -> None:
    """Rank 0 lost: the spawn's root is then the first survivor. Three lost at once, two
    replaced: messages to the third's role are dropped."""
    args = ["-m", "hpcmarl.testing.respawn_world", "--lose", lose, "--replace", str(replace)]
    result = run_mpi(ranks, args, timeout=120, env={"HPCMARL_FAULT_TOLERANCE": "collectors"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    survivors = ranks - len(lose.split(","))
    assert sum("shrink, spawn and merge took" in line for line in lines) == survivors, lines
    (timing,) = [json.loads(line) for line in lines if line.startswith("{")]
    print(f"respawn {timing['respawn_s']} s; replacements heard {timing['to_first_s']} s")
    assert timing["to_first_s"] >= timing["respawn_s"] > 0
