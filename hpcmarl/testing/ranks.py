"""Finding the processes of a running job's MPI ranks, for fault tests and the soak benchmark.

A test that kills one rank, or a benchmark that reads every rank's memory, needs the pid of each
rank. The launcher's environment names the rank (Open MPI's `OMPI_COMM_WORLD_RANK`, MPICH's
`PMI_RANK`) and the command line names the run directory, which tells two jobs apart.
"""

from __future__ import annotations

from pathlib import Path

RANK_VARS = ("OMPI_COMM_WORLD_RANK=", "PMI_RANK=")


def rank_pids(run_dir: Path | str) -> dict[int, int]:
    """pid of each MPI rank of the job whose command line names `run_dir` (Linux /proc)."""
    pids = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if str(run_dir) not in cmdline or "hpcmarl" not in cmdline:
            continue
        for var in environ:
            if var.startswith(RANK_VARS):
                pids[int(var.split("=", 1)[1])] = int(proc.name)
    return pids


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process in MiB (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
