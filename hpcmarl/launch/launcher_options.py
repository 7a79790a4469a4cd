"""What the MPI launcher must know of a job before any rank starts.

`tools/mpirun.sh` passes Open MPI's `--with-ft ulfm` only to a job that asks to survive lost
collectors (`runtime.fault_tolerance: collectors`). That key may sit in the job file, in a
resumed run's `config.yaml` or on the command line, and the ranks read it only once they run,
too late for the launcher. So the launcher asks here, with the command line it will start:

    python hpcmarl/launch/launcher_options.py fault-tolerance ARGS...

prints `collectors` or `none`. It resolves the job as `python -m hpcmarl` does (job file, then
overrides; `resume RUN_DIR` reads the run's own job). A command that does not run hpcmarl, or
a job that does not load (the ranks will say why), prints `none`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

NOT_TRAINING = ("analyze", "export", "evaluate", "export-policy", "scale")


def hpcmarl_args(command: Sequence[str]) -> list[str] | None:
    """The arguments after `-m hpcmarl` in a launcher's command line, or None without it."""
    for i in range(len(command) - 1):
        if command[i] == "-m" and command[i + 1] == "hpcmarl":
            return list(command[i + 2 :])
    return None


def job_and_overrides(args: Sequence[str]) -> tuple[str | None, list[str]] | None:
    """The job file and overrides `python -m hpcmarl ARGS` trains with; None for the other
    subcommands (analysis, export, scale), which start no training world."""
    if args and args[0] == "resume":
        return (os.path.join(args[1], "config.yaml"), list(args[2:])) if len(args) > 1 else None
    if args and (args[0].startswith("-") or args[0] in NOT_TRAINING):
        return None
    from ..config.loader import command_job

    return command_job(args)


def fault_tolerance(command: Sequence[str]) -> str:
    """`collectors` when the job this command trains asks for it, else `none`."""
    args = hpcmarl_args(command)
    resolved = job_and_overrides(args) if args is not None else None
    if resolved is None:
        return "none"
    from ..config.loader import load_job
    from ..errors import UserError

    try:
        return load_job(*resolved).runtime.fault_tolerance
    except (UserError, OSError):
        return "none"


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] != "fault-tolerance":
        print("usage: launcher_options.py fault-tolerance COMMAND...", file=sys.stderr)
        return 2
    print(fault_tolerance(argv[1:]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from hpcmarl.launch.launcher_options import main as run  # the package's, with its imports

    sys.exit(run(sys.argv[1:]))
