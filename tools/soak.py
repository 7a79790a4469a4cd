"""Soak: resident memory of every rank of the default 16-rank job over a long run.

Runs `mpirun -n 16 python -m hpcmarl` on the default job with the stop value switched off, so
it trains until the wall-time limit, and reads `/proc/PID/status` (VmRSS) of every rank every
`--every` seconds. Bounded memory means that once the replay tables are full (the warm-up) no
rank keeps growing: the table compares each rank's RSS at the warm-up mark (5 min by default)
with its RSS at the end (30 min), and fits a slope over everything after the warm-up. Replay
evictions, fill and checkpoints come from the run's `progress.csv` and `checkpoints/`.

    .venv/bin/python tools/soak.py [--minutes 30] [--warmup-minutes 5] [--ranks 16]

The physical limit here is zero growth: `rss_end_over_warmup_ratio` is the largest ratio of a
rank's RSS at the end to its RSS at the warm-up mark (1.0 is flat).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher import hpcmarl_command, hpcmarl_env

from hpcmarl.storage.checkpoint import checkpoint_ids
from hpcmarl.testing.ranks import rank_pids, rss_mib

ROOT = Path(__file__).resolve().parents[1]
RANK_LINE = re.compile(r"^\s+rank\s+(\d+): (.*)$")


def slope_mib_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per hour."""
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return cov / var * 3600 if var else float("nan")


def nearest(samples: list[tuple[float, float]], at: float) -> float:
    return min(samples, key=lambda s: abs(s[0] - at))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--run-dir", type=Path, help="keep the run here (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra k=v overrides for the job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = (args.run_dir or Path(tmp) / "soak").resolve()
        soak(args, run_dir)


def soak(args: argparse.Namespace, run_dir: Path) -> None:
    seconds = args.minutes * 60
    warmup = args.warmup_minutes * 60
    cmd = hpcmarl_command(args.ranks, [
        "commander.stop_value=null",
        "commander.max_env_steps=1000000000",
        f"commander.max_wall_time_s={seconds}",
        f"runtime.run_dir={run_dir}",
        *args.overrides,
    ])  # fmt: skip
    log_path = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"soak: {' '.join(cmd[3:])}\nsoak: log {log_path}", flush=True)
    with open(log_path, "w") as log:
        job = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=hpcmarl_env()
        )
    start = time.monotonic()
    pids: dict[int, int] = {}
    samples: dict[int, list[tuple[float, float]]] = {}
    try:
        while job.poll() is None:
            now = time.monotonic() - start
            if len(pids) < args.ranks:
                pids = rank_pids(run_dir)
            for rank, pid in pids.items():
                mib = rss_mib(pid)
                if mib is not None:
                    samples.setdefault(rank, []).append((now, mib))
            time.sleep(args.every)
    except KeyboardInterrupt:
        job.send_signal(signal.SIGINT)
    job.wait()
    report(args, run_dir, log_path, samples, warmup, job.returncode)


def roles_by_rank(log_path: Path) -> dict[int, str]:
    roles = {}
    for line in log_path.read_text(errors="replace").splitlines():
        match = RANK_LINE.match(line)
        if match:
            roles[int(match.group(1))] = match.group(2)
    return roles


def report(
    args: argparse.Namespace,
    run_dir: Path,
    log_path: Path,
    samples: dict[int, list[tuple[float, float]]],
    warmup: float,
    returncode: int,
) -> None:
    roles = roles_by_rank(log_path)
    # Training starts after MPI start-up: measure the marks from the first sample.
    first = min((s[0][0] for s in samples.values() if s), default=0.0)
    print(
        f"\n{'rank':>4} {'roles':<34} {'start MiB':>9} {'warm MiB':>8} {'end MiB':>8} "
        f"{'max MiB':>8} {'end/warm':>8} {'MiB/h after warm-up':>19}"
    )
    ratios, slopes, ends = [], [], []
    for rank in sorted(samples):
        series = samples[rank]
        after = [s for s in series if s[0] - first >= warmup]
        at_warm = nearest(series, first + warmup)
        at_end = series[-1][1]
        ratio = at_end / at_warm
        slope = slope_mib_per_hour(after)
        ratios.append(ratio)
        slopes.append(slope)
        ends.append(at_end)
        print(
            f"{rank:>4} {roles.get(rank, '?')[:34]:<34} {series[0][1]:9.1f} {at_warm:8.1f} "
            f"{at_end:8.1f} {max(m for _, m in series):8.1f} {ratio:8.3f} {slope:19.2f}"
        )
    progress = list(csv.DictReader((run_dir / "progress.csv").read_text().splitlines()))
    last = progress[-1] if progress else {}
    full_at = next((r["time_s"] for r in progress if float(r["replay_fill"] or 0) >= 0.999), None)
    checkpoints = checkpoint_ids(run_dir)  # not the `latest` link beside them
    tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
    print(
        f"\njob exit {returncode}; {tail[0] if tail else ''}\n"
        f"replay full at {full_at} s; final fill {last.get('replay_fill')}, "
        f"evicted {last.get('replay_evicted')}, env steps {last.get('env_steps')}, "
        f"updates {last.get('updates')}; checkpoints kept: {', '.join(checkpoints)}"
    )
    figures = {
        "minutes": args.minutes,
        "warmup_minutes": args.warmup_minutes,
        "ranks_sampled": len(samples),
        "exit_code": returncode,
        "replay_full_at_s": float(full_at) if full_at is not None else None,
        "replay_evicted": int(last.get("replay_evicted") or 0),
        "env_steps": int(last.get("env_steps") or 0),
        "updates": int(last.get("updates") or 0),
        "total_rss_end_mib": round(sum(ends), 1),
        "max_slope_mib_per_hour": round(max(slopes), 2) if slopes else None,
        "rss_end_over_warmup_ratio": round(max(ratios), 4) if ratios else None,
    }
    print(json.dumps(figures), flush=True)
    if returncode != 0:
        sys.exit(f"soak: the job failed with exit code {returncode}; see {log_path}")


if __name__ == "__main__":
    main()
