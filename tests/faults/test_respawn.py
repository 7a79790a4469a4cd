"""A lost rank replaced by a spawned one (comm/respawn.py, `MpiTransport.rebind`).

The survivors of a world that lost a rank shrink it, spawn a replacement and merge with it;
their transports then reach the replacement under the lost rank's role, and each other under
their new ranks, and still deliver what was sent on the old world before (hpcmarl/testing/
respawn_world.py checks every message's bytes and sender), and drop what goes to a lost role
that was not replaced; a replacement takes part in later rounds like any survivor. The run of
a job does not use this yet: its roles are not rebound (docs/failure-modes.md).
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


def survivor_lines(ranks: int, lose: str, replace: int) -> int:
    """How many ranks time a respawn: in each round, those alive but not lost in it."""
    alive, lines = ranks, 0
    for lost in lose.split("/"):
        count = len(lost.split(","))
        lines += alive - count
        alive -= count - min(replace, count)
    return lines


@pytest.mark.parametrize(
    ("ranks", "lose", "replace"),
    [(4, "2", 1), (4, "0", 1), (8, "2,5,6", 2), (6, "2/0,5/3", 2)],
)
def test_lost_ranks_are_replaced_and_every_message_arrives(
    ranks: int, lose: str, replace: int
) -> None:
    """Rank 0 lost: the spawn's root is then the first survivor. Three lost at once, two
    replaced: messages to the third's role are dropped. Three rounds: a replacement then
    takes part in the next respawns, and rank 0's replacement (merged after the survivors)
    loses its place as the spawn's root."""
    args = ["-m", "hpcmarl.testing.respawn_world", "--lose", lose, "--replace", str(replace)]
    result = run_mpi(ranks, args, timeout=120, env={"HPCMARL_FAULT_TOLERANCE": "collectors"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    timed = sum("shrink, spawn and merge took" in line for line in lines)
    assert timed == survivor_lines(ranks, lose, replace), lines
    timings = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted(t["round"] for t in timings) == list(range(len(lose.split("/"))))
    for timing in timings:
        print(f"round {timing['round']}: respawn {timing['respawn_s']} s, ", end="")
        print(f"replacements heard {timing['to_first_s']} s")
        assert timing["to_first_s"] >= timing["respawn_s"] > 0
