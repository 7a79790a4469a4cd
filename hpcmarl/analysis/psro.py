"""A PSRO run's figures for the analysis report: exploitability per iteration, the last
payoff matrix and meta-strategy, read from the run's `metrics.jsonl` (the `psro` rows the
commander wrote), so a run needs no replay files for this part of its report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .learners import run_rows


def psro_summary(paths: list[str | Path]) -> dict[str, Any] | None:
    """The PSRO section of the summary, from the first run directory among `paths` that holds
    `psro` rows (None when none does). A resumed run's rows of one iteration may appear
    twice (once before the stop, once after): the last one counts."""
    for path in map(Path, paths):
        rows = {int(row["iteration"]): row for row in run_rows(path, {"psro"}) or []}
        if rows:
            return _summary([rows[i] for i in sorted(rows)])
    return None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    last = rows[-1]
    curve = [
        {
            "iteration": r["iteration"],
            "env_steps": r.get("env_steps"),
            "time_s": r["time_s"],
            "population": r["population"],
            "exploitability": r.get("exploitability"),
            "nash_conv": r.get("nash_conv"),
        }
        for r in rows
    ]
    scored = [r for r in curve if r["exploitability"] is not None]
    return {
        "iterations": last["iteration"],
        "population": last["population"],
        "final_exploitability": scored[-1]["exploitability"] if scored else None,
        "best_exploitability": min(r["exploitability"] for r in scored) if scored else None,
        "curve": curve,
        "payoffs": last["payoffs"],
        "payoff_se": last.get("payoff_se"),
        "meta_strategy": last["meta_strategy"],
    }
