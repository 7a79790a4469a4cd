"""Continuous control: PPO's Gaussian policy on a gymnasium Box-action task (Pendulum-v1 by
default), eval return against env steps and wall time, beside the random policy.

For each seed this runs the job file in one process (`python -m hpcmarl JOB`) to a step budget
and reads its `metrics.jsonl`: the greedy evaluations (its `commander.eval_episodes` each)
against env steps and seconds. In the same run it measures the baseline, uniformly random
actions within the bounds, and plays each run's final policy (`hpcmarl.load_policy`, its mean
action clipped to the bounds) on the same `--episodes` start states as the random policy, so
the two figures differ only by the policy. `final_vs_random_ratio` is the final policy's mean
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def episode_returns(env_id: str, act: Callable[[np.ndarray], Any], episodes: int) -> list[float]:
    """Returns of `act` over `episodes` episodes of `env_id` seeded 1000, 1001, ..."""
    env = gymnasium.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=1000 + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    env.close()
    return returns


def random_returns(env_id: str, episodes: int) -> list[float]:
    """Uniform actions within the action space's bounds."""
    space = gymnasium.make(env_id).action_space
    space.seed(0)
    return episode_returns(env_id, lambda obs: space.sample(), episodes)


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


def one_seed(args: argparse.Namespace, env_id: str, seed: int, tmp: Path) -> dict[str, Any]:
    import hpcmarl  # after the run: this process stays light while it trains

    run_dir = tmp / f"seed{seed}"
    wall, evals = train(args.job, args.steps, seed, run_dir)
    policy = hpcmarl.load_policy(run_dir)
    final = episode_returns(env_id, policy.act, args.episodes)
    steps_to, seconds_to = first_crossing(evals, args.threshold)
    print(f"\nseed {seed}: eval curve (greedy, env steps / seconds / return)")
    for row in evals:
        print(f"  {row['env_steps']:>8,}  {row['time_s']:>7.1f}  {row['return_mean']:>9.1f}")
    return {
        "seed": seed,
        "wall_s": wall,
        "final": float(np.mean(final)),
        "final_sem": float(np.std(final) / np.sqrt(len(final))),
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
    env = yaml.safe_load((ROOT / args.job).read_text())["env"]
    if env.get("kind", "gymnasium") != "gymnasium":
        sys.exit("bench_continuous: the job must name a gymnasium env (env.kind: gymnasium)")
    env_id = env["id"]
    random = random_returns(env_id, args.episodes)
    random_mean = float(np.mean(random))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_seed(args, env_id, seed, Path(tmp)) for seed in args.seeds]
    print(f"\n{env_id}, {args.job}, {args.steps:,} env steps a run, load {os.getloadavg()[0]:.1f}")
    print(f"random policy: {random_mean:.1f} +- {np.std(random) / np.sqrt(len(random)):.1f}")
    print(
        f"{'seed':>4} {'wall s':>7} {'final':>8} {'sem':>6} {'best eval':>9} "
        f"{'steps to':>9} {'s to':>6}"
    )
    for r in runs:
        best = "-" if r["best_eval"] is None else f"{r['best_eval']:.1f}"
        steps_to = "-" if r["steps_to"] is None else f"{r['steps_to']:,}"
        secs_to = "-" if r["seconds_to"] is None else f"{r['seconds_to']:.1f}"
        print(
            f"{r['seed']:>4} {r['wall_s']:>7.1f} {r['final']:>8.1f} {r['final_sem']:>6.1f} "
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
