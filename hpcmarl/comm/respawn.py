"""Replacing lost ranks: the survivors spawn new ones and merge with them into one world.

A replacement collector must reach the commander, the replay shards and the parameter servers
alike, and the transport addresses every peer by its rank in one communicator. So the ranks
left do it together, under Open MPI's fault tolerance (failures.py): `Shrink` the world to the
survivors, `Spawn` the replacements over it (collective; root 0 of the survivors names the
command and where), and `Merge` the intercommunicator into one intracommunicator, the
survivors first in their old order, then the replacements. Each survivor's transport then
sends on the merged world through a map of old ranks to new (`MpiTransport.rebind`), and still
receives what was sent on the old one before. Relaying the replacement's traffic through the
commander alone (spawned from COMM_SELF) was the other way: every batch and weight pull would
cross the commander twice.

Measured (Open MPI 5.0.11 wheel, one 2-core host, `--with-ft ulfm`): `Shrink` after the loss
was acknowledged took under 3 ms and `Spawn` of one rank about 1.1 s; `Merge` 8 ms. Traps
(FACTS.md): the merged communicator is freed before the intercommunicator is disconnected
(`release`), or both sides segfault at exit; `MPI_Finalize` after a loss hangs, so the
replacement too leaves with `failures.exit_now`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Respawned:
    """The world after a respawn, as one rank sees it."""

    comm: Any
    """The merged intracommunicator: survivors (in their old order), then the replacements."""
    intercomm: Any
    """The spawn's intercommunicator, disconnected after `comm` is freed (`release`)."""
    new_rank: dict[int, int] = field(default_factory=dict)
    """Each survivor's old rank -> its rank in `comm` (empty on a replacement, which had none)."""
    spawned: list[int] = field(default_factory=list)
    """The replacements' ranks in `comm`, in spawn order."""
    seconds: float = 0.0
    """Shrink, spawn and merge, as this rank timed them."""


def respawn(
    comm: Any, count: int | None, args: list[str], host: str | None = None, root: int = 0
) -> Respawned:
    """Spawn `count` processes running `python ARGS` and merge them with the survivors of
    `comm`; None spawns one per rank `Shrink` left out, a count every survivor agrees on
    although each may have heard of a different set of losses so far. Collective over every
    survivor of `comm`, which must have acknowledged the failures it knows
    (`LostRanks.refresh`); ranks that die meanwhile are left out by `Shrink`.
    `root` is the survivors' rank (in the shrunk world) whose `args` and `host` count; `host`
    (Open MPI's Info key) places the replacements, by default where the runtime finds a slot."""
    from mpi4py import MPI

    began = time.monotonic()
    shrunk = comm.Shrink()
    try:
        info = MPI.Info.Create()
        try:
            if host is not None:
                info.Set("host", host)
            if count is None:
                count = comm.Get_size() - shrunk.Get_size()
            intercomm = shrunk.Spawn(sys.executable, args, maxprocs=count, info=info, root=root)
        finally:
            info.Free()
        merged = intercomm.Merge(high=False)
        merged.Set_errhandler(MPI.ERRORS_RETURN)  # a peer's death is news, not the end
        survivors = shrunk.Get_size()
        old = MPI.Group.Translate_ranks(
            shrunk.Get_group(), list(range(survivors)), comm.Get_group()
        )
    finally:
        shrunk.Free()
    return Respawned(
        merged,
        intercomm,
        new_rank={int(rank): i for i, rank in enumerate(old)},
        spawned=list(range(survivors, survivors + count)),
        seconds=time.monotonic() - began,
    )


def join_parents() -> Respawned | None:
    """On a replacement: merge with the ranks that spawned it (None when nobody did)."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    began = time.monotonic()
    merged = parent.Merge(high=True)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    first = parent.Get_remote_size()
    spawned = list(range(first, merged.Get_size()))
    return Respawned(merged, parent, spawned=spawned, seconds=time.monotonic() - began)


def release(world: Respawned) -> None:
    """Free the merged world, then disconnect from the other side: in the other order parents
    and replacements segfault at exit (FACTS.md)."""
    world.comm.Free()
    world.intercomm.Disconnect()
