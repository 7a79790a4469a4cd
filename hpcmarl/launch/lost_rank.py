"""Naming a rank the job lost to a signal: the launcher's half of "one line per failure".

A rank killed from outside (`kill -9`, the kernel's OOM killer) or by a crash in native code
cannot print hpcmarl's failure line itself, and Open MPI then ends every other rank at once, so
no survivor can print it either. Only the launcher sees the loss: Open MPI's mpirun says
"process rank 5 with PID 1234 on node hpc2 exited on signal 9" on its stderr. So
`tools/mpirun.sh` passes mpirun's stderr through `watch`, which forwards every byte unchanged as
it comes and notes that message; when mpirun has failed, `report` turns the note into the one
line, with the roles and host that rank 0 wrote at start into the rank map
(`HPCMARL_RANK_MAP`, which `tools/mpirun.sh` sets):

    hpcmarl: failed: rank 5 (collector1) on host hpc2, pid 1234: killed by signal 9 (SIGKILL) ...

MPICH's mpiexec names no rank (and prints its report on stdout); there `report` reads the
signal from its exit code and says only that a rank died of it. No line is added when a rank
already printed hpcmarl's own failure line: that one names the cause.

Standard library only, and run by path (`python hpcmarl/launch/lost_rank.py`), so that the
launcher starts it in milliseconds and needs neither hpcmarl's imports nor its install.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .topology import Topology

FAILED_PREFIX = "hpcmarl: failed:"
OPEN_MPI_LOSS = re.compile(
    r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)"
)
"""Open MPI 4 and 5 (`mpirun noticed that ...`, `prterun noticed that ...`), wrapped at any
space: it is matched on the text with runs of white space made one space."""
OPEN_MPI_ABORT = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) calling \"?abort")
"""Open MPI's report when a rank aborted first: a peer that saw its socket to a killed rank close
(`MPI_ERRORS_ARE_FATAL`) can win the race against the report of the killed rank itself."""
WINDOW_CHARS = 4096
"""How much of the latest stderr `watch` keeps to match a message cut across reads."""
RANK_MAP_ENV = "HPCMARL_RANK_MAP"


@dataclass
class Loss:
    """What `watch` saw on mpirun's stderr."""

    rank: int | None = None
    pid: int | None = None
    node: str | None = None
    signum: int | None = None
    lost_peer: bool = False
    """The rank named aborted after its connection to another rank closed (Socket closed)."""
    failed_line: bool = False
    """A rank printed hpcmarl's own failure line: it names the cause, so no second one."""
    mid_line: bool = False
    """The stream ended inside a line (Open MPI ends some of its reports with a NUL byte): the
    failure line then starts a new one, so that it stays a line of its own."""


class StderrWatch:
    """Notes the first lost rank and any hpcmarl failure line in a stream read in chunks."""

    def __init__(self) -> None:
        self.loss = Loss()
        self._window = ""

    def feed(self, text: str) -> None:
        if not text:
            return
        self.loss.mid_line = not text.endswith("\n")
        self._window = (self._window + text)[-WINDOW_CHARS:]
        if FAILED_PREFIX in self._window:
            self.loss.failed_line = True
        if self.loss.signum is None:
            text = " ".join(self._window.split())
            found = OPEN_MPI_LOSS.search(text)
            if found:
                rank, pid, node, signum = found.groups()
                self.loss.rank, self.loss.pid, self.loss.node = int(rank), int(pid), node
                self.loss.signum, self.loss.lost_peer = int(signum), False
            elif self.loss.rank is None and "Socket closed" in text:
                aborted = OPEN_MPI_ABORT.search(text)
                if aborted:
                    rank, pid, node = aborted.groups()
                    self.loss.rank, self.loss.node = int(rank), node
                    self.loss.lost_peer = True


def write_rank_map(topology: Topology) -> None:
    """Each rank's host and roles into the launcher's rank map, when it asked for one: a line
    `rank<TAB>host<TAB>role,role` per rank, written to a temporary name and renamed, so the
    launcher never reads half a map. Never fails the job: without a map the line it prints
    names the rank and Open MPI's node, not the roles."""
    from .topology import name_spans  # roles as the wiring prints them (collector3-4)

    path = os.environ.get(RANK_MAP_ENV)
    if not path or not topology.hosts:
        return
    try:
        with open(f"{path}.tmp", "w") as fh:
            for rank, host in enumerate(topology.hosts):
                roles = ",".join(name_spans(topology.roles_on(rank)))
                fh.write(f"{rank}\t{host}\t{roles}\n")
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass


def read_rank_map(path: str | None) -> dict[int, tuple[str, list[str]]]:
    """rank -> (host, roles) from `write_rank_map`'s file; empty when there is none (the job
    died before rank 0 wrote it, or rank 0 runs where the launcher cannot read)."""
    ranks: dict[int, tuple[str, list[str]]] = {}
    try:
        with open(path or "") as fh:
            for line in fh:
                rank, host, roles = line.rstrip("\n").split("\t")
                ranks[int(rank)] = (host, [name for name in roles.split(",") if name])
    except (OSError, ValueError):
        return {}
    return ranks


def signal_words(signum: int) -> str:
    """'killed by signal 9 (SIGKILL) ...', or 'died of signal 11 (SIGSEGV)'."""
    try:
        name = f" ({signal.Signals(signum).name})"
    except ValueError:
        name = ""
    if signum == signal.SIGKILL:
        return (
            f"killed by signal {signum}{name} from outside hpcmarl (the kernel's OOM killer? "
            "a user? the batch system?)"
        )
    return f"died of signal {signum}{name}"


def failure_line(
    loss: Loss, rank_map: dict[int, tuple[str, list[str]]], exit_code: int, open_mpi: bool
) -> str | None:
    """The one line for a job whose launcher exited with `exit_code`, or None: the job did not
    fail, a rank already said why, or nothing names a lost rank."""
    if exit_code == 0 or loss.failed_line:
        return None
    if loss.rank is not None and loss.signum is not None:
        host, roles = rank_map.get(loss.rank, (loss.node or "?", []))
        where = f" ({', '.join(roles)})" if roles else ""
        return (
            f"{FAILED_PREFIX} rank {loss.rank}{where} on host {host}, pid {loss.pid}: "
            f"{signal_words(loss.signum)}; mpirun ended every other rank"
        )
    if loss.rank is not None and loss.lost_peer:
        host, roles = rank_map.get(loss.rank, (loss.node or "?", []))
        where = f" ({', '.join(roles)})" if roles else ""
        return (
            f"{FAILED_PREFIX} rank {loss.rank}{where} on host {host} lost its connection to "
            "another rank (Open MPI: Socket closed) and aborted: a rank died (kill -9, the OOM "
            "killer) or its host went down, and Open MPI reported this rank first; mpirun "
            "ended every other rank"
        )
    if not open_mpi and exit_code in {s.value for s in signal.Signals} - {1, 2}:
        # MPICH's mpiexec exits with a lost rank's signal number and names no rank.
        return (
            f"{FAILED_PREFIX} a rank (MPICH's mpiexec names none; its BAD TERMINATION lines on "
            f"stdout name the host): {signal_words(exit_code)}; mpiexec ended every other rank"
        )
    return None


def watch(report_path: str) -> int:
    """Forward stdin to stderr byte for byte as it comes, then write what was seen to
    `report_path`. Ignores the signals a terminal or a dropped session sends (the launcher
    relays those), and a closed stderr: mpirun's stderr must never break."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    seen = StderrWatch()
    forwarding = True
    while chunk := os.read(0, 65536):
        rest = chunk
        while forwarding and rest:
            try:
                rest = rest[os.write(2, rest) :]
            except OSError:  # stderr closed or full: keep reading, or mpirun would block
                forwarding = False
        try:
            seen.feed(chunk.decode(errors="replace"))
        except Exception:  # noqa: BLE001 - a bug here must not stop the forwarding
            pass
    try:
        with open(f"{report_path}.tmp", "w") as fh:
            json.dump(asdict(seen.loss), fh)
        os.replace(f"{report_path}.tmp", report_path)
    except OSError:  # the launcher stopped waiting for it and removed its folder
        return 1
    return 0


def report(report_path: str, exit_code: int, open_mpi: bool) -> int:
    """Print the failure line for the launcher's `exit_code`, if there is one."""
    try:
        with open(report_path) as fh:
            loss = Loss(**json.load(fh))
    except (OSError, ValueError, TypeError):
        loss = Loss()
    line = failure_line(loss, read_rank_map(os.environ.get(RANK_MAP_ENV)), exit_code, open_mpi)
    if line:
        print("\n" * loss.mid_line + line, file=sys.stderr, flush=True)
    return 0


def main(argv: list[str]) -> int:
    """`watch REPORT` or `report REPORT EXIT_CODE open-mpi|other`."""
    if argv[:1] == ["watch"] and len(argv) == 2:
        return watch(argv[1])
    if argv[:1] == ["report"] and len(argv) == 4:
        return report(argv[1], int(argv[2]), argv[3] == "open-mpi")
    print(
        f"usage: {sys.argv[0]} watch REPORT | report REPORT EXIT_CODE open-mpi|other",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
