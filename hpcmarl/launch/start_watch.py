"""The launcher's watch over a fault-tolerant job's start-up: a rank lost before MPI is up.

Under `mpirun --with-ft ulfm` Open MPI neither ends the job nor reports a rank that dies before
its `MPI_Init` finished: every other rank waits in `MPI_Init` for good (measured: 7 ranks still
waiting 150 s after a `kill -9` of one in its first second; MPICH's Hydra does the same,
pmodels/mpich#6124). Once every rank has MPI up, the ranks learn of any loss themselves
(`comm/failures.py`, `launch/losses.py`). So `tools/mpirun.sh` runs this beside a
fault-tolerant job: until rank 0 writes the rank map (after a collective of every rank, so MPI
is up everywhere), it notes the ranks mpirun started on this host; when one of them is gone and
the job has not ended `GRACE_S` later (a loss after `MPI_Init`, which the ranks report), it
prints one line, ends the ranks (then mpirun ends), and writes FLAG, which makes the script
exit 76 (requeued: nothing was trained).

Ranks on other hosts (`--hosts`) are not watched, nor a rank that dies before the first look
(every `POLL_S`). Standard library only, run by path, like `lost_rank.py`.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.1
GRACE_S = 5.0
"""How long a rank's death may go unreported by the job before the watch ends it."""


def children(pid: int) -> list[int]:
    """The pids of a process's children (Linux /proc; none elsewhere)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(c) for c in fh.read().split()]
    except OSError:
        return []


def rank_of(pid: int) -> int | None:
    """The MPI rank of a process Open MPI started (its environment), None for any other."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None
    for var in env:
        if var.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(var.split(b"=", 1)[1])
    return None


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie its parent has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ranks_below(pid: int) -> dict[int, int]:
    """pid -> rank of the ranks among `pid`'s descendants."""
    ranks, todo = {}, children(pid)
    while todo:
        child = todo.pop()
        rank = rank_of(child)
        if rank is not None:
            ranks[child] = rank
        else:
            todo += children(child)
    return ranks


def watch(mpirun: int, rank_map: str, flag: str) -> int:
    """Until the rank map exists or mpirun ends; 1 when it ended the job, else 0."""
    seen: dict[int, int] = {}
    lost_at: float | None = None
    while alive(mpirun) and not os.path.exists(rank_map):
        seen.update(ranks_below(mpirun))
        gone = sorted((rank, pid) for pid, rank in seen.items() if not alive(pid))
        if gone and lost_at is None:
            lost_at = time.monotonic()
        if gone and lost_at is not None and time.monotonic() - lost_at > GRACE_S:
            end_job(mpirun, gone, flag)
            return 1
        time.sleep(POLL_S)
    return 0


def end_job(mpirun: int, gone: list[tuple[int, int]], flag: str) -> None:
    ranks = ", ".join(f"rank {rank} (pid {pid})" for rank, pid in gone)
    print(
        f"hpcmarl: failed: lost {ranks} during start-up, before every rank had MPI up: under "
        "fault tolerance Open MPI leaves the other ranks waiting for it, so the job was "
        "ended; nothing was trained: start the job again (slurm/train.sh requeues it)",
        file=sys.stderr,
        flush=True,
    )
    with open(flag, "w"):
        pass
    for pid in ranks_below(mpirun):  # mpirun ends once its ranks have (no "Killed" then)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + GRACE_S
    while alive(mpirun) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if alive(mpirun):
        try:
            os.killpg(mpirun, signal.SIGKILL)  # tools/mpirun.sh: mpirun leads its own group
        except OSError:
            pass


def main(argv: list[str]) -> int:
    """`MPIRUN_PID RANK_MAP FLAG`."""
    if len(argv) != 3:
        print(f"usage: {sys.argv[0]} MPIRUN_PID RANK_MAP FLAG", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the script's to relay
    return watch(int(argv[0]), argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
