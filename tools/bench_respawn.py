"""How long replacing lost ranks takes (comm/respawn.py), with hpcmarl's transports.

Each run is one `tools/mpirun.sh -n N --with-ft ulfm python -m hpcmarl.testing.respawn_world`:
ranks kill themselves, the survivors hear of it through their transports, then shrink the
world, spawn a replacement for each lost rank, merge with them and rebind their transports;
every rank then exchanges small and bulk messages with every other (see that module). It
reports, per run:

- respawn: shrink, spawn and merge as the first survivor timed them (from its call of
  `respawn` to its return);
- heard: from the survivors hearing of the losses to the last replacement's first message
  reaching the first survivor (what a replacement collector would add to the run's pause,
  before it pulls weights);
- the whole mpirun, start-up and exit included, and its exit code.

This is the machinery alone: a job's run loop does not respawn collectors yet (issue 33).

    .venv/bin/python tools/bench_respawn.py [--rounds 3] [--cases 4:2 8:2,5,6]

A case is RANKS:LOST (comma-separated ranks; rounds after the first, split by /, are run but
only the first is reported). Prints one row per run, a summary per case and,
as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def one_run(ranks: int, lose: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_FAULT_TOLERANCE": "collectors"}
    cmd = ["bash", str(ROOT / "tools" / "mpirun.sh"), "-n", str(ranks), sys.executable]
    cmd += ["-m", "hpcmarl.testing.respawn_world", "--lose", lose]
    began = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"rc": "hung", "respawn_s": None, "heard_s": None, "mpirun_s": 180.0}
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    timing = [t for t in lines if t["round"] == 0]
    row: dict[str, Any] = {"rc": done.returncode, "mpirun_s": round(time.monotonic() - began, 2)}
    row["respawn_s"] = timing[0]["respawn_s"] if timing else None
    row["heard_s"] = timing[0]["to_first_s"] if timing else None
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return row


def span(values: list) -> str:
    known = [v for v in values if v is not None]
    return f"{min(known):.2f}-{max(known):.2f}" if known else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["4:2", "8:2,5,6"])
    args = parser.parse_args()
    cases = [(int(c.split(":")[0]), c.split(":")[1]) for c in args.cases]
    runs: dict[str, list[dict]] = {f"{n}:{lose}": [] for n, lose in cases}
    print(f"{'case':<12} {'round':>5} {'respawn s':>10} {'heard s':>8} {'mpirun s':>9} {'rc':>4}")
    for round_ in range(args.rounds):  # cases alternate, so that each meets the same load
        for ranks, lose in cases:
            row = one_run(ranks, lose)
            runs[f"{ranks}:{lose}"].append(row)
            shown = ["-" if row[k] is None else f"{row[k]:.2f}" for k in ("respawn_s", "heard_s")]
            print(
                f"{f'{ranks}:{lose}':<12} {round_:>5} {shown[0]:>10} {shown[1]:>8}"
                f" {row['mpirun_s']:>9.1f} {row['rc']!s:>4}",
                flush=True,
            )
    figures: dict = {"load": round(os.getloadavg()[0], 1), "cases": {}}
    print("summary (min-max over rounds)")
    for case, rows in runs.items():
        respawn = [r["respawn_s"] for r in rows]
        heard = [r["heard_s"] for r in rows]
        ok = sum(r["rc"] == 0 for r in rows)
        print(f"  {case}: respawn {span(respawn)} s, heard {span(heard)} s, {ok}/{len(rows)} ok")
        figures["cases"][case] = {"respawn_s": respawn, "heard_s": heard, "ok": ok}
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
