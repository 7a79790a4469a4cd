"""Continuous control: PPO's Gaussian policy on a gymnasium Box-action task (Pendulum-v1 by
default), eval return against env steps and wall time, beside the random policy.

For each seed this runs the job file in one process (`python -m hpcmarl JOB`) to a step budget
and reads its `metrics.jsonl`: the greedy evaluations (its `commander.eval_episodes` each)
against env steps and seconds. Then it plays the run's final policy and, as the baseline,
uniformly random actions within the bounds on the same `--episodes` start states, as
`python -m hpcmarl evaluate RUN_DIR --random` does (`analysis.evaluate.evaluate_run`), so the
two figures differ only by the policy. `final_vs_random_ratio` is the final policy's mean
return over the random one's: Pendulum's returns are costs (negative), so lower is better and
0.2 means a fifth of random play's cost. `--threshold` is the return whose first crossing by
an evaluation gives `steps_to_threshold` and `seconds_to_threshold`.

    .venv/bin/python tools/bench_continuous.py [--job jobs/pendulum_ppo.yaml] [--steps 100000]
                                               [--seeds 0 1 2] [--episodes 20]
                                               [--threshold -400]

Prints one table row per run, an eval curve per run, and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def train(job: str, steps: int, seed: int, run_dir: Path) -> tuple[float, list[dict]]:
    """One run in its own process; its wall seconds and evaluation rows."""
    args = [job, f"commander.max_env_steps={steps}", f"seed={seed}", f"runtime.run_dir={run_dir}"]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hpcmarl", *args], cwd=ROOT, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_continuous: the run failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return wall, [r for r in rows if r["kind"] == "eval"]


def first_crossing(evals: list[dict], threshold: float) -> tuple[int | None, float | None]:
    """Env steps and seconds of the first evaluation at or above `threshold`."""
    for row in evals:
        if row["return_mean"] >= threshold:
            return int(row["env_steps"]), float(row["time_s"])
    return None, None


def one_seed(args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, Any]:
    from hpcmarl.analysis.evaluate import evaluate_run  # after the run: this process stays light

    run_dir = tmp / f"seed{seed}"
    wall, evals = train(args.job, args.steps, seed, run_dir)
    final = evaluate_run(run_dir, args.episodes, seed=10_000_000, random_baseline=True)
    steps_to, seconds_to = first_crossing(evals, args.threshold)
    print(f"\nseed {seed}: eval curve (greedy, env steps / seconds / return)")
    for row in evals:
        print(f"  {row['env_steps']:>8,}  {row['time_s']:>7.1f}  {row['return_mean']:>9.1f}")
    return {
        "seed": seed,
        "wall_s": wall,
        "final": final["return_mean"],
        "final_sem": final["return_sem"],
        "random": final["random"]["return_mean"],
        "best_eval": max(r["return_mean"] for r in evals) if evals else None,
        "steps_to": steps_to,
        "seconds_to": seconds_to,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default="jobs/pendulum_ppo.yaml")
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--episodes", type=int, default=20, help="episodes of each final score")
    p.add_argument("--threshold", type=float, default=-400.0)
    args = p.parse_args()
    env_id = yaml.safe_load((ROOT / args.job).read_text())["env"]["id"]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_seed(args, seed, Path(tmp)) for seed in args.seeds]
    random_mean = float(np.mean([r["random"] for r in runs]))
    print(f"\n{env_id}, {args.job}, {args.steps:,} env steps a run, load {os.getloadavg()[0]:.1f}")
    print(f"random policy, on each run's final-score start states: {random_mean:.1f}")
    print(
        f"{'seed':>4} {'wall s':>7} {'final':>8} {'sem':>6} {'random':>8} {'best eval':>9} "
        f"{'steps to':>9} {'s to':>6}"
    )
    for r in runs:
        best = "-" if r["best_eval"] is None else f"{r['best_eval']:.1f}"
        steps_to = "-" if r["steps_to"] is None else f"{r['steps_to']:,}"
        secs_to = "-" if r["seconds_to"] is None else f"{r['seconds_to']:.1f}"
        print(
            f"{r['seed']:>4} {r['wall_s']:>7.1f} {r['final']:>8.1f} {r['final_sem']:>6.1f} "
            f"{r['random']:>8.1f} "
            f"{best:>9} {steps_to:>9} {secs_to:>6}"
        )
    final = float(np.mean([r["final"] for r in runs]))
    crossed = [r["steps_to"] for r in runs if r["steps_to"] is not None]
    summary = {
        "bench": "continuous",
        "env": env_id,
        "job": args.job,
        "steps": args.steps,
        "seeds": args.seeds,
        "random_return": random_mean,
        "final_return": final,
        "wall_s": float(np.mean([r["wall_s"] for r in runs])),
        "steps_to_threshold": float(np.median(crossed)) if crossed else None,
        "threshold": args.threshold,
        "crossed": f"{len(crossed)}/{len(runs)}",
        "final_vs_random_ratio": final / random_mean,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
