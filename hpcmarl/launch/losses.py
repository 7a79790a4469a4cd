"""What a rank does when its transport learns that other ranks are gone (comm/failures.py).

With `runtime.fault_tolerance: collectors` a run goes on without a rank that hosted collectors
only: each role left is told which peers are gone (`Role.on_peers_lost`) and forgets them; the
commander releases their tasks and shrinks the collector task space (DI-engine's
`notify_fail_collector_task`, `decrease_collector_task_space`). The loss of any other role (a
learner, a replay shard, a parameter server, the commander) still ends the job, with a line
naming the rank, its host and its roles: their state is not replicated anywhere, and the run
resumes from its newest checkpoint instead.

A rank that dies is not always lost: under fault tolerance a rank whose code raised leaves by
SIGKILL too (the one death its peers hear of). Such a crash would recur on resume, so it must
not end the job with the requeued exit code: before it dies, the failing rank writes a crash
note into the run directory (`logs/rankR.crashed`, holding this launch's id), and its peers
that find the note end with exit 1, which `slurm/train.sh` does not requeue.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..comm.failures import LostRanks, exit_now, ulfm_enabled
from ..config.schema import JobConfig
from ..core import Role
from ..errors import UserError
from .topology import Topology

SURVIVABLE_KINDS = frozenset({"collector"})
EXIT_RANK_LOST = 76
"""Exit code of every rank when a rank the run cannot go on without died (under fault
tolerance): `slurm/train.sh` requeues it, and the run resumes from its newest checkpoint."""


class RankLost(RuntimeError):
    """A rank the run cannot go on without is gone."""


class LeaveQuietly(RuntimeError):
    """This rank ends because the job does, and another rank says why."""


class PeerCrashed(LeaveQuietly):
    """A rank the run cannot go on without raised (its own line says what): the job ends as a
    crash, not as a loss to requeue."""


def launch_id() -> str:
    """The id every rank of this launch shares and no other launch has: PMIx's namespace,
    which Open MPI's mpirun and srun set (fault tolerance exists only under Open MPI)."""
    return os.environ.get("PMIX_NAMESPACE", "")


def crash_note(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "logs", f"rank{rank}.crashed")


def note_crash(run_dir: str | None, rank: int) -> None:
    """Say, before this rank dies, that it died of its own error: its peers read this to end
    the job as a crash (exit 1) instead of a lost rank (exit 76, requeued)."""
    if run_dir is None:
        return
    path = crash_note(run_dir, rank)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            fh.write(launch_id())
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # then its peers take it for a lost rank: a requeue, bounded by the batch script


def crashed(run_dir: str | None, ranks: set[int]) -> bool:
    """Whether every one of `ranks` died of its own error in this launch (its crash note)."""
    if run_dir is None or not ranks:
        return False
    for rank in ranks:
        try:
            with open(crash_note(run_dir, rank)) as fh:
                if fh.read() != launch_id():
                    return False  # a note left by an earlier launch of this run
        except OSError:
            return False
    return True


def fault_tolerance_line(cfg: JobConfig, under_mpi: bool) -> str:
    """The start-up line of a job that asks to survive lost collectors: whether it will.
    A deterministic run is refused: its schedule replays a fixed set of collectors."""
    if cfg.runtime.fault_tolerance != "collectors":
        return ""
    if cfg.commander.deterministic:
        raise UserError(
            "runtime.fault_tolerance=collectors cannot keep commander.deterministic's "
            "schedule, which needs every collector: set one of them back"
        )
    if not under_mpi:
        return "hpcmarl: fault tolerance: none in one process (runtime.fault_tolerance)"
    if ulfm_enabled():
        goes_on = (
            "a new rank replaces it"
            if cfg.runtime.respawn_collectors
            else "the run goes on without it"
        )
        return (
            "hpcmarl: fault tolerance: collectors (a rank hosting only collectors may die; "
            f"{goes_on})"
        )
    return (
        "hpcmarl: fault tolerance: off, so any lost rank ends the job: it needs Open MPI "
        "started with --with-ft ulfm (tools/mpirun.sh passes it to a job that sets "
        "runtime.fault_tolerance=collectors); MPICH and srun always fail fast"
    )


def lost_roles(topology: Topology, ranks: set[int]) -> list[str]:
    """The role instances the lost ranks hosted, in rank order."""
    return [name for rank in sorted(ranks) for name in topology.roles_on(rank)]


def survivable_rank(topology: Topology, fault_tolerance: str, rank: int) -> bool:
    """Whether the other ranks go on without `rank`: it hosted only collectors and the run
    tolerates their loss (its failure line must not read as the job's end)."""
    return fault_tolerance == "collectors" and all(
        topology.kind_of[name] in SURVIVABLE_KINDS for name in topology.roles_on(rank)
    )


def describe_ranks(topology: Topology, ranks: set[int]) -> str:
    """`rank 5 (collector1, collector6) on host hpc2`, for each lost rank."""
    parts = []
    for rank in sorted(ranks):
        host = f" on host {topology.hosts[rank]}" if rank < len(topology.hosts) else ""
        parts.append(f"rank {rank} ({', '.join(topology.roles_on(rank))}){host}")
    return "; ".join(parts)


def on_ranks_lost(
    ranks: set[int],
    lost: set[int],
    roles: list[Role],
    topology: Topology,
    fault_tolerance: str,
    rank: int,
    run_dir: str | None = None,
) -> None:
    """Tell this rank's roles of the loss of `ranks` (`lost`: every rank gone so far), or end
    the job when the run cannot go on.

    Under fault tolerance `MPI_Abort` did not end every rank (measured: two of eight ranks
    went on), so each rank leaves by itself: the lowest rank left raises `RankLost`, whose
    line names what was lost, and every other rank raises `LeaveQuietly`. When the ranks
    that cannot be done without crashed (their note in `run_dir`), every rank raises
    `PeerCrashed`: the crashed rank's line said why."""
    names = lost_roles(topology, ranks)
    fatal = [n for n in names if topology.kind_of[n] not in SURVIVABLE_KINDS]
    if fault_tolerance == "collectors" and not fatal:
        for role in roles:
            if not role.finished:
                role.on_peers_lost(set(names), describe_ranks(topology, ranks))
        return
    if crashed(run_dir, {topology.rank_of[name] for name in fatal}):
        raise PeerCrashed(f"{describe_ranks(topology, ranks)} failed")
    if rank != min(set(range(topology.world_size)) - lost):
        raise LeaveQuietly(f"lost {describe_ranks(topology, ranks)}")
    why = (
        "runtime.fault_tolerance is none"
        if fault_tolerance != "collectors"
        else f"{', '.join(fatal)} cannot be replaced; resume from the newest checkpoint"
    )
    raise RankLost(f"lost {describe_ranks(topology, ranks)}: {why}")


def leave_lost_at_start(comm: Any, rank: int, topology: Topology | None) -> None:
    """A rank died while the job was starting (the census, the plan's broadcast, the
    transport's set-up: collectives of every rank) and this rank's collective failed: no role
    runs yet that could go on without it, so the job ends before training. The lowest rank
    left names the loss, once; every rank exits 76, which `slurm/train.sh` requeues (nothing
    was trained, so nothing is lost). Before, every rank left silently with exit 1."""
    failures = LostRanks(comm)
    failures.refresh()
    lost = failures.known
    if rank == min(set(range(comm.Get_size())) - lost):
        if topology is not None:
            what = describe_ranks(topology, lost)
        else:
            what = ", ".join(f"rank {r}" for r in sorted(lost)) or "a rank"
        print(
            f"hpcmarl: failed: lost {what} during start-up, before training began: nothing "
            "was trained; start the job again (slurm/train.sh requeues it)",
            file=sys.stderr,
            flush=True,
        )
    exit_now(EXIT_RANK_LOST)
