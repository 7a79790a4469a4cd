"""Replacing a lost collector rank during a run (`runtime.respawn_collectors`).

Every rank left enters `comm.respawn.respawn` together once it heard of a collector-only loss:
`Shrink` gives every survivor the same set of ranks left, so the spawn count (one new rank per
rank lost) and the map of old ranks to new agree everywhere, whichever losses each rank had
heard of. The survivors then tell the replacements the job (rank 0 broadcasts the plan and the
renumbered topology), rebind their transports to the merged world, and tell their roles that
the lost collectors are back (`Role.on_peers_back`): the commander hands them tasks again, the
replay shards give them their credits. A replacement runs `python -m hpcmarl.launch.respawn_run
RUN_DIR` (the run directory names the job's processes, as `testing.ranks.rank_pids` finds
them), builds only the lost rank's roles and polls them like any rank.

Rank numbers change with the merged world; only the transport and the loss handling use them
(roles address each other by name), so `Plan.topology` is replaced by the renumbered one. The
launcher's rank map (`lost_rank.py`) keeps the job's first numbering, which is mpirun's.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from typing import Any

from ..comm.failures import exit_now
from ..comm.respawn import Respawned, join_parents, release, respawn
from ..comm.transport import GONE, REPLACING, MpiTransport
from ..config.loader import job_from_dict, job_to_dict
from ..core import Role
from .losses import lost_roles, on_ranks_lost
from .topology import Topology

REPLACEMENT = "hpcmarl.launch.respawn_run"
ASK_TIMEOUT_S = 120.0
"""How long the ranks left have to agree on a replacement: each joins once its loop hears of
the loss, or once its roles finish; one that did neither in that time is stuck, and the job
ends (`replacing_agreed`)."""


def replacing_agreed(transport: MpiTransport, plan: Any, roles: list[Role]) -> bool:
    """Whether every rank left agrees to replace the lost collectors now, which takes every
    one of them (`respawn` is collective). Once the stop has begun no rank asks again: a
    replacement would have nothing to do, and a rank that finished waits in the closing
    agreement (`MpiTransport.finish`) instead of a spawn. The ask is that same agreement:
    `REPLACING` from every rank is a yes; a rank whose roles stop the run gives none, and a
    finished rank gives `CLOSING` (it agrees again, the others go on and finish)."""
    if not plan.replacing:
        return False
    wanted = all(role.takes_replacements() for role in roles if not role.finished)
    agreed = transport.agree(REPLACING if wanted else 0, ASK_TIMEOUT_S)
    if agreed is None:
        raise RuntimeError(
            f"the ranks left did not agree on replacing a lost collector in {ASK_TIMEOUT_S:.0f} s"
        )
    if agreed & REPLACING:
        return True
    plan.replacing = False
    if transport.rank == 0:
        print("hpcmarl: lost collectors are not replaced: the run is stopping", flush=True)
    return False


def renumbered(topology: Topology, world: Respawned, hosts: list[str]) -> Topology:
    """`topology` in the merged world: each survivor's roles at its new rank, each lost rank's
    roles at its replacement's (lost ranks in order, replacements in spawn order), a role lost
    earlier and never replaced at `GONE`."""
    lost = sorted(set(range(topology.world_size)) - set(world.new_rank))
    replaced = dict(zip(lost, world.spawned, strict=True))
    rank_of = {
        name: world.new_rank.get(rank, replaced.get(rank, GONE))
        for name, rank in topology.rank_of.items()
    }
    return dataclasses.replace(topology, world_size=len(hosts), rank_of=rank_of, hosts=list(hosts))


def replace_lost(transport: MpiTransport, plan: Any, roles: list[Role]) -> Respawned:
    """On every survivor, together: spawn a rank for each one lost, hand the replacements the
    job, send on the merged world from now on, and tell the roles their lost peers are back.
    A loss this rank had not heard of yet is heard first (`on_ranks_lost`), as if it had."""
    old = plan.topology
    heard = set(transport.failures.known) if transport.failures is not None else set()
    transport.forget_lost()  # no receive from a lost rank left posted on the world shrunk
    world = respawn(transport.comm, None, ["-m", REPLACEMENT, plan.run_dir])
    lost = set(range(old.world_size)) - set(world.new_rank)
    unheard = lost - heard
    if unheard:
        tolerance = plan.cfg.runtime.fault_tolerance
        on_ranks_lost(unheard, lost, roles, old, tolerance, transport.rank, plan.run_dir)
    hosts = world.comm.allgather(socket.gethostname())
    topology = renumbered(old, world, hosts)
    back = set(lost_roles(old, lost))
    for name in back:
        plan.respawns[name] = plan.respawns.get(name, 0) + 1
    payload = (job_to_dict(plan.cfg), plan.spec, plan.run_dir, topology, plan.respawns)
    world.comm.bcast(payload if world.comm.Get_rank() == 0 else None, root=0)
    transport.rebind(world.comm, topology.rank_of, world.new_rank)
    plan.topology = topology
    for role in roles:
        if not role.finished:
            role.on_peers_back(back)
    return world


def leave_worlds(worlds: list[Respawned]) -> None:
    """Free the merged worlds, the last one released with its replacements, collectively (none
    of its members died, or the job would have ended): they can then end through
    `MPI_Finalize`, which mpirun needs to exit 0. Earlier intercommunicators are left to the
    process's exit (a rank of each is gone)."""
    for world in worlds[:-1]:
        world.comm.Free()
    if worlds:
        release(worlds[-1])


def run_replacement() -> int:
    """A replacement's life: join the survivors, learn the job, run the lost rank's roles, and
    end through `MPI_Finalize` after freeing the merged world (`release`); a replacement that
    took part in a later respawn leaves with `exit_now`, as survivors do."""
    os.environ.pop("HPCMARL_FAULT", None)  # testing.faults strikes the job's first ranks only
    world = join_parents()
    if world is None:
        print("hpcmarl: error: respawn_run is started by a running job's ranks", file=sys.stderr)
        return 2
    rank = world.comm.Get_rank()
    try:
        world.comm.allgather(socket.gethostname())
        cfg_dict, spec, run_dir, topology, respawns = world.comm.bcast(None, root=0)
        # Imported once the survivors go on: torch alone takes seconds on a loaded host, and
        # they wait in the spawn until this process has joined.
        from ..roles.collector import Collector
        from .build import build_roles
        from .run import Plan, close_roles, configure_process, exit_code_of, poll_until_finished

        plan = Plan(job_from_dict(cfg_dict), spec, topology, run_dir, worlds=[world])
        plan.respawns = respawns
        configure_process(plan.cfg, rank)
        transport = MpiTransport(topology.rank_of, world.comm)
        roles = build_roles(plan.cfg, spec, topology, transport, None, run_dir, plan.wiring)
        for role in roles:
            if isinstance(role, Collector):
                role.episodes.rebase(respawns[role.name])
        current: list[Role | None] = [None]
        poll_until_finished(roles, transport, plan, current)
        transport.finish(plan.cfg.runtime.shutdown_timeout_s)
        close_roles(roles)
        code = exit_code_of(roles)
    except BaseException as err:  # noqa: BLE001 - MPI_Finalize would hang: say why, then leave
        names = ", ".join(topology.roles_on(rank)) if "topology" in locals() else "replacement"
        print(f"hpcmarl: failed: rank {rank} ({names}): {err!r}", file=sys.stderr, flush=True)
        exit_now(1)
    leave_worlds(plan.worlds)
    if len(plan.worlds) > 1:
        exit_now(code)  # a later respawn lost a rank of the world it joined
    return code


if __name__ == "__main__":
    sys.exit(run_replacement())
