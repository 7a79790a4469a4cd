"""The launcher's line for a rank lost to a signal (hpcmarl/launch/lost_rank.py, run by
tools/mpirun.sh): mpirun's stderr passes through unchanged, and Open MPI's report of the lost
rank becomes one hpcmarl failure line naming the rank, its roles and its host. The end-to-end
kill -9 runs are tests/faults/test_failures.py and tests/multihost/test_jobs.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmarl.config.schema import TopologyConfig
from hpcmarl.launch.lost_rank import RANK_MAP_ENV, StderrWatch, failure_line, write_rank_map
from hpcmarl.launch.topology import build_topology

WATCH = Path(__file__).parents[2] / "hpcmarl" / "launch" / "lost_rank.py"
OPEN_MPI_LOSS = (
    b"--------------------------------------------------------------------------\n"
    b"prterun noticed that process rank 5 with PID 16759 on node hpc2 exited on\n"
    b"signal 9 (Killed).\n"
    b"--------------------------------------------------------------------------\n"
)


def launcher(*args: str, stdin: bytes = b"", rank_map: Path | None = None):
    """lost_rank.py as tools/mpirun.sh runs it: by path, outside hpcmarl's package."""
    env = {**os.environ, RANK_MAP_ENV: str(rank_map or "")}
    return subprocess.run(
        [sys.executable, str(WATCH), *args], input=stdin, capture_output=True, env=env, timeout=30
    )


@pytest.fixture
def rank_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What rank 0 of an 8-rank job on hpc1 (ranks 0-3) and hpc2 (ranks 4-7) writes."""
    topology = build_topology(
        8, TopologyConfig(), {"shared": ["shared"]}, ["hpc1"] * 4 + ["hpc2"] * 4
    )
    monkeypatch.setenv(RANK_MAP_ENV, str(tmp_path / "ranks"))
    write_rank_map(topology)
    assert ", ".join(topology.roles_on(5))
    return tmp_path / "ranks"


def test_a_rank_killed_by_a_signal_is_named_with_its_roles_and_host(
    tmp_path: Path, rank_map: Path
) -> None:
    # mpirun's stderr in pieces cut inside the message, with a byte that is not UTF-8, ending
    # in a NUL byte without a newline as Open MPI's across hosts did
    stderr = b"warning: \xff odd byte\n" + OPEN_MPI_LOSS + b"\x00"
    pieces = [stderr[:40], stderr[40:130], stderr[130:]]
    watch = subprocess.Popen(
        [sys.executable, str(WATCH), "watch", str(tmp_path / "report")],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert watch.stdin is not None
    for piece in pieces:
        watch.stdin.write(piece)
        watch.stdin.flush()
    _, forwarded = watch.communicate(timeout=30)
    assert forwarded == stderr  # byte for byte

    line = launcher("report", str(tmp_path / "report"), "137", "open-mpi", rank_map=rank_map)
    roles = rank_map.read_text().splitlines()[5].split("\t")[2].replace(",", ", ")
    assert line.stderr.decode().split("\n") == [
        "",  # the line starts a line of its own
        f"hpcmarl: failed: rank 5 ({roles}) on host hpc2, pid 16759: killed by signal 9 (SIGKILL)"
        " from outside hpcmarl (the kernel's OOM killer? a user? the batch system?); mpirun "
        "ended every other rank",
        "",
    ]

    # without a rank map (rank 0 never wrote it): Open MPI's node, no roles
    seen = StderrWatch()
    seen.feed(OPEN_MPI_LOSS.decode())
    bare = failure_line(seen.loss, {}, 137, open_mpi=True) or ""
    assert bare.startswith("hpcmarl: failed: rank 5 on host hpc2, pid 16759: killed by signal 9")


@pytest.mark.parametrize(
    ("stderr", "exit_code", "open_mpi", "expected"),
    [
        (OPEN_MPI_LOSS, 0, True, ""),  # the job ended well (ULFM replaced the rank)
        (b"hpcmarl: failed: rank 0 (commander): no heartbeat\n" + OPEN_MPI_LOSS, 1, True, ""),
        (b"", 1, True, ""),  # a rank's own failure: its line is already there
        (b"", 137, True, ""),  # mpirun itself killed: no rank to name
        (b"", 9, False, "hpcmarl: failed: a rank (MPICH's mpiexec names none; "),
        (b"", 1, False, ""),
    ],
)
def test_no_second_line_and_mpich_s_generic_one(
    stderr: bytes, exit_code: int, open_mpi: bool, expected: str
) -> None:
    seen = StderrWatch()
    seen.feed(stderr.decode())
    line = failure_line(seen.loss, {}, exit_code, open_mpi) or ""
    assert line.startswith(expected) and (line != "") == (expected != "")


OPEN_MPI_PEER_ABORT = (
    "[hpc1:00000] *** An error occurred in Socket closed\n"
    "[hpc1:00000] *** reported by process [2077097985,3]\n"
    "[hpc1:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,\n"
    "--------------------------------------------------------------------------\n"
    "prterun has exited due to process rank 3 with PID 0 on node hpc1 calling\n"
    '"abort". This may have caused other processes in the application to be\n'
)


def test_a_peer_that_aborted_first_is_named_as_the_one_that_lost_its_connection(
    rank_map: Path,
) -> None:
    """Across hosts a peer of the killed rank can see its socket close and abort before Open
    MPI reports the kill (seen in the multi-host tier): the line then names that peer and says
    what it lost, and a later report of the killed rank still wins."""
    from hpcmarl.launch.lost_rank import read_rank_map

    watch = StderrWatch()
    watch.feed(OPEN_MPI_PEER_ABORT)
    line = failure_line(watch.loss, read_rank_map(str(rank_map)), 14, open_mpi=True)
    assert line is not None and line.startswith("hpcmarl: failed: rank 3 (")
    assert "on host hpc1 lost its connection to another rank (Open MPI: Socket closed)" in line
    watch.feed(OPEN_MPI_LOSS.decode())
    line = failure_line(watch.loss, read_rank_map(str(rank_map)), 14, open_mpi=True)
    assert line is not None and " on host hpc2, pid 16759: killed by signal 9 (SIGKILL)" in line
