"""End to end: how long hpcmarl takes to solve CartPole, optionally beside SB3's DQN.

    .venv/bin/python tools/bench_e2e.py [--ranks 1 4 16] [--seeds 0 1 2] [--vs sb3]
        [--job JOB.yaml] [--override KEY=VALUE ...]

Runs `python -m hpcmarl JOB seed=S commander.stop_evals=2` for each world size and seed (one
plain process for `--ranks 1`, `mpirun -n N` otherwise), JOB being `jobs/cartpole_fast.yaml`
(the README's CartPole job for speed) unless `--job` names another, reads each run's
`metrics.jsonl`, and reports per world size the median over the seeds that solved of:

- `solve_s`, `solve_env_steps`: the commander's clock and env steps at the first 10-episode
  greedy evaluation whose mean return reaches 475 (evaluations run every
  `commander.eval_interval_s` of training and their time is inside the clock);
- `train_s`: the clock at the run's end (stop decision, final checkpoint and drain included);
- `wall_s`: the whole job, start-up and shutdown included; `env_steps`: steps at the end.

A run solves when it reaches 475 and then holds it: it must stop on two evaluations in a row
at 475 or more (`commander.stop_evals=2`); one that never does counts as failed and stays out
of the medians. `held_s` is the clock at the second of those evaluations.

`--vs sb3` (needs the `bench` extra: `pip install -e .[bench]`) also trains Stable-Baselines3
DQN with the rl-baselines3-zoo `CartPole-v1` hyper-parameters (`hyperparams/dqn.yml`), each
seed in a fresh process with one torch thread like an hpcmarl rank, seeds interleaved with
hpcmarl's (SB3 seed 0, hpcmarl seed 0 at each world size, SB3 seed 1, ...) so that a change in
the machine's load falls on both. SB3 is judged as hpcmarl is: every
`commander.eval_interval_s` of the job (or `--eval-interval-s`) of wall time once it has made a
gradient step, 10 greedy episodes, one on each of 10 copies of a separate env; its
`solve_s` is wall time from the call of `learn()` to the end of the first evaluation reaching
475, evaluations included, since hpcmarl's clock runs through its evaluations too. It gets the
zoo's 50k-step budget. `n{N}_vs_sb3_ratio` is hpcmarl's median `solve_s` at N ranks over SB3's:
below 1.0 hpcmarl is faster (issue 13's target: <= 0.5 at 1 and 4 ranks, <= 1.0 at 16).

Prints a row per run and, as its last line, one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher import hpcmarl_command, hpcmarl_env  # noqa: E402 - tools/ is sys.path[0]

from hpcmarl.config.loader import load_job  # noqa: E402
from hpcmarl.config.schema import CommanderConfig  # noqa: E402

STOP_VALUE = float(CommanderConfig().stop_value or 475.0)
EVAL_EPISODES = CommanderConfig().eval_episodes
FAST_JOB = "jobs/cartpole_fast.yaml"
ENV_ID = "CartPole-v1"
ZOO_TIMESTEPS = 50_000
ZOO_DQN = {
    "policy": "MlpPolicy",
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
"""rl-baselines3-zoo `hyperparams/dqn.yml`, `CartPole-v1` ("almost tuned"), n_timesteps 5e4."""
SB3_FIX = "bench_e2e: error: --vs sb3 needs stable-baselines3; fix: pip install -e .[bench]"
FIELDS = ("solve_s", "solve_env_steps", "held_s", "train_s", "wall_s", "env_steps")


HOLD = ["commander.stop_evals=2"]
"""A solve must last: two evaluations in a row at the stop value (issue 13)."""


def hpcmarl_run(ranks: int, seed: int, run_dir: Path, job: list[str], timeout: float) -> dict:
    """Run the job once; solved means it stopped on its own, on the second evaluation in a
    row reaching 475."""
    start = time.monotonic()
    try:
        result = subprocess.run(
            hpcmarl_command(
                ranks, [*job, f"seed={seed}", f"runtime.run_dir={run_dir}"], plain_for_one=True
            ),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env=hpcmarl_env(),
        )
        ok = result.returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    wall = time.monotonic() - start
    metrics = run_dir / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    final = rows[-1] if rows and rows[-1].get("kind") == "finished" else {}
    evals = [r for r in rows if r.get("kind") == "eval"]
    hit = next((r for r in evals if r["return_mean"] >= STOP_VALUE), {})
    held = ok and final.get("reason", "").startswith("stop_value reached")
    return {
        "solved": bool(hit) and held,
        "solve_s": hit.get("time_s", float("nan")),
        "solve_env_steps": hit.get("env_steps", -1),
        "held_s": evals[-1]["time_s"] if held else float("nan"),
        "train_s": final.get("time_s", float("nan")),
        "wall_s": round(wall, 1),
        "env_steps": final.get("env_steps", -1),
    }


class GreedyEvalStop:
    """SB3 callback (the plain-callable form, so this file imports SB3 only when asked): every
    `interval_s` once the model has trained, a greedy evaluation; stop learning at the first
    that reaches `STOP_VALUE`, remembering the time since `start` and the env steps."""

    def __init__(self, model: Any, eval_env: Any, start: float, interval_s: float) -> None:
        self.model, self.eval_env, self.interval_s = model, eval_env, interval_s
        self.start = self.last = start
        self.solve: dict[str, Any] = {}
        self.eval_s, self.evals = 0.0, 0

    def __call__(self, _locals: dict, _globals: dict) -> bool:
        now = time.monotonic()  # `_n_updates` is SB3's own count of gradient steps
        if self.model._n_updates == 0 or now - self.last < self.interval_s:
            return True
        from stable_baselines3.common.evaluation import evaluate_policy

        self.last = now
        mean, _ = evaluate_policy(self.model, self.eval_env, EVAL_EPISODES, deterministic=True)
        done = time.monotonic()
        self.eval_s, self.evals = self.eval_s + done - now, self.evals + 1
        if mean < STOP_VALUE:
            return True
        self.solve = {"solve_s": done - self.start, "solve_env_steps": self.model.num_timesteps}
        return False


def sb3_worker(seed: int, timesteps: int, interval_s: float) -> dict:
    """One SB3 training run in this process; its figures as one JSON-ready dict."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    model = DQN(env=gym.make(ENV_ID), seed=seed, device="cpu", verbose=0, **ZOO_DQN)
    eval_env = DummyVecEnv([lambda: Monitor(gym.make(ENV_ID))] * EVAL_EPISODES)
    eval_env.seed(seed + 10_000)
    start = time.monotonic()
    callback = GreedyEvalStop(model, eval_env, start, interval_s)
    model.learn(total_timesteps=timesteps, callback=callback)
    return {
        "solved": bool(callback.solve),
        "solve_s": round(callback.solve.get("solve_s", float("nan")), 2),
        "solve_env_steps": callback.solve.get("solve_env_steps", -1),
        "train_s": round(time.monotonic() - start, 2),
        "env_steps": model.num_timesteps,
        "evals": callback.evals,
        "eval_s": round(callback.eval_s, 2),
    }


def sb3_run(seed: int, timesteps: int, interval_s: float, timeout: float) -> dict:
    """SB3 in a fresh process, as each hpcmarl run is: no warm caches from the last seed."""
    cmd = [sys.executable, __file__, "--sb3-worker", str(seed), "--sb3-timesteps", str(timesteps)]
    cmd += ["--eval-interval-s", str(interval_s)]
    start = time.monotonic()
    failed = {"solved": False, "solve_s": float("nan"), "solve_env_steps": -1}
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**failed, "wall_s": round(time.monotonic() - start, 1)}
    lines = result.stdout.strip().splitlines()
    run = json.loads(lines[-1]) if result.returncode == 0 and lines else failed
    if result.returncode != 0:
        cause = (result.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"bench_e2e: SB3 seed {seed} failed: {cause}", file=sys.stderr)
    return {**run, "wall_s": round(time.monotonic() - start, 1)}


def print_row(name: str, seed: int, run: dict) -> None:
    train = f"{run['train_s']:8.1f}" if "train_s" in run else f"{'-':>8}"
    held = f"{run['held_s']:7.1f}" if "held_s" in run else f"{'-':>7}"
    print(
        f"{name:>6} {seed:>4} {run['solved']!s:>6} {run['solve_s']:8.1f} "
        f"{run['solve_env_steps']:>11} {held} {train} {run['wall_s']:7.1f}",
        flush=True,
    )


def medians(prefix: str, runs: list[dict]) -> dict[str, float]:
    """Solved count and the median of each field over the runs that solved."""
    solved = [r for r in runs if r["solved"]]
    figures: dict[str, float] = {f"{prefix}_solved": len(solved)}
    for key in (k for k in FIELDS if any(k in r for r in runs)):
        values = [r[key] for r in solved if key in r] or [float("nan")]
        figures[f"{prefix}_median_{key}"] = statistics.median(values)
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time for the default job to solve CartPole.")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16], help="world sizes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vs", choices=["sb3"], help="also run this library, seeds interleaved")
    parser.add_argument("--job", default=FAST_JOB, help=f"the job file (default {FAST_JOB})")
    parser.add_argument(
        "--override", action="append", default=[], help="KEY=VALUE for hpcmarl (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument(
        "--eval-interval-s", type=float, help="SB3's evaluation period (default: the job's)"
    )
    parser.add_argument(
        "--sb3-timesteps", type=int, default=ZOO_TIMESTEPS, help="SB3's step budget (zoo: 5e4)"
    )
    parser.add_argument("--sb3-worker", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.sb3_worker is not None:
        run = sb3_worker(args.sb3_worker, args.sb3_timesteps, args.eval_interval_s)
        print(json.dumps(run), flush=True)
        return
    if args.vs == "sb3" and importlib.util.find_spec("stable_baselines3") is None:
        print(SB3_FIX, file=sys.stderr)
        raise SystemExit(2)
    job = [args.job, *HOLD, *args.override]
    if args.eval_interval_s is None:
        args.eval_interval_s = load_job(args.job, args.override).commander.eval_interval_s
    runs: dict[str, list[dict]] = {f"n{ranks}": [] for ranks in args.ranks}
    if args.vs:
        runs = {"sb3": [], **runs}
    print(
        f"{'run':>6} {'seed':>4} {'solved':>6} {'solve s':>8} {'solve steps':>11} "
        f"{'held s':>7} {'train s':>8} {'wall s':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            if args.vs:
                run = sb3_run(seed, args.sb3_timesteps, args.eval_interval_s, args.timeout)
                runs["sb3"].append(run)
                print_row("sb3", seed, run)
            for ranks in args.ranks:
                run_dir = Path(tmp) / f"n{ranks}-s{seed}"
                run = hpcmarl_run(ranks, seed, run_dir, job, args.timeout)
                runs[f"n{ranks}"].append(run)
                print_row(f"n{ranks}", seed, run)
    figures: dict[str, float] = {}
    for name, group in runs.items():
        figures |= medians(name, group)
    if args.vs:
        for ranks in args.ranks:
            ratio = figures[f"n{ranks}_median_solve_s"] / figures["sb3_median_solve_s"]
            figures[f"n{ranks}_vs_sb3_ratio"] = round(ratio, 3)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
