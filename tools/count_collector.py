"""Instructions per vector step of a collector and of the bare loop, counted by callgrind.

`bench_collector.py` times the two, and on a shared machine its ratio moves by more than a
change to the collector does. Instruction counts do not move with the load: each loop runs in
its own process under `valgrind --tool=callgrind`, instrumentation starts after the warm-up
(first weights, first resets) and counting is switched on only around the bare loop's steps
and around each `collector.poll()` (the replay shard and parameter server it talks to are
polled outside). `ratio` is the bare loop's instructions per step over the collector's (1.0:
the collector costs nothing beyond acting and stepping); issue 30 asks for at least 0.9.
Needs valgrind with its headers and a C compiler (a two-line shim that switches counting).
Prints a table and, last, one JSON line.

    .venv/bin/python tools/count_collector.py [--cases NAME ...] [--steps 800] [--warmup 400]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

SHIM = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_START_INSTRUMENTATION; }
void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
TOOLS = Path(__file__).resolve().parent


def build_shim(folder: Path) -> Path:
    """The shared library whose two functions start instrumentation and switch counting."""
    source, library = folder / "shim.c", folder / "shim.so"
    source.write_text(SHIM)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("count_collector: no C compiler (cc or gcc) to build the callgrind shim")
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise SystemExit(f"count_collector: cannot build the shim (valgrind headers?): {first}")
    return library


def child(mode: str, case: str, steps: int, warmup: int, library: str) -> None:
    """Inside valgrind: warm the loop up, then count `steps` vector steps of it."""
    import torch

    sys.path.insert(0, str(TOOLS))
    import bench_collector as bench

    torch.set_num_threads(1)
    shim = ctypes.CDLL(library)
    cfg = bench.job_for(*bench.CASES[case])
    run: Callable[[int, bool], None]
    if mode == "bare":
        loop = bench.BareLoop(cfg)

        def run(n: int, counted: bool) -> None:
            if counted:
                shim.toggle()
            loop.advance(n)
            if counted:
                shim.toggle()

    else:
        world = bench.CollectorLoop(cfg)
        collector = world.collector

        def run(n: int, counted: bool) -> None:
            first = collector.env_steps
            while collector.env_steps - first < n * collector.env.num_envs:
                if counted:
                    shim.toggle()
                collector.poll()
                if counted:
                    shim.toggle()
                world.shard.poll()
                world.server.poll()
                world.commander.clear()

    run(warmup, False)
    shim.start()
    run(50, False)  # the first steps after instrumentation starts, not counted
    run(steps, True)


def launch(
    mode: str, case: str, steps: int, warmup: int, folder: Path, library: Path
) -> tuple[subprocess.Popen[str], Path]:
    """One loop in its own process under callgrind, and the file its counts will be in (the
    bare loop and the collector run side by side)."""
    out = folder / f"{mode}.{case}.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--child",
        mode,
        case,
        str(steps),
        str(warmup),
        str(library),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    return process, out


def per_step(process: subprocess.Popen[str], out: Path, what: str, steps: int) -> float:
    """Instructions per vector step of a launched loop, once it has ended."""
    _, errors = process.communicate()
    totals = (
        re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M) if out.exists() else None
    )
    if process.returncode or totals is None:
        last = (errors.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"count_collector: {what} failed: {last}")
    return int(totals.group(1)) / steps


def main() -> None:
    sys.path.insert(0, str(TOOLS))
    from bench_collector import CASES

    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, case, steps, warmup, shim = sys.argv[2:7]
        child(mode, case, int(steps), int(warmup), shim)
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["cartpole_x1"])
    parser.add_argument("--steps", type=int, default=800, help="vector steps counted per loop")
    parser.add_argument("--warmup", type=int, default=400, help="vector steps before counting")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("count_collector: valgrind is not installed (apt-get install valgrind)")
    figures: dict[str, float] = {"steps": args.steps, "warmup": args.warmup}
    print(f"{'case':<16} {'bare instr/step':>16} {'collector':>10} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        library = build_shim(folder)
        for case in args.cases:
            loops = [
                launch(mode, case, args.steps, args.warmup, folder, library)
                for mode in ("bare", "collector")
            ]
            bare, mine = (
                per_step(process, out, f"the {mode} loop of {case}", args.steps)
                for (process, out), mode in zip(loops, ("bare", "collector"), strict=True)
            )
            figures[f"{case}_bare_instr_per_step"] = round(bare)
            figures[f"{case}_collector_instr_per_step"] = round(mine)
            figures[f"{case}_ratio"] = round(bare / mine, 3)
            print(f"{case:<16} {bare:16,.0f} {mine:10,.0f} {bare / mine:6.3f}", flush=True)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
