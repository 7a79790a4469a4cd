"""A job's env steps/s with its ranks spread over several hosts vs the same ranks on one host.

Runs on the hosts of tools/local_cluster.sh (`tools/local_cluster.sh up 4` first): each job at
`-n RANKS` is started with `tools/mpirun.sh --hosts 1` (every rank on hpc1) and with `--hosts H`
for each H of `--hosts` (ranks in blocks over hpc1..hpcH, as a batch system places them), in
turns, `--repeats` times, so that a slow spell of the machine falls on all alike. Every run
trains for `--seconds` of wall time; its rate is the env steps between its first progress row
after `--warmup-s` and its last, over the time between them (start-up and the first updates'
warm-up are not counted). `{job}_{H}_hosts_ratio` is the median over repeats of a run's rate
over the one-host run next to it.

The hosts of the local cluster share this machine's cores, so the ratio is what crossing hosts
costs (TCP between hosts instead of shared memory, the placement across them), not what more
cores would give. Prints a table and, last, one JSON line.

    .venv/bin/python tools/bench_hosts.py [--jobs default mappo] [--hosts 2 4] [--ranks 16]
        [--seconds 40] [--repeats 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher import MPIRUN, ROOT, hpcmarl_env

JOBS = {"default": "jobs/default.yaml", "mappo": "jobs/spread_mappo.yaml"}
CLUSTER_HOSTS = Path(os.environ.get("HPCMARL_CLUSTER_DIR", "/run/hpcmarl-cluster")) / "hosts"
"""tools/local_cluster.sh's list of the hosts that are up (in its state folder, as the shell
tools read it)."""


def hosts_up() -> int:
    """Hosts of tools/local_cluster.sh that are up (one line each in its hosts file)."""
    lines = CLUSTER_HOSTS.read_text().splitlines() if CLUSTER_HOSTS.exists() else []
    return len([line for line in lines if line.strip()])


def one_run(
    job: str, hosts: int, ranks: int, seconds: float, warmup_s: float, overrides: list[str]
) -> dict:
    """The job for `seconds` of wall time on `hosts` hosts; its steady env steps/s."""
    with tempfile.TemporaryDirectory(prefix="bench_hosts_") as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            "bash", str(MPIRUN), "--hosts", str(hosts), "-n", str(ranks),
            sys.executable, "-m", "hpcmarl", JOBS[job],
            f"commander.max_wall_time_s={seconds}", "commander.max_env_steps=100000000",
            "commander.stop_value=null", "checkpoint.at_end=false", f"runtime.run_dir={run_dir}",
            *overrides,
        ]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=ROOT, env=hpcmarl_env(), timeout=600
        )
        wall = time.monotonic() - start
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-2000:]
            code = done.returncode
            sys.exit(f"bench_hosts: {job} on {hosts} hosts failed (exit {code}):\n{tail}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    progress = [r for r in rows if r["kind"] == "progress" and r["time_s"] >= warmup_s]
    if len(progress) < 2:
        sys.exit(f"bench_hosts: {job} on {hosts} hosts made under 2 progress rows after warm-up")
    first, last = progress[0], progress[-1]
    rate = (last["env_steps"] - first["env_steps"]) / (last["time_s"] - first["time_s"])
    return {"rate": rate, "wall_s": wall, "env_steps": last["env_steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    parser.add_argument("--hosts", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=40.0, help="wall time of each run")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="not counted in the rate")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run"
    )
    args = parser.parse_args()
    if hosts_up() < max(args.hosts):
        sys.exit(f"bench_hosts: {max(args.hosts)} hosts needed: tools/local_cluster.sh up "
                 f"{max(args.hosts)} ({hosts_up()} up)")  # fmt: skip
    figures: dict[str, float] = {"ranks": args.ranks, "seconds": args.seconds}
    print(f"{'job':<8} {'hosts':>5} {'env steps/s':>24} {'one host':>24} {'ratio':>6}")
    for job in args.jobs:
        for hosts in args.hosts:
            pairs = []
            for _ in range(args.repeats):
                run = (args.ranks, args.seconds, args.warmup_s, args.set)
                alone = one_run(job, 1, *run)["rate"]
                spread = one_run(job, hosts, *run)["rate"]
                pairs.append((spread, alone))
            ratios = sorted(s / a for s, a in pairs)
            ratio = statistics.median(ratios)
            spread_rates = ", ".join(f"{s:,.0f}" for s, _ in pairs)
            alone_rates = ", ".join(f"{a:,.0f}" for _, a in pairs)
            print(f"{job:<8} {hosts:>5} {spread_rates:>24} {alone_rates:>24} {ratio:6.3f}")
            figures[f"{job}_{hosts}_hosts_env_steps_per_s"] = round(
                statistics.median(s for s, _ in pairs), 1
            )
            figures[f"{job}_{hosts}_hosts_one_host_env_steps_per_s"] = round(
                statistics.median(a for _, a in pairs), 1
            )
            figures[f"{job}_{hosts}_hosts_ratio"] = round(ratio, 3)
            figures[f"{job}_{hosts}_hosts_ratio_lowest"] = round(ratios[0], 3)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
