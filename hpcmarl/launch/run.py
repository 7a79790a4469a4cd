"""Starting a job on this process: agree on the job, build this rank's roles, run them, exit.

The same code runs under `mpirun` and as one plain process (every role co-located, no MPI).
Rank 0 parses the job and probes the environment; a user error there is broadcast so that
every rank exits with the same one-line message instead of waiting for a rank that gave up.
An exception on any rank prints one line naming rank, role and cause, then aborts the world.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..comm.doorbell import make_doorbell
from ..comm.failures import die_seen, exit_now, is_peer_failure, ulfm_enabled
from ..comm.progress import Backoff
from ..comm.transport import LocalTransport, MpiTransport
from ..config.loader import JobSource, job_from_dict, job_to_dict, load_job
from ..config.schema import JobConfig
from ..core import Role
from ..errors import ReportedFailure, UserError
from ..loggers import check_loggers
from ..metrics import run_dir_line
from ..replay.offline import plan_offline
from ..roles.commander import EXIT_CHECKPOINTED
from ..testing import faults
from . import signals
from .build import (
    EnvSpec,
    build_roles,
    check_storage_topology,
    item_specs,
    probe_env,
    storage_form,
    time_limit_line,
)
from .hosts import check_cuda_hosts, check_hosts, dataset_readers
from .losses import (
    EXIT_RANK_LOST,
    LeaveQuietly,
    PeerCrashed,
    RankLost,
    fault_tolerance_line,
    leave_lost_at_start,
    note_crash,
    on_ranks_lost,
    survivable_rank,
)
from .lost_rank import write_rank_map
from .memory import Node, check_memory, gather_nodes, storage_line
from .output import check_streams_writable
from .plan import Wiring, resolve_wiring
from .preflight import (
    check_allreduce,
    claim_run_dir,
    create_run_dir,
    run_dir_of,
    unmake_run_dir,
)
from .profiling import profiled
from .respawn_run import leave_worlds, replace_lost, replacing_agreed
from .resume import find_resume_point, restore_roles
from .run_lock import abandon_run_dir, release_run_dir
from .signal_lead import check_signal_lead
from .topology import Topology, build_topology

ABORT_DRAIN_S = 0.3
"""Seconds between a failed rank's line and its `MPI_Abort`, so the launcher forwards the line."""
WRITER_WAIT_S = 60.0
"""Longest a failed single process waits for a checkpoint file in flight (`close_roles`)."""
MPI_ENV_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    """True under mpirun/mpiexec/srun: then MPI is initialised, otherwise never imported."""
    return any(var in os.environ for var in MPI_ENV_VARS)


@dataclass
class Plan:
    """What every rank agrees on before building roles."""

    cfg: JobConfig
    spec: EnvSpec
    topology: Topology
    run_dir: str
    resume_id: str | None = None
    made_dirs: tuple[str, ...] = ()
    """The directories rank 0 made for the run directory, deepest first: removed again when
    another host refuses it (`hosts.check_hosts`), so that a refused job leaves nothing."""
    worlds: list[Any] = field(default_factory=list)
    """The worlds merged with replacements of lost ranks (respawn_run.py), oldest first."""
    respawns: dict[str, int] = field(default_factory=dict)
    """How many times each role was replaced (respawn_run.py): its episode ids' generation."""
    replacing: bool = True
    """False once the ranks left agreed not to replace lost collectors, the stop having begun
    (respawn_run.replacing_agreed): then they never do again."""

    @functools.cached_property
    def wiring(self) -> Wiring:
        """Every role instance's routes, resolved once: the roles are built from them and the
        printed wiring lists them."""
        return resolve_wiring(self.cfg, self.topology)

    def wiring_text(self) -> str:
        """What rank 0 prints at start: a line per host or rank, or with `runtime.print_wiring:
        full` the groups, routes and message table as well."""
        if self.cfg.runtime.print_wiring == "full":
            return self.topology.format(self.wiring.lines())
        return self.topology.summary()


def run_job(job: JobSource, overrides: Sequence[str]) -> int:
    """Entry point of `python -m hpcmarl train`; returns the process exit code."""
    return launch_job(job, overrides).code


@dataclass(frozen=True)
class Ended:
    """How the job ended on this rank, for `hpcmarl.train`."""

    code: int
    """The exit code `python -m hpcmarl` would end with."""
    run_dir: str | None
    """The run directory, once the ranks agreed on one (None: refused before)."""
    refusal: str = ""
    """Why the job was refused before it started (exit code 2), as printed."""


def launch_job(job: JobSource, overrides: Sequence[str]) -> Ended:
    """Run the job on this rank: `python -m hpcmarl` and `hpcmarl.train` both come here."""
    faults.strike_before_mpi()
    comm = world_comm()
    rank = comm.Get_rank() if comm is not None else 0
    topology = None
    try:
        nodes = gather_nodes(comm)
        outcome = plan_on_rank0(job, overrides, nodes) if rank == 0 else None
        if comm is not None:
            outcome = comm.bcast(outcome, root=0)
        assert outcome is not None
        if outcome[0] == "error":
            if rank == 0:
                print(f"hpcmarl: error: {outcome[1]}", file=sys.stderr, flush=True)
            return Ended(UserError.exit_code, None, outcome[1])
        plan = expand_plan(outcome[1], nodes)
        topology = plan.topology
        if rank == 0:
            write_rank_map(plan.topology)  # for the launcher, should a rank be killed
        if refusal := refused_by_a_host(plan, nodes, comm, rank):
            return Ended(UserError.exit_code, None, refusal)
        if rank == 0:
            print(run_dir_line(plan.run_dir), flush=True)
    except Exception as err:  # noqa: BLE001 - a rank that fails before the loop ends the world
        abandon_run_dir()
        if lost_a_peer(err, comm):
            leave_lost_at_start(comm, rank, topology)
        fail_rank(rank, None, err, None, comm)
        return Ended(1, None)
    try:
        return Ended(run_rank(plan, comm, rank), plan.run_dir)
    finally:
        release_run_dir()  # rank 0's lock (run_lock.py); a no-op on the other ranks


def world_comm() -> Any:
    if not launched_by_mpi():
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD


def plan_on_rank0(job: JobSource, overrides: Sequence[str], nodes: list[Node]) -> tuple:
    """Parse, probe, place and check on rank 0 (`nodes`: each rank's host and free memory); a
    user error becomes a message for every rank. The run directory is created last, so that a
    refused job writes nothing."""
    try:
        check_streams_writable()
        cfg = load_job(job, overrides)
        check_loggers(cfg.runtime.loggers)
        tolerance = fault_tolerance_line(cfg, launched_by_mpi())
        spec = probe_env(cfg)
        topology = place(cfg, spec, nodes)
        check_storage_topology(cfg, topology)
        check_allreduce(cfg, topology)
        check_cuda_hosts(cfg.learner.device, topology, nodes)
        check_memory(cfg, spec, topology, nodes)
        if cfg.offline.dataset:  # what the saved job names must not depend on the cwd
            cfg.offline.dataset = os.path.abspath(cfg.offline.dataset)
        run_dir = cfg.runtime.run_dir = run_dir_of(cfg)
        claim_run_dir(run_dir)
        resume_id = find_resume_point(cfg, run_dir)
        offline = plan_offline(cfg, spec, fresh=resume_id is None)
        made = create_run_dir(cfg, run_dir)
        lead = check_signal_lead(cfg, spec, topology, nodes, run_dir)
        storage = storage_line(item_specs(cfg, spec), storage_form(cfg))
        for line in (offline, storage, lead, time_limit_line(cfg, spec), tolerance):
            if line:
                print(line, flush=True)
    except UserError as err:
        abandon_run_dir()
        return ("error", err.message())
    return ("ok", (job_to_dict(cfg), spec, run_dir, resume_id, tuple(made)))


def expand_plan(payload: tuple, nodes: list[Node]) -> Plan:
    cfg_dict, spec, run_dir, resume_id, made = payload
    cfg = job_from_dict(cfg_dict)
    return Plan(cfg, spec, place(cfg, spec, nodes), run_dir, resume_id, made)


def place(cfg: JobConfig, spec: EnvSpec, nodes: list[Node]) -> Topology:
    """The job's roles on the ranks of `nodes`: rank 0's checks (the memory and GPUs of each
    learner's host) and every rank's plan place them the same way, from the same census: by
    host, learners on the hosts' GPUs unless they train on the CPU (`learner.device=cpu`)."""
    census = [Node(*node) for node in nodes]
    gpus: dict[str, int] = {}
    for node in census if cfg.learner.device != "cpu" else []:
        gpus[node.host] = max(gpus.get(node.host, 0), node.gpus)
    hosts = [node.host for node in census]
    return build_topology(len(nodes), cfg.topology, spec.training_groups(), hosts, gpus)


def refused_by_a_host(plan: Plan, nodes: list[Node], comm: Any, rank: int) -> str:
    """What rank 0 cannot check alone (hosts.py), on every rank together: the run directory
    seen and written from every host, the dataset read where replay shards read it. A refusal
    is one line from rank 0, which removes the run directory it made, and exit 2 everywhere;
    the refusal is returned ('' when none)."""
    dataset = plan.cfg.offline.dataset if plan.resume_id is None else ""
    readers = set(dataset_readers(plan.topology, nodes)) if dataset else set()
    verdict = check_hosts(comm, rank, nodes, plan.run_dir, dataset, readers)
    if verdict is None:
        return ""
    if rank == 0:
        unmake_run_dir(plan.run_dir, plan.made_dirs)
        print(f"hpcmarl: error: {verdict}", file=sys.stderr, flush=True)
    return verdict


def run_rank(plan: Plan, comm: Any, rank: int) -> int:
    """Build this rank's roles and poll them until all have finished."""
    current: list[Role | None] = [None]
    roles: list[Role] = []
    building = True
    try:
        configure_process(plan.cfg, rank)
        names = plan.topology.roles_on(rank)
        faults.strike_at_start(names, [plan.topology.kind_of[n] for n in names])
        transport, group_comm = make_transport(plan, comm)
        stopped = signals.stopped_before_start(comm, plan.run_dir)
        if stopped:
            if rank == 0:
                print(stopped, run_dir_line(plan.run_dir), sep="\n", file=sys.stderr, flush=True)
            return EXIT_CHECKPOINTED
        roles = build_roles(
            plan.cfg, plan.spec, plan.topology, transport, group_comm, plan.run_dir, plan.wiring
        )
        if rank == 0:
            print(plan.wiring_text(), flush=True)
        if plan.resume_id is not None:
            shards = plan.topology.names("replay_shard")
            restore_roles(
                roles, plan.run_dir, plan.resume_id, shards, plan.cfg.replay.table_capacity
            )
        building = False
        with profiled(rank, lambda: [role.name for role in roles]):
            poll_until_finished(roles, transport, plan, current)
        transport.finish(plan.cfg.runtime.shutdown_timeout_s)
        close_roles(roles)
        if isinstance(transport, MpiTransport) and transport.lost_any:
            leave_worlds(plan.worlds)  # with the replacements, which end through MPI_Finalize
            exit_now(exit_code_of(roles))  # MPI_Finalize hangs once a rank is gone
        return exit_code_of(roles)
    except Exception as err:  # noqa: BLE001 - any failure must end the whole world
        for role in roles:  # what the commander's loggers end their runs with
            role.exit_code = role.exit_code or 1
        close_roles(roles, wait_s=WRITER_WAIT_S if comm is None else 0.0)
        if building and isinstance(err, UserError):
            refuse_on_rank(rank, err, comm)
            return UserError.exit_code
        if building and lost_a_peer(err, comm):
            release_run_dir()
            leave_lost_at_start(comm, rank, plan.topology)
        tolerated = comm is not None and ulfm_enabled()
        fault_tolerance = plan.cfg.runtime.fault_tolerance
        survivable = tolerated and survivable_rank(plan.topology, fault_tolerance, rank)
        fail_rank(rank, current[0], err, plan.run_dir, comm, survivable=survivable)
        return 1


def configure_process(cfg: JobConfig, rank: int) -> None:
    """One torch thread per rank by default, torch seeded per rank, signals as flags."""
    import torch

    torch.set_num_threads(cfg.runtime.torch_threads)
    torch.manual_seed(cfg.seed * 7_919 + rank)
    Role.heartbeat_interval_s = cfg.runtime.heartbeat_interval_s
    signals.install()


def make_transport(plan: Plan, comm: Any) -> tuple[LocalTransport, Any]:
    topology = plan.topology
    if comm is None:
        return LocalTransport(topology.rank_of, 0), None
    from mpi4py import MPI

    color = topology.group_color(comm.Get_rank())
    group_comm = comm.Split(MPI.UNDEFINED if color is None else color, comm.Get_rank())
    doorbell = make_doorbell(comm, plan.cfg.runtime.idle_wait_s)
    return MpiTransport(topology.rank_of, comm, doorbell), group_comm


def poll_until_finished(
    roles: list[Role], transport: LocalTransport, plan: Plan, current: list[Role | None]
) -> None:
    """The rank's loop: poll every live role; sleep a little when none made progress, and
    wait for a peer's message (doorbell.py) when nothing in flight needs polling. A peer rank
    that died (under Open MPI's fault tolerance) is the roles' news, or the end (losses.py)."""
    cfg = plan.cfg
    lost_ranks = getattr(transport, "take_lost_ranks", None)
    backoff = Backoff(
        max_s=cfg.runtime.idle_sleep_max_s,
        doorbell=transport.doorbell,
        wait_s=cfg.runtime.idle_wait_s,
    )
    for role in roles:
        current[0] = role
        role.start()
    relays = not any(role.kind == "commander" for role in roles)
    respawns = cfg.runtime.fault_tolerance == "collectors" and cfg.runtime.respawn_collectors
    while not all(role.finished for role in roles):
        if relays:
            signals.relay_to_commander(transport.rank)
        progressed = transport.poll()
        if lost_ranks is not None and (lost := lost_ranks()):
            current[0] = roles[0]  # the rank's first role names it in a failure line
            every_lost = transport.failures.known  # type: ignore[attr-defined]
            tolerance = cfg.runtime.fault_tolerance
            on_ranks_lost(
                lost, every_lost, roles, plan.topology, tolerance, transport.rank, plan.run_dir
            )
            # only collectors were lost, or on_ranks_lost ended the job
            if respawns and replacing_agreed(transport, plan, roles):  # type: ignore[arg-type]
                plan.worlds.append(replace_lost(transport, plan, roles))  # type: ignore[arg-type]
        for role in roles:
            if not role.finished:
                current[0] = role
                faults.maybe_inject(role)
                progressed = role.poll() or progressed
        current[0] = None
        if progressed:
            backoff.reset()
        else:
            in_flight = transport.outstanding() > 0 or any(role.in_flight() for role in roles)
            collective = any(role.collective_in_flight() for role in roles)
            backoff.sleep(may_wait=not in_flight, collective=collective)


def close_roles(roles: list[Role], wait_s: float = 0.0) -> None:
    """Close every role's files; one that fails to close must not keep the rest open, nor
    (on the failure path) stop this rank from ending the world.

    With `wait_s`, a checkpoint file still being written is waited for first (at most that
    long): in one process, a writer thread cut off by the interpreter's exit holds h5py's lock
    and the exit hangs. Under MPI, `MPI_Abort` ends the process without that exit."""
    for role in roles:
        if wait_s and role.checkpoint_writer is not None:
            role.checkpoint_writer.wait(wait_s)
        try:
            role.close()
        except Exception as err:  # noqa: BLE001 - report and go on to the next role
            print(f"hpcmarl: {role.name} could not close its files: {err}", file=sys.stderr)


def exit_code_of(roles: list[Role]) -> int:
    codes = [getattr(role, "exit_code", 0) for role in roles]
    return max(codes, default=0)


def refuse_on_rank(rank: int, err: UserError, comm: Any) -> None:
    """A user error that only this rank met while building its roles (its peers passed rank
    0's checks): the one-line message, then the world ends with exit code 2."""
    print(f"hpcmarl: error: rank {rank}: {err.message()}", file=sys.stderr, flush=True)
    if comm is not None:
        time.sleep(ABORT_DRAIN_S)  # as in fail_rank: let the launcher forward the line
        comm.Abort(UserError.exit_code)


def lost_a_peer(err: BaseException, comm: Any) -> bool:
    """Under fault tolerance, whether an MPI call failed because a peer rank died."""
    return comm is not None and ulfm_enabled() and is_peer_failure(err)


def quiet_failure(err: BaseException, comm: Any) -> bool:
    """Under fault tolerance, a rank that ends because a peer died says nothing: the lowest
    rank left names the loss (losses.py), once."""
    return comm is not None and (isinstance(err, LeaveQuietly) or is_peer_failure(err))


def write_traceback(log: str, err: BaseException) -> str:
    """The traceback into `log` (a reported failure's, as its role's rank sent it); the path,
    or why there is none."""
    try:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as fh:
            if isinstance(err, ReportedFailure):
                fh.write(err.traceback_text or err.cause)
            else:
                traceback.print_exception(err, file=fh)
    except OSError:
        return "(could not be written)"
    return log


def fail_rank(
    rank: int,
    role: Role | None,
    err: BaseException,
    run_dir: str | None,
    comm: Any,
    survivable: bool = False,
) -> None:
    """One line naming rank, role and cause; the traceback to a file; then end the world.

    Before the plan there is no run directory yet (it is created last): the traceback goes to
    the temporary directory then, never into the working directory. Once the run directory
    exists, the next line names it, as at the end of every run. A `survivable` rank (only
    collectors, under fault tolerance) ends only itself: its line says the run goes on. A
    failure another role reported here (`ReportedFailure`) is named as that role's own."""
    where, named, what = role.name if role is not None else "startup", rank, ""
    if isinstance(err, ReportedFailure):
        where, named, what = err.role, err.rank, err.cause
    if run_dir is None:
        name = f"hpcmarl-startup-{os.getpid()}-rank{rank}.traceback"
        log = os.path.join(tempfile.gettempdir(), name)
    else:
        log = os.path.join(run_dir, "logs", f"rank{named}.traceback")
    if not quiet_failure(err, comm):  # a quiet rank's file would hide the failed rank's
        log = write_traceback(log, err)
    what = what or f"{type(err).__name__}: {err}"
    cause = f"rank {named} ({where}): {what} [traceback: {log}]"
    if survivable:
        ending = [
            f"hpcmarl: lost: {cause}; the run goes on without this rank "
            "(runtime.fault_tolerance=collectors)"
        ]
    else:
        ending = [f"hpcmarl: failed: {cause}"]
        if run_dir is not None:
            ending.append(run_dir_line(run_dir))
    if not quiet_failure(err, comm):
        print(*ending, sep="\n", file=sys.stderr, flush=True)
    if comm is not None and ulfm_enabled():
        # Under fault tolerance MPI_Abort left ranks running (losses.py). A rank that ends
        # because the job does exits 1 (mpirun's exit code comes from these: it was 0 when
        # every rank died of a signal); a rank that fails first dies of SIGKILL, the one
        # death its peers hear of (then a collector's is survived, any other ends the job),
        # after its crash note: a crash ends the job with 1, a lost rank with 76 (requeued).
        time.sleep(ABORT_DRAIN_S)
        if isinstance(err, PeerCrashed):
            exit_now(1)
        if isinstance(err, (RankLost, LeaveQuietly)):
            exit_now(EXIT_RANK_LOST)
        if quiet_failure(err, comm):
            exit_now(1)
        note_crash(run_dir, rank)
        die_seen()
    if comm is not None:
        # The launcher forwards our stderr through a pipe; MPICH's tears the job down on
        # Abort and once dropped the line still in that pipe. A moment to drain it first.
        time.sleep(ABORT_DRAIN_S)
        comm.Abort(1)
