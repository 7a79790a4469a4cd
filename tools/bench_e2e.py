"""End to end: wall time and env steps for the default job to reach 475 on CartPole.

Runs `mpirun -n N python -m hpcmarl seed=S` for each world size and seed, reads each run's
`metrics.jsonl`, and reports per world size the median over seeds of the training time (the
commander's clock, start of training to the stop decision), the whole job's wall time (start-up
and shutdown included) and the env steps used. A run that misses 475 counts as failed.

    .venv/bin/python tools/bench_e2e.py [--ranks 4 16] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(ranks: int, seed: int, run_dir: Path, timeout: float) -> dict:
    cmd = [
        "bash",
        str(ROOT / "tools" / "mpirun.sh"),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "hpcmarl",
        f"seed={seed}",
        f"runtime.run_dir={run_dir}",
    ]
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.monotonic() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    solved = result.returncode == 0 and final["reason"].startswith("stop_value reached")
    return {
        "ranks": ranks,
        "seed": seed,
        "solved": solved,
        "train_s": final["time_s"],
        "wall_s": round(wall, 1),
        "env_steps": final["env_steps"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    print(f"{'ranks':>5} {'seed':>4} {'solved':>6} {'train s':>8} {'wall s':>7} {'env steps':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            runs = []
            for seed in args.seeds:
                run = one_run(ranks, seed, Path(tmp) / f"n{ranks}-s{seed}", args.timeout)
                runs.append(run)
                print(
                    f"{ranks:>5} {seed:>4} {run['solved']!s:>6} {run['train_s']:8.1f} "
                    f"{run['wall_s']:7.1f} {run['env_steps']:9d}",
                    flush=True,
                )
            solved = [r for r in runs if r["solved"]]
            figures[f"n{ranks}_solved"] = len(solved)
            for key in ("train_s", "wall_s", "env_steps"):
                values = [r[key] for r in solved] or [float("nan")]
                figures[f"n{ranks}_median_{key}"] = statistics.median(values)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
