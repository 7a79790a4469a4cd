"""Losing collectors mid-run (`runtime.fault_tolerance=collectors`): what it costs the run.

For each algorithm (DQN on CartPole, `jobs/cartpole_fast.yaml`; MAPPO on simple_spread,
`jobs/spread_mappo.yaml`) and each seed, two runs of the same job with N collectors, one rank
each (`topology.colocate=false`, so a collector's rank hosts nothing else): a fault-free one,
then one in which k collectors' ranks are killed from outside with `kill -9`, at env step counts
drawn from a seeded RNG between 20 % and 80 % of the step budget (the collector too: any of
those left, never the last). The two alternate, so that both meet the same load on a shared
machine. Both run under fault tolerance: the kills are the only difference. Each run reports:

- detection time: from the kill (wall clock here) to the commander's line
  `hpcmarl: lost rank R (collectorN) ...` reaching this script on the run's stdout, so it
  includes mpirun's forwarding of the line;
- replacement time, with `--respawn` (`runtime.respawn_collectors=true`): from the commander
  hearing of the loss to the replacement's first task (the `rank_respawned` row's
  `seconds_to_first_task`; add the detection time for the time from the kill); without it
  no replacement is spawned ("off");
- env steps lost, a bound: a killed collector's unfinished task is failed (`task_failed` row,
  cause `rank lost: ...`) and its steps are never counted, while what it inserted before is
  kept; at most the whole task (fragment_length x fragments_per_task x num_envs env steps) is
  lost per failed task. Its share of the run's env steps has a target of <= 1 %;
- the final return: the final policy's greedy return over `--final-episodes` episodes from the
  same start states for every run (`python -m hpcmarl evaluate`'s, on the checkpoint written at
  the end), against the fault-free runs' range of the same algorithm (target: inside it), beside
  uniformly random play's on the same start states; the run's last in-run evaluation as well;
- every run's exit code.

    .venv/bin/python tools/bench_faults.py [--algos dqn mappo] [--seeds 0 1 2] [--kills 1]
                                           [--collectors 4] [--steps 15000 60000] [--quick]
                                           [--respawn]

The defaults (12 runs) took 4 minutes on the 2-core VM at load 4; one seed of them took
3.4 minutes at load 8.
Prints one row per run, a summary per algorithm and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from launcher import hpcmarl_command, hpcmarl_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hpcmarl.config.loader import load_job  # noqa: E402
from hpcmarl.launch.lost_rank import RANK_MAP_ENV, read_rank_map  # noqa: E402
from hpcmarl.testing.ranks import rank_pids  # noqa: E402

JOBS = {"dqn": "jobs/cartpole_fast.yaml", "mappo": "jobs/spread_mappo.yaml"}
STEPS = {"dqn": 15_000, "mappo": 60_000}
QUICK_STEPS = {"dqn": 4_000, "mappo": 20_000}
OTHER_RANKS = 4
"""commander, ps0, replay0 and learner0, one rank each, before the collectors' ranks."""
KILL_WINDOW = (0.2, 0.8)
"""Where in the step budget the kills fall."""
RUN_TIMEOUT_S = 900.0
LOST_LINE = re.compile(r"hpcmarl: lost rank (\d+) \(([^)]*)\)")


@dataclass
class Kill:
    rank: int
    roles: list[str]
    at_env_steps: int
    at: float
    """time.monotonic() of the kill."""
    detected_s: float | None = None


@dataclass
class Run:
    algo: str
    seed: int
    faulty: bool
    exit_code: int | None = None
    wall_s: float = 0.0
    env_steps: int = 0
    final_return: float | None = None
    """The final policy's greedy return over the bench's own episodes."""
    last_eval: float | None = None
    random_return: float | None = None
    kills: list[Kill] = field(default_factory=list)
    rank_lost_rows: int = 0
    failed_tasks: int = 0
    steps_lost_bound: int = 0
    replaced_s: list[float] = field(default_factory=list)
    """Each replacement's seconds from its loss heard to its first task (`--respawn`)."""
    respawn: bool = False
    tail: str = ""


def task_env_steps(algo: str) -> int:
    """Env steps of one collector task of the job: all a lost collector can take with it."""
    cfg = load_job(str(ROOT / JOBS[algo]))
    return cfg.collector.fragment_length * cfg.collector.fragments_per_task * cfg.env.num_envs


def job_args(
    algo: str, seed: int, collectors: int, steps: int, run_dir: Path, respawn: bool
) -> list[str]:
    return [
        JOBS[algo],
        f"seed={seed}",
        "runtime.fault_tolerance=collectors",
        f"runtime.respawn_collectors={str(respawn).lower()}",
        "topology.param_servers=1",
        "topology.replay_shards=1",
        "topology.learners=1",
        f"topology.collectors={collectors}",
        "topology.colocate=false",
        f"commander.max_env_steps={steps}",
        "commander.stop_value=null",
        "commander.progress_interval_s=0.5",
        "commander.eval_interval_s=" + ("2" if algo == "dqn" else "8"),
        "checkpoint.at_end=true",
        f"runtime.run_dir={run_dir}",
    ]


class Lines:
    """A stream's lines with the wall clock of their arrival, read by a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line))

    def join(self) -> None:
        self._thread.join(timeout=10)

    def text(self) -> str:
        return "".join(line for _, line in self.lines)


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return rows


def collector_ranks(run_dir: Path, pids: dict[int, int]) -> dict[int, list[str]]:
    """rank -> roles of each collector-only rank, from the rank map the launcher's ranks name
    in their environment (`HPCMARL_RANK_MAP`)."""
    for pid in pids.values():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        for var in environ.split("\0"):
            if var.startswith(f"{RANK_MAP_ENV}="):
                ranks = read_rank_map(var.split("=", 1)[1])
                return {
                    rank: roles
                    for rank, (_, roles) in ranks.items()
                    if roles and all(r.startswith("collector") for r in roles)
                }
    return {}


def one_run(
    algo: str,
    seed: int,
    collectors: int,
    steps: int,
    kills: int,
    run_dir: Path,
    episodes: int,
    respawn: bool,
) -> Run:
    """The job to its step budget, killing `kills` collector ranks on the way."""
    run = Run(algo, seed, faulty=kills > 0, respawn=respawn)
    rng = np.random.default_rng([seed, list(JOBS).index(algo), 33])
    targets = sorted(int(f * steps) for f in rng.uniform(*KILL_WINDOW, size=kills))
    cmd = hpcmarl_command(
        OTHER_RANKS + collectors, job_args(algo, seed, collectors, steps, run_dir, respawn)
    )
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=hpcmarl_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    while proc.poll() is None:
        if time.monotonic() - start > RUN_TIMEOUT_S:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if targets:
            progress = [r for r in metrics_rows(run_dir) if r["kind"] == "progress"]
            if progress and progress[-1]["env_steps"] >= targets[0]:
                kill_one(run, run_dir, rng, progress[-1]["env_steps"])
                targets.pop(0)
        time.sleep(0.1)
    proc.wait()
    out.join()
    err.join()
    run.exit_code = proc.returncode
    run.wall_s = time.monotonic() - start
    for kill in run.kills:
        seen = [
            t for t, line in out.lines if (m := LOST_LINE.search(line)) and int(m[1]) == kill.rank
        ]
        kill.detected_s = seen[0] - kill.at if seen else None
    rows = metrics_rows(run_dir)
    evals = [r for r in rows if r["kind"] == "eval"]
    run.last_eval = evals[-1]["return_mean"] if evals else None
    if run.exit_code == 0 and episodes:
        from hpcmarl.analysis.evaluate import evaluate_run

        final = evaluate_run(run_dir, episodes, seed=10_000_000, random_baseline=True)
        run.final_return = final["return_mean"]
        run.random_return = final["random"]["return_mean"]
    ended = [r for r in rows if r["kind"] in ("finished", "progress")]
    run.env_steps = ended[-1]["env_steps"] if ended else 0
    run.rank_lost_rows = sum(r["kind"] == "rank_lost" for r in rows)
    run.replaced_s = [r["seconds_to_first_task"] for r in rows if r["kind"] == "rank_respawned"]
    run.failed_tasks = sum(
        r["kind"] == "task_failed" and str(r.get("cause", "")).startswith("rank lost") for r in rows
    )
    run.steps_lost_bound = run.failed_tasks * task_env_steps(algo)
    if run.exit_code != 0:
        run.tail = (err.text() or out.text())[-2000:]
    return run


def kill_one(run: Run, run_dir: Path, rng: np.random.Generator, env_steps: int) -> None:
    """`kill -9` of one collector rank not yet killed, chosen by `rng`; never the last one."""
    pids = rank_pids(run_dir)
    ranks = collector_ranks(run_dir, pids)
    alive = sorted(r for r in ranks if r in pids and r not in {k.rank for k in run.kills})
    if len(alive) < 2:
        return
    rank = int(rng.choice(alive))
    os.kill(pids[rank], signal.SIGKILL)
    run.kills.append(Kill(rank, ranks[rank], env_steps, time.monotonic()))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_run(run: Run) -> None:
    detected = ", ".join(fmt(k.detected_s) for k in run.kills) or "-"
    replaced = ", ".join(fmt(s) for s in run.replaced_s) or ("-" if run.respawn else "off")
    at = ", ".join(f"{k.at_env_steps:,}" for k in run.kills) or "-"
    lost = run.steps_lost_bound / run.env_steps if run.env_steps else None
    print(
        f"{run.algo:<6} {run.seed:>4} {'kill' if run.faulty else 'free':>5} {run.exit_code!s:>4}"
        f" {run.wall_s:>7.1f} {run.env_steps:>9,} {at:>16} {detected:>12}"
        f" {replaced if run.faulty else '-':>10} {run.failed_tasks:>6}"
        f" {run.steps_lost_bound if run.faulty else '-':>8}"
        f" {fmt(100 * lost if run.faulty and lost is not None else None, '.2f'):>7}"
        f" {fmt(run.last_eval):>9} {fmt(run.final_return):>9}",
        flush=True,
    )
    if run.exit_code != 0:
        print("  run failed; its output ends:\n  " + run.tail.replace("\n", "\n  "), flush=True)


def summarise(algo: str, runs: list[Run]) -> dict[str, Any]:
    free = [r for r in runs if not r.faulty]
    faulty = [r for r in runs if r.faulty]
    free_returns = [r.final_return for r in free if r.final_return is not None]
    low, high = (min(free_returns), max(free_returns)) if free_returns else (None, None)
    detections = [k.detected_s for r in faulty for k in r.kills if k.detected_s is not None]
    replaced = [s for r in faulty for s in r.replaced_s]
    killed = sum(len(r.kills) for r in faulty)
    shares = [r.steps_lost_bound / r.env_steps for r in faulty if r.env_steps]
    inside = [
        low is not None
        and high is not None
        and r.final_return is not None
        and low <= r.final_return <= high
        for r in faulty
    ]
    randoms = [r.random_return for r in runs if r.random_return is not None]
    random = randoms[0] if randoms else None
    fig: dict[str, Any] = {
        f"{algo}_random_return": _round(random),
        f"{algo}_kills": killed,
        f"{algo}_detected": len(detections),
        f"{algo}_detection_s_median": round(statistics.median(detections), 3)
        if detections
        else None,
        f"{algo}_detection_s_max": round(max(detections), 3) if detections else None,
        f"{algo}_replacement_s_max": round(max(replaced), 3) if replaced else None,
        f"{algo}_replacements": len(replaced),
        f"{algo}_steps_lost_bound_max_ratio": round(max(shares), 5) if shares else None,
        f"{algo}_free_return_min": _round(low),
        f"{algo}_free_return_max": _round(high),
        f"{algo}_faulty_returns": [_round(r.final_return) for r in faulty],
        f"{algo}_faulty_inside_free_range": sum(inside),
        f"{algo}_faulty_runs": len(faulty),
        f"{algo}_exit_codes_free": [r.exit_code for r in free],
        f"{algo}_exit_codes_faulty": [r.exit_code for r in faulty],
    }
    print(
        f"{algo}: {killed} kills, {len(detections)} detected, detection median "
        f"{fmt(fig[f'{algo}_detection_s_median'])} s, max {fmt(fig[f'{algo}_detection_s_max'])} s"
        f" (target <= 2 s); {len(replaced)} replaced, first task at most "
        f"{fmt(fig[f'{algo}_replacement_s_max'])} s after the loss (target 5 s); env steps lost <= "
        f"{fmt(100 * max(shares) if shares else None)} % of a run's (bound, target <= 1 %); "
        f"final return of faulty runs {fig[f'{algo}_faulty_returns']} against fault-free "
        f"{fmt(low)} .. {fmt(high)}: {sum(inside)} of {len(faulty)} inside; random policy "
        f"{fmt(random)}",
        flush=True,
    )
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kills", type=int, default=1, help="collectors killed per faulty run")
    parser.add_argument("--collectors", type=int, default=4, help="one rank each")
    parser.add_argument(
        "--steps",
        type=int,
        nargs="+",
        help=f"env step budget per algorithm, in --algos order (default {STEPS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: seed 0, 3 collectors, budgets {QUICK_STEPS}",
    )
    parser.add_argument(
        "--final-episodes",
        type=int,
        default=50,
        help="greedy episodes that judge each run's final policy (0: skip)",
    )
    parser.add_argument(
        "--respawn",
        action="store_true",
        help="runtime.respawn_collectors=true: a new rank replaces each lost collector",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.collectors = args.seeds[:1], 3
    if args.kills >= args.collectors:
        parser.error(f"--kills {args.kills} must leave a collector of --collectors")
    defaults = QUICK_STEPS if args.quick else STEPS
    budgets = dict(zip(args.algos, args.steps or [defaults[a] for a in args.algos], strict=True))

    task = {algo: task_env_steps(algo) for algo in args.algos}
    print(
        f"{args.collectors} collectors (one rank each, {OTHER_RANKS + args.collectors} ranks), "
        f"{args.kills} killed per faulty run (kill -9 between {KILL_WINDOW[0]:.0%} and "
        f"{KILL_WINDOW[1]:.0%} of the budget); budgets {budgets}; env steps per task {task}; "
        f"final policies judged over {args.final_episodes} episodes"
    )
    print(
        f"{'algo':<6} {'seed':>4} {'run':>5} {'exit':>4} {'wall s':>7} {'env steps':>9}"
        f" {'killed at steps':>16} {'detect s':>12} {'replace s':>10} {'failed':>6}"
        f" {'lost <=':>8} {'lost %':>7} {'last eval':>9} {'final ret':>9}"
    )
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="hpcmarl-bench-faults-") as tmp:
        for seed in args.seeds:
            for algo in args.algos:
                for kills in (0, args.kills):  # fault-free, then faulty: alternating
                    run_dir = Path(tmp) / f"{algo}-{seed}-{'kill' if kills else 'free'}"
                    run = one_run(
                        algo,
                        seed,
                        args.collectors,
                        budgets[algo],
                        kills,
                        run_dir,
                        args.final_episodes,
                        args.respawn,
                    )
                    runs.append(run)
                    print_run(run)
    print()
    figures: dict[str, Any] = {
        "collectors": args.collectors,
        "kills_per_run": args.kills,
        "seeds": args.seeds,
        "cores": len(os.sched_getaffinity(0)),
    }
    for algo in args.algos:
        figures[f"{algo}_steps"] = budgets[algo]
        figures.update(summarise(algo, [r for r in runs if r.algo == algo]))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
