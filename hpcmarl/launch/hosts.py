"""Start-up checks that need every host: the run directory shared, the dataset and GPUs there.

Rank 0 checks the job on its own host, but a job's ranks may run on many. A run directory on a
node-local disk (/tmp, a scratch mount, a relative path under a node-local working directory)
passed rank 0's checks and the job failed only at its first checkpoint commit, minutes in, when
a role on another host wrote its file where the commander never looks. So once rank 0 has made
the run directory, one rank per host writes a probe file into it, named after its host, and
tries the offline dataset where a replay shard on that host will read it; rank 0 gathers what
each found, looks for every probe, and broadcasts one verdict, and each writer removes its own
probe. Every rank takes part in the same gather and broadcast whatever it found, so a host that
fails makes no rank wait for a message that never comes.

The GPUs need no file: each rank counted them in the census gathered at start (`Node`), so
`learner.device=cuda` is checked on rank 0 against the learners' hosts before anything is
written.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.reader import replay_files
from ..errors import ConfigError, UserError
from .memory import Node
from .topology import Topology

PROBE_PREFIX = ".probe-"
LISTED = 4
"""Hosts named in a refusal; more are counted ("and 12 more hosts")."""


@dataclass(frozen=True)
class HostReport:
    """What the probing rank of one host found there."""

    rank: int
    host: str
    probe: str
    """The probe file it wrote (or tried to), as an absolute path on its host."""
    token: str = ""
    """What it wrote into the probe: rank 0 tells its probe from a stale file by it."""
    write_error: str = ""
    """Why the probe could not be written; empty when it was."""
    unseen: bool = False
    """The run directory does not exist on this host at all."""
    dataset_error: str = ""
    """Why `offline.dataset` cannot be read here; empty when it can or is not read here."""


def probing_ranks(nodes: Sequence[Node]) -> dict[int, str]:
    """The lowest rank of each host, with its host name: the ones that probe for their host."""
    first: dict[str, int] = {}
    for rank, node in enumerate(nodes):
        first.setdefault(node.host, rank)
    return {rank: host for host, rank in first.items()}


def dataset_readers(topology: Topology, nodes: Sequence[Node]) -> dict[str, list[str]]:
    """host -> the replay shards placed there: the roles that read an offline dataset."""
    readers: dict[str, list[str]] = {}
    for name in topology.names("replay_shard"):
        readers.setdefault(nodes[topology.rank_of[name]].host, []).append(name)
    return readers


def check_hosts(
    comm: Any, rank: int, nodes: Sequence[Node], run_dir: str, dataset: str, readers: set[str]
) -> str | None:
    """Every rank calls this, in the same order: the one-line refusal every rank returns, or
    None. `dataset` (empty when none is read) must be readable on the hosts in `readers`.

    One host has nothing to check: rank 0 made the run directory and read the dataset there."""
    if comm is None or len({node.host for node in nodes}) == 1:
        return None
    host = probing_ranks(nodes).get(rank)
    report = None
    if host is not None:
        report = probe_host(run_dir, host, rank, dataset if host in readers else "")
    reports = comm.gather(report, root=0)
    verdict = judge(run_dir, [r for r in reports if r is not None], dataset) if rank == 0 else None
    verdict = comm.bcast(verdict, root=0)
    if report is not None and not report.write_error:
        remove_probe(report.probe)
    return verdict


def probe_host(run_dir: str, host: str, rank: int, dataset: str = "") -> HostReport:
    """Write this host's probe into `run_dir` and try `dataset` (if named); never raises, so
    that this rank reaches the gather whatever it found."""
    probe = os.path.abspath(os.path.join(run_dir, PROBE_PREFIX + host))
    token = f"{host} rank {rank} pid {os.getpid()}\n"
    error, unseen = "", False
    try:
        with open(probe, "w") as fh:
            fh.write(token)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        error = err.strerror or str(err)
        unseen = err.errno == errno.ENOENT
    return HostReport(rank, host, probe, token, error, unseen, dataset_error(dataset))


def dataset_error(dataset: str) -> str:
    """Why the replay files of `dataset` cannot be opened on this host ('' when they can, or
    when no dataset is named)."""
    if not dataset:
        return ""
    try:
        for path in replay_files([dataset]):
            with open(path, "rb") as fh:
                fh.read(8)
    except OSError as err:
        return f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
    except UserError as err:
        return err.cause
    return ""


def remove_probe(probe: str) -> None:
    try:
        os.unlink(probe)
    except OSError:
        pass


def judge(run_dir: str, reports: Sequence[HostReport], dataset: str) -> str | None:
    """Rank 0's verdict on every host's report: the refusal line, or None."""
    try:
        check_shared_run_dir(run_dir, reports)
        check_dataset_hosts(dataset, reports)
    except UserError as err:
        return err.message()
    return None


def check_shared_run_dir(run_dir: str, reports: Sequence[HostReport]) -> None:
    """Refuse a run directory that a host cannot see or write, or whose probe rank 0 does not
    find: that host writes into another directory of the same name (its own disk).

    The folder is listed before any probe is read: on NFS that refreshes rank 0's cached view
    of the directory, where a lookup of a name could be answered from a stale cache."""
    try:
        names = set(os.listdir(run_dir))
    except OSError:
        names = set()
    problems = []
    for report in reports:
        problem = _run_dir_problem(report, run_dir, names)
        if problem:
            problems.append(f"{report.host} {problem}")
    if problems:
        raise UserError(
            f"the run directory {os.path.abspath(run_dir)} is not shared: {_listed(problems)}",
            "put runtime.run_dir on a filesystem every node mounts (a shared home, project "
            "or parallel filesystem; not /tmp or a node-local disk), as an absolute path",
        )


def _run_dir_problem(report: HostReport, run_dir: str, names: set[str]) -> str:
    if report.unseen:
        return f"cannot see it (rank {report.rank}: {report.write_error}: {report.probe})"
    if report.write_error:
        return f"cannot write it (rank {report.rank}: {report.write_error}: {report.probe})"
    name = os.path.basename(report.probe)
    if name in names and _read(os.path.join(run_dir, name)) == report.token:
        return ""
    return f"cannot see it (rank {report.rank} wrote {report.probe}, rank 0 does not find it)"


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def check_dataset_hosts(dataset: str, reports: Sequence[HostReport]) -> None:
    """Refuse an offline dataset that a replay shard's host cannot read."""
    problems = [f"{r.host} (rank {r.rank}: {r.dataset_error})" for r in reports if r.dataset_error]
    if problems:
        raise ConfigError(
            f"offline.dataset = {dataset!r} cannot be read on the host of a replay shard: "
            f"{_listed(problems)}",
            "put the dataset on a filesystem every node mounts (or copy it to the same path "
            "on each node that hosts a replay shard)",
        )


def check_cuda_hosts(device: str, topology: Topology, nodes: Sequence[Node]) -> None:
    """Refuse `learner.device=cuda` where a learner's host has no GPU torch can use, naming
    each such host and its learners (from the census: no GPU is touched here)."""
    if device != "cuda":
        return
    lacking: dict[str, tuple[str, list[str]]] = {}
    for name in topology.names("learner"):
        rank = topology.rank_of[name]
        node = Node(*nodes[rank])
        if node.gpus <= 0:
            why = "no CUDA device visible" if node.cuda_build else "a CPU build of torch"
            lacking.setdefault(node.host, (why, []))[1].append(f"{name} on rank {rank}")
    if not lacking:
        return
    if len({node[0] for node in nodes}) == 1:
        cause = f"this node has {next(iter(lacking.values()))[0]}"
    else:
        where = [f"{host} ({why}; {', '.join(names)})" for host, (why, names) in lacking.items()]
        cause = f"a learner's host has no GPU: {_listed(where)}"
    raise ConfigError(
        f"learner.device is cuda, but {cause}",
        "set learner.device=auto or cpu, or run the learners on nodes with a GPU and a CUDA "
        "build of torch",
    )


def _listed(problems: Sequence[str]) -> str:
    shown = "; ".join(problems[:LISTED])
    more = len(problems) - LISTED
    return shown + (f"; and {more} more host{'s' * (more > 1)}" if more > 0 else "")
