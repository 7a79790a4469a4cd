"""Where each rank's time goes in a real run: a cProfile of every rank's loop, by part.

    python tools/profile_roles.py [--ranks 1 4] [--env-steps N] [--job JOB.yaml]
                                  [--override KEY=VALUE ...]

Runs the job (default: the default CartPole DQN job with no stop value) for `--env-steps`
steps at each world size, one plain process for `--ranks 1` and `mpirun -n N` otherwise, with
`HPCMARL_PROFILE_DIR` set (hpcmarl/launch/profiling.py), and prints per rank its roles and the
share of its loop's own time in each part: MPI transport, allreduce, replay tables, the learner
update (torch included), environments, acting and item building, checkpoint writes, idle sleep
and other Python (the roles' own loops and message handling), and the CPU seconds each rank
burnt (with more ranks than cores, the shares are of wall-clock time, which also counts the
time a rank waited for a core). cProfile inflates Python-heavy parts by about 1.5x, so read
shares, not absolute seconds. `docs/performance.md` discusses
the figures.

Prints the tables, then as its last line one JSON object: per world size and rank, the shares
and the CPU seconds (`cpu_s`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from launcher import hpcmarl_command, hpcmarl_env

ROOT = Path(__file__).resolve().parent.parent


def run(ranks: int, args: argparse.Namespace, folder: Path) -> list[dict]:
    profile = folder / f"n{ranks}"
    job = [args.job] if args.job else []
    hpcmarl = [
        *job, "commander.stop_value=null",
        f"commander.max_env_steps={args.env_steps}", f"runtime.run_dir={folder / f'run{ranks}'}",
        *args.override,
    ]  # fmt: skip
    done = subprocess.run(
        hpcmarl_command(ranks, hpcmarl, plain_for_one=True),
        capture_output=True,
        text=True,
        env=hpcmarl_env(HPCMARL_PROFILE_DIR=str(profile)),
        cwd=ROOT,
    )
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"-n {ranks}: the run failed with exit code {done.returncode}")
    finished = [x for x in done.stdout.splitlines() if x.startswith("hpcmarl: finished")]
    print(f"\n-n {ranks}: {finished[-1] if finished else done.stdout[-300:]}")
    return [
        json.loads(p.read_text())
        for p in sorted(profile.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    ]


def table(ranks: int, summaries: list[dict]) -> dict[str, dict[str, float]]:
    parts = [k for k in summaries[0]["parts"] if k != "total"]
    head = f"{'rank':<5} {'roles':<34} {'loop s':>7} {'cpu s':>7} "
    print(head + " ".join(f"{p[:10]:>10}" for p in parts))
    shares: dict[str, dict[str, float]] = {}
    for s in summaries:
        total = max(s["parts"]["total"], 1e-9)
        share = {p: s["parts"][p] / total for p in parts}
        shares[f"n{ranks}_rank{s['rank']}"] = {p: round(v, 3) for p, v in share.items()}
        shares[f"n{ranks}_rank{s['rank']}"]["cpu_s"] = s["cpu_s"]
        roles = ",".join(s["roles"])
        print(
            f"{s['rank']:<5} {roles[:34]:<34} {total:7.1f} {s['cpu_s']:7.1f} "
            + " ".join(f"{share[p]:10.1%}" for p in parts)
        )
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--env-steps", type=int, default=20_000)
    parser.add_argument("--job", default=None)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="profile_roles_") as tmp:
        for ranks in args.ranks:
            figures |= table(ranks, run(ranks, args, Path(tmp)))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
