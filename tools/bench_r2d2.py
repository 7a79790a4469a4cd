"""R2D2 on the velocity-free CartPole: greedy eval return against env steps and wall time,
beside a feed-forward DQN on the same budget, the same DQN given 4 stacked frames
(`jobs/cartpole_novel_stacked.yaml`: `replay.stack_num` 4, `ignore_obs_next`) and the random
policy, measured in one run.

Only the cart position and the pole angle are observed (`hpcmarl.envs.partial`), so a policy
without memory cannot tell which way the pole is moving. For each world size this runs
`jobs/cartpole_novel_r2d2.yaml` and the default DQN job (see `RUNS`) on the same environment under
`mpirun -n N` to a step budget (or until the eval reaches 475) and reads `metrics.jsonl`.
The baselines measured here:

- the random policy's return (uniform actions, 200 episodes);
- a bare loop of the same vector env and R2D2's recurrent actor (a GRU step per env step),
  one process per core: the machine's env steps/s without hpcmarl, which R2D2's throughput is
  divided by (`*_throughput_ratio`).

    .venv/bin/python tools/bench_r2d2.py [--ranks 1 4] [--budget 300000] [--seed 0]
                                         [--runs r2d2 dqn stacked]

Prints one table row per run, the eval curves, and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium
import numpy as np
from bench_marl import bare_rate, cores, launch

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "hpcmarl.envs.partial:CartPoleNoVelocity-v1"
RUNS = {
    "r2d2": ["jobs/cartpole_novel_r2d2.yaml"],
    "dqn": ["jobs/cartpole_dqn.yaml", f"env.id={ENV_ID}", "replay.samples_per_insert=8"],
    "stacked": ["jobs/cartpole_novel_stacked.yaml"],
}
"""The DQN is the default job on the same env with 8 samples per insert instead of 64: its
plateau (about 45) does not move with more updates, which would take an hour to 300k steps."""


def random_return(episodes: int, seed: int) -> float:
    env = gymnasium.make(ENV_ID)
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def _bare_loop(seconds: float, seed: int, out: mp.Queue) -> None:
    """One core's env steps/s: R2D2's vector env and recurrent actor, its state carried."""
    import torch

    from hpcmarl.algos.actors import build_actor
    from hpcmarl.config.loader import load_job
    from hpcmarl.envs import make_vector_env
    from hpcmarl.launch.build import build_population, probe_env
    from hpcmarl.roles.acting import Memory, act_all

    torch.set_num_threads(1)
    cfg = load_job(str(ROOT / RUNS["r2d2"][0]))
    population = build_population(cfg, probe_env(cfg))
    (key,) = population.keys()
    actor = build_actor(population.spec(key))
    rng = np.random.default_rng(seed)
    actor.set_weights((0.1 * rng.standard_normal(actor.spec.size)).astype(np.float32))
    env = make_vector_env(cfg.env, cfg.env.num_envs, seed)
    bindings = dict.fromkeys(env.agents, key)
    memory, obs, steps = Memory(), env.reset(), 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions, _ = act_all({key: actor}, bindings, obs, rng, 0, greedy=False, memory=memory)
        step = env.step(actions)
        memory.reset(step.episode_ended)
        obs, steps = step.observations, steps + env.num_envs
    out.put(steps / (time.perf_counter() - start))


def one_run(name: str, ranks: int, budget: int, seed: int, run_dir: Path) -> dict:
    args = [
        *RUNS[name],
        f"seed={seed}",
        f"commander.max_env_steps={budget}",
        "commander.stop_value=475",
        "commander.eval_interval_s=10",
        "checkpoint.interval_s=0",
    ]
    result, wall, rows = launch(ranks, args, run_dir)
    evals = [r for r in rows if r["kind"] == "eval"]
    progress = [r for r in rows if r["kind"] == "progress" and r["time_s"] > 10]
    first_450 = next((r for r in evals if r["return_mean"] >= 450), None)
    return {
        "name": name,
        "ranks": ranks,
        "ok": result.returncode == 0,
        "wall_s": round(wall, 1),
        "env_steps": rows[-1].get("env_steps") if rows else None,
        "best_eval": round(max(r["return_mean"] for r in evals), 1) if evals else None,
        "steps_to_450": first_450["env_steps"] if first_450 else None,
        "seconds_to_450": round(first_450["time_s"], 1) if first_450 else None,
        "env_steps_per_s": _mean([r["env_steps_per_s"] for r in progress]),
        "curve": [(r["env_steps"], r["time_s"], r["return_mean"]) for r in evals],
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.mean(values), 1) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--budget", type=int, default=300_000, help="env steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bare-seconds", type=float, default=10.0)
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    args = parser.parse_args()

    random = random_return(200, args.seed)
    bare = bare_rate(args.bare_seconds, _bare_loop)
    print(f"random policy: return {random:.1f} (200 episodes)")
    print(f"bare loop (vector env + recurrent actor), {cores()} cores: {bare:,.0f} env steps/s\n")
    figures: dict[str, float | None] = {
        "random_return": round(random, 2),
        "bare_env_steps_per_s": round(bare, 1),
    }
    header = f"{'run':<7} {'ranks':>5} {'steps':>9} {'wall s':>7} {'best':>6} {'to 450':>9}"
    print(header + f" {'s to 450':>8} {'steps/s':>8} {'vs bare':>7}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="hpcmarl-bench-r2d2-") as tmp:
        for ranks in args.ranks:
            for name in args.runs:
                run = one_run(name, ranks, args.budget, args.seed, Path(tmp) / f"{name}-{ranks}")
                runs.append(run)
                ratio = (run["env_steps_per_s"] or 0.0) / bare
                print(
                    f"{name:<7} {ranks:>5} {run['env_steps'] or 0:>9,} {run['wall_s']:>7}"
                    f" {run['best_eval']!s:>6} {run['steps_to_450']!s:>9}"
                    f" {run['seconds_to_450']!s:>8} {run['env_steps_per_s']!s:>8} {ratio:>7.2f}"
                    + ("" if run["ok"] else "  (job failed)"),
                    flush=True,
                )
                key = f"{name}_n{ranks}"
                figures[f"{key}_best_eval"] = run["best_eval"]
                figures[f"{key}_steps_to_450"] = run["steps_to_450"]
                figures[f"{key}_seconds_to_450"] = run["seconds_to_450"]
                figures[f"{key}_env_steps_per_s"] = run["env_steps_per_s"]
                figures[f"{key}_throughput_ratio"] = round(ratio, 3)
    print("\ngreedy eval return by env steps (and seconds):")
    for run in runs:
        points = ", ".join(f"{s // 1000}k/{t:.0f}s {r:.0f}" for s, t, r in run["curve"][::2])
        print(f"  {run['name']} -n {run['ranks']}: {points}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
