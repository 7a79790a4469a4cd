"""How the tools start a run of hpcmarl, so that every benchmark runs it the way a user does.

A user types `tools/mpirun.sh -n N python -m hpcmarl JOB KEY=VALUE ...` (or, for one rank,
plain `python -m hpcmarl ...`, every role co-located and no MPI). The benchmarks, the profiler
and the soak test start the same command with this interpreter, and give `tools/mpirun.sh` this
interpreter's virtualenv (`HPCMARL_VENV`), so that a tool run from `.venv-mpich` measures
MPICH's ranks and not the default venv's Open MPI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MPIRUN = ROOT / "tools" / "mpirun.sh"


def hpcmarl_command(ranks: int, args: list[str], plain_for_one: bool = False) -> list[str]:
    """`python -m hpcmarl ARGS` under `tools/mpirun.sh -n RANKS`; with `plain_for_one`, one rank
    is a plain process, as the README's first command runs on a single core."""
    launch = [] if plain_for_one and ranks == 1 else ["bash", str(MPIRUN), "-n", str(ranks)]
    return [*launch, sys.executable, "-m", "hpcmarl", *args]


def hpcmarl_env(**extra: str) -> dict[str, str]:
    """This process's environment for the run: unbuffered output, so that a killed run's log
    still holds its last progress lines, and this interpreter's virtualenv for mpirun.sh."""
    venv = str(Path(sys.executable).parents[1])
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": venv, **extra}
