"""Where a rank's time goes: `HPCMARL_PROFILE_DIR=DIR` profiles every rank's loop with cProfile.

Each rank writes `DIR/rank<r>.prof` (pstats format) and `DIR/rank<r>.json`: its roles and the
seconds its loop spent in each part of the system, grouped by the module that owns it
(transport, replay, learner update, environments, checkpoint, idle sleep), and the CPU
seconds the process burnt meanwhile: with more ranks than cores the parts are wall-clock
time, which also counts the time a rank waited for a core, and the CPU seconds say which
ranks actually used the cores. The profile covers
the loop only, not start-up. `tools/profile_roles.py` runs a job this way and prints the table
that `docs/performance.md` discusses. Off by default: cProfile slows Python code by about 1.5x.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PROFILE_ENV = "HPCMARL_PROFILE_DIR"

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle sleep", ("comm/progress.py:sleep", "built-in method time.sleep")),
    ("mpi transport", ("comm/transport.py", "comm/packing.py", "mpi4py")),
    ("allreduce", ("comm/allreduce.py", "comm/horovod.py")),
    ("replay tables", ("replay/",)),
    ("learner update", ("algos/", "torch")),
    ("environments", ("envs/", "gymnasium/", "pettingzoo/", "mpe2/", "pyspiel")),
    ("acting and items", ("roles/acting.py", "items/")),
    ("checkpoint", ("storage/",)),
)
"""Parts of a rank's loop, each known by the files of its functions (first match wins)."""


def profile_dir() -> Path | None:
    folder = os.environ.get(PROFILE_ENV, "").strip()
    return Path(folder) if folder else None


@contextmanager
def profiled(rank: int, roles: Callable[[], list[str]]) -> Iterator[None]:
    """Profile the body when HPCMARL_PROFILE_DIR is set; write the rank's files after it."""
    folder = profile_dir()
    if folder is None:
        yield
        return
    profiler = cProfile.Profile()
    cpu_start = time.process_time()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        cpu = time.process_time() - cpu_start
        folder.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(folder / f"rank{rank}.prof")
        stats = pstats.Stats(profiler)
        summary = {
            "rank": rank,
            "roles": roles(),
            "parts": self_time_by_part(stats),
            "cpu_s": round(cpu, 3),
        }
        (folder / f"rank{rank}.json").write_text(json.dumps(summary, indent=1))


def self_time_by_part(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of own time (not counting callees) per part, plus `total` and `other`."""
    parts = dict.fromkeys([name for name, _ in PARTS], 0.0)
    other = total = 0.0
    for (file, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        own = float(row[2])
        total += own
        where = f"{file}:{function}"
        for name, markers in PARTS:
            if any(marker in where for marker in markers):
                parts[name] += own
                break
        else:
            other += own
    return {
        **{k: round(v, 3) for k, v in parts.items()},
        "other": round(other, 3),
        "total": round(total, 3),
    }
