"""MARL on simple_spread: eval team return against env steps and wall time, and throughput.

For each world size and algorithm (MAPPO, IPPO, IQL: independent DQN, VDN, QMIX) this runs
the job file under `mpirun -n N` to a step budget and reads its `metrics.jsonl`: the greedy
evaluations (team return summed over agents, 32 episodes each) against env steps and seconds,
env steps/s and learner updates/s. Each run's final policies are then played for
`--final-episodes` more (`python -m hpcmarl evaluate`; `*_final_policy` and its standard error
`*_final_policy_sem`): a target is judged on that figure, whose standard error is about 0.3,
not on the last in-run evaluations (about 2 each). In the same run it measures the baselines:

- the random policy's team return (uniform actions, the same environment settings);
- a bare loop of the same environment and the same policy network (sampling its softmax), one
  process per core for a few seconds: the machine's env steps/s without any of hpcmarl, which
  the on-policy jobs' throughput is divided by (`*_throughput_ratio`). It is measured before
  the first run and again after each, and a run is divided by the mean of the two around it:
  on a shared VM the same loop moves by a third within an hour (`bare_spread_ratio`);
- for the on-policy jobs, the CPU one update costs per env step it trains on (the job's own
  algorithm on a batch of its item spec, one torch thread, as `bench_update.py` times it). With
  the bare loop's CPU per env step it gives the most env steps/s any schedule could make on
  these cores while also training on every step: cores / (cores / bare + update per env step).
  The job's rate over it is `*_ceiling_ratio`, the share that hpcmarl's own costs leave (MPI,
  roles, scheduling on an oversubscribed node); the throughput ratio can never pass the
  ceiling's own ratio to the bare loop (`*_ceiling_vs_bare_ratio`).

    .venv/bin/python tools/bench_marl.py [--ranks 4 16] [--algos mappo ippo iql vdn qmix]
                                         [--budget 2000000] [--iql-budget 300000]
                                         [--vd-budget 300000] [--seed 0]

IQL's, VDN's and QMIX's budgets are their own: their learners sample many items per inserted
one (IQL 16 transitions, VDN and QMIX 32 episodes per episode), so their runs are bound by
learner updates, not env steps, and 2M steps would take hours on a small node.

Prints one table row per run, an eval curve per run, and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from launcher import hpcmarl_command, hpcmarl_env

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "mappo": "jobs/spread_mappo.yaml",
    "ippo": "jobs/spread_ippo.yaml",
    "iql": "jobs/spread_independent.yaml",
    "vdn": "jobs/spread_vdn.yaml",
    "qmix": "jobs/spread_qmix.yaml",
}
ON_POLICY = ("mappo", "ippo")
SPREAD = {"N": 3, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}


def random_team_return(episodes: int, seed: int) -> tuple[float, float]:
    """Mean and std of the team return of uniformly random actions."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**SPREAD)
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total = 0.0
        while env.agents:
            actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
            _, rewards, _, _, _ = env.step(actions)
            total += sum(rewards.values())
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))


def _bare_loop(seconds: float, seed: int, out: mp.Queue) -> None:
    """One core's env steps/s: the job's vector env and MAPPO's actor, nothing else."""
    import torch

    from hpcmarl.algos.actors import build_actor
    from hpcmarl.config.loader import load_job
    from hpcmarl.envs import make_vector_env
    from hpcmarl.launch.build import build_population, probe_env

    torch.set_num_threads(1)
    cfg = load_job(str(ROOT / JOBS["mappo"]))
    env = make_vector_env(cfg.env, cfg.env.num_envs, seed)
    (key,) = build_population(cfg, probe_env(cfg)).keys()
    actor = build_actor(build_population(cfg, probe_env(cfg)).spec(key))
    rng = np.random.default_rng(seed)
    actor.set_weights((0.1 * rng.standard_normal(actor.spec.size)).astype(np.float32))
    obs, steps = env.reset(), 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        joined = np.concatenate([obs[a] for a in env.agents])
        acted = actor.act(joined, rng, env_steps=0, greedy=False).actions
        actions = dict(zip(env.agents, np.split(acted, len(env.agents)), strict=True))
        obs = env.step(actions).observations
        steps += env.num_envs
    out.put(steps / (time.perf_counter() - start))


def bare_rate(seconds: float, loop: Callable[..., None] = _bare_loop, *args: Any) -> float:
    """Env steps/s of one bare loop per core, run at once, summed (`loop(*args, seconds,
    seed, queue)` puts its own rate on the queue)."""
    queue: mp.Queue = mp.Queue()
    procs = [mp.Process(target=loop, args=(*args, seconds, i, queue)) for i in range(cores())]
    for p in procs:
        p.start()
    rates = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


def update_seconds_per_env_step(algo: str, updates: int = 10) -> float:
    """CPU seconds (one torch thread) one on-policy update costs per env step it trains on."""
    import torch
    from bench_update import seconds_per_update

    from hpcmarl.algos.catalog import on_policy_window
    from hpcmarl.config.loader import load_job

    torch.set_num_threads(1)
    job = str(ROOT / JOBS[algo])
    cfg = load_job(job)
    env_steps = on_policy_window(cfg.learner)[0] * cfg.collector.fragment_length
    return seconds_per_update(job, "cpu", updates) / env_steps


def ceiling_rate(bare: float, update_s: float) -> float:
    """The most env steps/s these cores make while also training on every step: the bare
    loop's CPU per env step plus the update's, spread over the cores."""
    return cores() / (cores() / bare + update_s)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def launch(
    ranks: int, args: list[str], run_dir: Path
) -> tuple[subprocess.CompletedProcess[str], float, list[dict]]:
    """`python -m hpcmarl ARGS` under `tools/mpirun.sh -n RANKS` into `run_dir`: its process,
    its wall seconds and the rows of its metrics.jsonl."""
    cmd = hpcmarl_command(ranks, [*args, f"runtime.run_dir={run_dir}"])
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=hpcmarl_env())
    wall = time.monotonic() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, wall, rows


def one_run(
    algo: str, ranks: int, budget: int, seed: int, run_dir: Path, final_episodes: int
) -> dict:
    """The job to its step budget; what its metrics say, and its final policies' greedy return
    over `final_episodes` episodes (`python -m hpcmarl evaluate`): the in-run evaluations are
    32 episodes each, too few to judge a target by."""
    from hpcmarl.analysis.evaluate import evaluate_run

    args = [
        JOBS[algo],
        f"seed={seed}",
        f"commander.max_env_steps={budget}",
        "commander.stop_value=null",
        "commander.eval_interval_s=20",
        "commander.eval_episodes=32",
    ]
    result, wall, rows = launch(ranks, args, run_dir)
    evals = [r for r in rows if r["kind"] == "eval"]
    progress = [r for r in rows if r["kind"] == "progress" and r["time_s"] > 10]
    curve = [(r["env_steps"], r["time_s"], r["return_mean"]) for r in evals]
    last = [r["return_mean"] for r in evals[-3:]]
    judged = final_episodes and result.returncode == 0
    final = evaluate_run(run_dir, final_episodes, seed=10_000_000) if judged else None
    return {
        "algo": algo,
        "ranks": ranks,
        "ok": result.returncode == 0,
        "wall_s": round(wall, 1),
        "train_s": round(rows[-1].get("time_s", wall), 1) if rows else None,
        "env_steps": rows[-1].get("env_steps") if rows else None,
        "final_eval": round(statistics.mean(last), 2) if last else None,
        "best_eval": round(max(r["return_mean"] for r in evals), 2) if evals else None,
        "final_policy": round(final["return_mean"], 2) if final else None,
        "final_policy_sem": round(final["return_sem"], 2) if final else None,
        "env_steps_per_s": _mean([r["env_steps_per_s"] for r in progress]),
        "updates_per_s": _mean([r["updates_per_s"] for r in progress]),
        "curve": curve,
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.mean(values), 1) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--algos", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--budget", type=int, default=2_000_000, help="env steps, PPO runs")
    parser.add_argument("--iql-budget", type=int, default=300_000, help="env steps, IQL runs")
    parser.add_argument(
        "--vd-budget", type=int, default=300_000, help="env steps, VDN and QMIX runs"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bare-seconds", type=float, default=10.0)
    parser.add_argument(
        "--final-episodes",
        type=int,
        default=1000,
        help="episodes that judge each run's final policies (0: skip)",
    )
    args = parser.parse_args()

    random_mean, random_std = random_team_return(200, args.seed)
    bare = bare_rate(args.bare_seconds)
    print(f"random policy: team return {random_mean:.1f} +- {random_std:.1f} (200 episodes)")
    print(f"bare loop (env + MAPPO actor), {cores()} cores: {bare:,.0f} env steps/s")
    print("(measured again after each run: a run's ratios use the mean of the two around it)\n")
    figures: dict[str, float | None] = {"random_team_return": round(random_mean, 2)}
    updates: dict[str, float] = {}
    for algo in (a for a in args.algos if a in ON_POLICY):
        updates[algo] = update_seconds_per_env_step(algo)
        ceiling = ceiling_rate(bare, updates[algo])
        print(
            f"{algo} update: {updates[algo] * 1e6:.0f} us of one thread per env step; ceiling of "
            f"env + actor + update on {cores()} cores: {ceiling:,.0f} env steps/s "
            f"({ceiling / bare:.2f} of the bare loop)"
        )
        figures[f"{algo}_update_us_per_env_step"] = round(updates[algo] * 1e6, 1)
        figures[f"{algo}_ceiling_env_steps_per_s"] = round(ceiling, 1)
        figures[f"{algo}_ceiling_vs_bare_ratio"] = round(ceiling / bare, 3)
    bares = [bare]
    header = f"{'algo':<6} {'ranks':>5} {'steps':>9} {'train s':>8} {'final eval':>10}"
    header += f" {'best':>7} {'final policy':>14} {'steps/s':>8} {'updates/s':>9}"
    print(header + f" {'vs bare':>7} {'vs ceil':>7}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="hpcmarl-bench-marl-") as tmp:
        for ranks in args.ranks:
            for algo in args.algos:
                budget = {"iql": args.iql_budget, "vdn": args.vd_budget, "qmix": args.vd_budget}
                budget = budget.get(algo, args.budget)
                run_dir = Path(tmp) / f"{algo}-{ranks}"
                run = one_run(algo, ranks, budget, args.seed, run_dir, args.final_episodes)
                runs.append(run)
                bares.append(bare_rate(args.bare_seconds))
                around = statistics.mean(bares[-2:])
                rate = run["env_steps_per_s"] or 0.0
                ratio = rate / around
                ceiling = ceiling_rate(around, updates[algo]) if algo in updates else None
                vs_ceiling = f"{rate / ceiling:.2f}" if ceiling else "-"
                policy = run["final_policy"]
                policy_text = "-" if policy is None else f"{policy} +- {run['final_policy_sem']}"
                print(
                    f"{algo:<6} {ranks:>5} {run['env_steps'] or 0:>9,} {run['train_s'] or 0:>8}"
                    f" {run['final_eval']!s:>10} {run['best_eval']!s:>7} {policy_text:>14}"
                    f" {run['env_steps_per_s']!s:>8} {run['updates_per_s']!s:>9} {ratio:>7.2f}"
                    f" {vs_ceiling:>7} (bare {bares[-2]:,.0f} -> {bares[-1]:,.0f})"
                    + ("" if run["ok"] else "  (job failed)"),
                    flush=True,
                )
                name = f"{algo}_n{ranks}"
                figures[f"{name}_final_eval"] = run["final_eval"]
                figures[f"{name}_best_eval"] = run["best_eval"]
                figures[f"{name}_final_policy"] = run["final_policy"]
                figures[f"{name}_final_policy_sem"] = run["final_policy_sem"]
                figures[f"{name}_train_s"] = run["train_s"]
                figures[f"{name}_env_steps_per_s"] = run["env_steps_per_s"]
                figures[f"{name}_updates_per_s"] = run["updates_per_s"]
                figures[f"{name}_bare_env_steps_per_s"] = round(around, 1)
                figures[f"{name}_throughput_ratio"] = round(ratio, 3)
                if ceiling:
                    figures[f"{name}_ceiling_ratio"] = round(rate / ceiling, 3)
    print("\neval team return by env steps (and seconds):")
    for run in runs:
        points = ", ".join(f"{s // 1000}k/{t:.0f}s {r:.1f}" for s, t, r in run["curve"][::3])
        print(f"  {run['algo']} -n {run['ranks']}: {points}")
    figures["bare_env_steps_per_s"] = round(statistics.mean(bares), 1)
    figures["bare_spread_ratio"] = round(min(bares) / max(bares), 3)
    print(f"\nbare loop over the session: {', '.join(f'{b:,.0f}' for b in bares)} env steps/s")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
