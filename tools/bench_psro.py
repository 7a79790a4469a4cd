"""PSRO on OpenSpiel poker: exploitability against iterations, env steps and wall time.

For each game (kuhn, leduc; kuhn_ppo is Kuhn poker with PPO as the best-response oracle) and
world size this runs the game's job file under `mpirun -n N` for `--iterations` PSRO
iterations and reads the `psro` rows of its `metrics.jsonl`. In the same run it measures the
two baselines:

- the uniform random policy's exploitability, scored by OpenSpiel (the number to beat);
- a bare loop of the same game and the job's actor (DQN's epsilon-greedy or PPO's sampling over
  the legal actions), one process per core for a few seconds: the machine's env steps/s
  without hpcmarl, which the best-response training rate is divided by (`*_collect_ratio`).

    .venv/bin/python tools/bench_psro.py [--games kuhn leduc kuhn_ppo] [--ranks 4 16]
                                         [--iterations 20] [--seed 0]

Prints one table row per run, each run's exploitability curve, and, as its last line, one JSON
object of the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_marl import bare_rate, cores, launch  # noqa: E402 - one harness for both

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "kuhn": "jobs/kuhn_psro.yaml",
    "leduc": "jobs/leduc_psro.yaml",
    "kuhn_ppo": "jobs/kuhn_psro_ppo.yaml",
}
GAMES = {"kuhn": "kuhn_poker", "leduc": "leduc_poker", "kuhn_ppo": "kuhn_poker"}
TARGETS = {"kuhn": 0.05, "leduc": 0.5, "kuhn_ppo": 0.05}
"""The issue's exploitability targets."""
FIGURES = {
    "final_exploitability": "final",
    "best_exploitability": "best",
    "first_iteration_at_target": "first_at_target",
    "s_per_iteration": "iteration_s",
    "env_steps_per_s": "env_steps_per_s",
}
"""JSON figure (after `{game}_n{ranks}_`) -> the run's field."""


def uniform_exploitability(game_name: str) -> float:
    import pyspiel
    from open_spiel.python import policy

    from hpcmarl.psro.exploitability import score

    game = pyspiel.load_game(GAMES[game_name])
    return score(game, policy.UniformRandomPolicy(game)).exploitability


def _bare_loop(job: str, seconds: float, seed: int, out: mp.Queue) -> None:
    """One core's env steps/s: the job's vector env and its actor, nothing else."""
    import torch

    from hpcmarl.algos.actors import build_actor
    from hpcmarl.config.loader import load_job
    from hpcmarl.envs import make_vector_env
    from hpcmarl.launch.build import build_population, probe_env

    torch.set_num_threads(1)
    cfg = load_job(str(ROOT / job))
    env = make_vector_env(cfg.env, cfg.env.num_envs, seed)
    population = build_population(cfg, probe_env(cfg))
    actors = {key: build_actor(population.spec(key)) for key in population.keys()}
    rng = np.random.default_rng(seed)
    for actor in actors.values():
        actor.set_weights((0.1 * rng.standard_normal(actor.spec.size)).astype(np.float32))
    bound = dict(zip(env.agents, actors.values(), strict=True))
    obs, steps = env.reset(), 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        masks = env.action_masks
        assert masks is not None
        actions = {
            agent: actor.act(
                obs[agent], rng, env_steps=0, greedy=False, action_mask=masks[agent]
            ).actions
            for agent, actor in bound.items()
        }
        obs = env.step(actions).observations
        steps += env.num_envs
    out.put(steps / (time.perf_counter() - start))


def one_run(game: str, ranks: int, iterations: int, seed: int, run_dir: Path) -> dict:
    """The job for `iterations` PSRO iterations; what its metrics say."""
    args = [JOBS[game], f"seed={seed}", f"psro.iterations={iterations}"]
    result, wall, rows = launch(ranks, args, run_dir)
    psro = [r for r in rows if r["kind"] == "psro"]
    progress = [r for r in rows if r["kind"] == "progress" and r["env_steps_per_s"] > 0]
    curve = [(r["iteration"], r["env_steps"], r["time_s"], r["exploitability"]) for r in psro]
    reached = [it for it, _, _, e in curve if e <= TARGETS[game]]
    times = [t for _, _, t, _ in curve]
    per_iteration = np.diff(times) if len(times) > 1 else np.array([])
    return {
        "game": game,
        "ranks": ranks,
        "ok": result.returncode == 0,
        "tail": (result.stdout + result.stderr)[-1500:],
        "wall_s": round(wall, 1),
        "iterations": len(psro) - 1,
        "final": round(curve[-1][3], 4) if curve else None,
        "best": round(min(e for *_, e in curve), 4) if curve else None,
        "first_at_target": reached[0] if reached else None,
        "iteration_s": round(float(np.mean(per_iteration)), 1) if len(per_iteration) else None,
        "env_steps_per_s": round(float(np.median([r["env_steps_per_s"] for r in progress])), 1)
        if progress
        else None,
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=["kuhn", "leduc"], choices=list(JOBS))
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bare-seconds", type=float, default=8.0)
    args = parser.parse_args()

    figures: dict[str, float | int | None] = {}
    bare: dict[str, float] = {}
    for game in args.games:
        uniform = uniform_exploitability(game)
        bare[game] = bare_rate(args.bare_seconds, _bare_loop, JOBS[game])
        figures[f"{game}_uniform_exploitability"] = round(uniform, 4)
        figures[f"{game}_bare_env_steps_per_s"] = round(bare[game], 1)
        print(
            f"{game}: uniform random policy exploitability {uniform:.4f}; bare loop (env + "
            f"actor), {cores()} cores: {bare[game]:,.0f} env steps/s"
        )
    print(
        f"\n{'game':<8} {'ranks':>5} {'iters':>5} {'final':>7} {'best':>7} {'at target':>9} "
        f"{'s/iter':>7} {'steps/s':>8} {'vs bare':>7}"
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="hpcmarl-bench-psro-") as tmp:
        for game in args.games:
            for ranks in args.ranks:
                run = one_run(game, ranks, args.iterations, args.seed, Path(tmp) / f"{game}{ranks}")
                runs.append(run)
                ratio = (run["env_steps_per_s"] or 0.0) / bare[game]
                print(
                    f"{game:<8} {ranks:>5} {run['iterations']:>5} {run['final']!s:>7} "
                    f"{run['best']!s:>7} {run['first_at_target']!s:>9} {run['iteration_s']!s:>7} "
                    f"{run['env_steps_per_s']!s:>8} {ratio:>7.2f}"
                    + ("" if run["ok"] else f"  (job failed)\n{run['tail']}"),
                    flush=True,
                )
                figures |= {f"{game}_n{ranks}_{k}": run[v] for k, v in FIGURES.items()}
                figures[f"{game}_n{ranks}_collect_ratio"] = round(ratio, 3)
    print("\nexploitability by iteration (env steps, seconds):")
    for run in runs:
        points = ", ".join(f"{i}: {e:.3f} ({s // 1000}k, {t:.0f}s)" for i, s, t, e in run["curve"])
        print(f"  {run['game']} -n {run['ranks']}: {points}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
