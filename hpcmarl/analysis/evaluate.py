"""`python -m hpcmarl evaluate RUN_DIR`: the greedy return of a checkpoint's policies, offline.

A run's own evaluations are 32 episodes every few seconds, enough to draw a curve but with a
standard error of about 2 on simple_spread. Judging a finished run (does it reach a target,
which of two runs is better) needs the final policies played for many more episodes, without
MPI or a running job. The policies come from the parameter servers' tables in the checkpoint
(weights and PolicySpec, as collectors build them), the environment and the agents' policies
from the run's `config.yaml`, and the episodes are played as a collector's evaluation plays
them (`roles.evaluation`), so the figures are the same kind as the run's own.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..storage.policies import chosen_checkpoint, policy_tables

CHUNK_EPISODES = 100
"""Episodes played at once (one env copy each): bounds memory for any --episodes."""


def evaluate_run(
    run_dir: str | Path,
    episodes: int,
    checkpoint: str | None = None,
    seed: int = 0,
    random_baseline: bool = False,
) -> dict[str, Any]:
    """Team and per-agent greedy returns of the run's policies at one checkpoint (the newest
    intact one by default), over `episodes` episodes from start states drawn by `seed`; with
    `random_baseline`, also uniformly random play's (`random`) on the same start states."""
    from ..algos.actors import UniformActor
    from ..config.loader import load_job
    from ..envs import make_vector_env
    from ..launch.build import frame_stack_of, probe_env
    from ..policy import actor_of

    run_dir = Path(run_dir)
    job = run_dir / "config.yaml"
    if not job.is_file():
        raise UserError(f"{run_dir} holds no config.yaml: not a run directory", "name a RUN_DIR")
    cfg = load_job(str(job))
    if cfg.psro.enabled:
        raise UserError(
            f"{run_dir} is a PSRO run, whose policies are judged by exploitability, not return",
            f"read its exploitability with python -m hpcmarl analyze {run_dir}",
        )
    ckpt = chosen_checkpoint(run_dir, checkpoint)
    tables = policy_tables(ckpt)
    spec = probe_env(cfg)
    bindings = spec.bindings(cfg.agents.strategy_spec_id)
    missing = sorted(set(bindings.values()) - set(tables))
    if missing:
        raise UserError(
            f"checkpoint {ckpt.id} of {run_dir} holds no weights for {', '.join(missing)}",
            "evaluate a later checkpoint (--checkpoint), after the learners first published",
        )
    actors = {key: actor_of(tables[key]) for key in set(bindings.values())}
    make_env = functools.partial(make_vector_env, cfg.env, frame_stack=frame_stack_of(cfg))
    played = _play(make_env, actors, bindings, episodes, seed)
    info = ckpt.info().get("counters", {})
    result = {
        "run_dir": str(run_dir),
        "checkpoint": ckpt.id,
        "env_steps": info.get("env_steps"),
        "versions": {key: tables[key].version for key in sorted(actors)},
        "seed": seed,
        **played,
    }
    if random_baseline:
        uniform = {key: UniformActor(actor.spec) for key, actor in actors.items()}
        result["random"] = _play(make_env, uniform, bindings, episodes, seed)
    return result


def _play(
    make_env: Callable[[int, int], Any],
    actors: dict[str, Any],
    bindings: dict[str, str],
    episodes: int,
    seed: int,
) -> dict[str, Any]:
    """Greedy episodes as a collector's evaluation plays them, `CHUNK_EPISODES` at a time; the
    start states depend on `seed` and the episode's number only."""
    from ..roles.evaluation import Evaluation

    team: list[np.ndarray] = []
    per_agent: dict[str, list[np.ndarray]] = {a: [] for a in bindings}
    lengths: list[np.ndarray] = []
    for first in range(0, episodes, CHUNK_EPISODES):
        env = make_env(min(CHUNK_EPISODES, episodes - first), seed + first)
        evaluation = Evaluation(env, actors, bindings)
        while not evaluation.step():
            pass
        team.append(np.sum(list(evaluation.agent_returns.values()), axis=0))
        for agent in per_agent:
            per_agent[agent].append(evaluation.agent_returns[agent])
        lengths.append(evaluation.lengths)
        env.close()
    returns = np.concatenate(team)
    return {
        "episodes": int(len(returns)),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_sem": float(returns.std() / math.sqrt(len(returns))),
        "length_mean": float(np.concatenate(lengths).mean()),
        "agent_returns": {a: float(np.concatenate(r).mean()) for a, r in per_agent.items()},
    }


def evaluate_main(argv: list[str]) -> int:
    """Print a checkpoint's greedy returns; one JSON object with --json."""
    from .cli import guarded

    args = _parser().parse_args(argv)
    return guarded(lambda: _evaluate(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpcmarl evaluate",
        description="Play a run's checkpointed policies greedily, offline, for many episodes.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--episodes", type=int, default=1000, help="episodes to play (default 1000)")
    p.add_argument("--checkpoint", help="checkpoint id such as 000005 (default: the newest)")
    p.add_argument("--seed", type=int, default=0, help="seed of the start states (default 0)")
    p.add_argument(
        "--random",
        action="store_true",
        help="also play uniformly random actions on the same start states, as the baseline",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _evaluate(args: argparse.Namespace) -> int:
    import json

    if args.episodes < 1:
        raise UserError(f"--episodes {args.episodes} plays nothing", "give --episodes 1 or more")
    result = evaluate_run(args.run_dir, args.episodes, args.checkpoint, args.seed, args.random)
    if args.json:
        print(json.dumps(result))
        return 0
    agents = "  ".join(f"{a} {r:.2f}" for a, r in result["agent_returns"].items())
    steps = result["env_steps"]
    print(
        f"checkpoint {result['checkpoint']}"
        + (f" ({steps:,} env steps)" if steps is not None else "")
        + f": greedy return {result['return_mean']:.2f} +- {result['return_sem']:.2f} "
        f"(std {result['return_std']:.2f}) over {result['episodes']} episodes"
    )
    if len(result["agent_returns"]) > 1:
        print(f"per agent: {agents}")
    if "random" in result:
        uniform = result["random"]
        print(
            f"uniformly random play on the same start states: {uniform['return_mean']:.2f} +- "
            f"{uniform['return_sem']:.2f} (std {uniform['return_std']:.2f})"
        )
    return 0
