"""The PSRO part of `analyze`: the exploitability curve, the last payoff matrix and
meta-strategy from a run's `psro` metric rows, in the JSON summary, the report and two PNGs."""

from __future__ import annotations

import json
from pathlib import Path

from hpcmarl.analysis.plots import PLOTS
from hpcmarl.analysis.psro import psro_summary
from hpcmarl.analysis.report import render


def row(iteration: int, exploitability: float) -> dict:
    n = iteration + 1
    return {
        "kind": "psro",
        "iteration": iteration,
        "population": [n, n],
        "time_s": 10.0 * iteration,
        "env_steps": 1000 * iteration,
        "meta_strategy": [[1 / n] * n, [1 / n] * n],
        "payoffs": [[0.1 * (i - j) for j in range(n)] for i in range(n)],
        "payoff_se": [[0.01] * n for _ in range(n)],
        "exploitability": exploitability,
        "nash_conv": 2 * exploitability,
    }


def test_psro_rows_become_a_curve_a_report_section_and_plots(tmp_path: Path) -> None:
    rows = [row(0, 0.8), row(1, 0.3), {"kind": "progress", "time_s": 1.0}, row(2, 0.2)]
    rows.append(row(2, 0.1))  # iteration 2 again after a resume: the last row counts
    lines = [json.dumps(r) for r in rows] + ['{"kind": "psro", "itera']  # a line cut by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = psro_summary([tmp_path])
    assert summary is not None
    assert [r["iteration"] for r in summary["curve"]] == [0, 1, 2]
    assert summary["final_exploitability"] == 0.1 and summary["best_exploitability"] == 0.1
    assert summary["population"] == [3, 3] and len(summary["payoffs"]) == 3
    text = render({"psro": summary, "totals": {"items": 0}, "files": []})
    assert "## PSRO" in text and "| 2 | 2,000 | 20 | 3x3 | 0.1 | 0.2 |" in text
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in ("psro_exploitability.png", "psro_payoffs.png"):
        fig = plt.figure()
        assert PLOTS[name](fig, {"psro": summary})
        fig.savefig(tmp_path / name)
        plt.close(fig)
        assert (tmp_path / name).stat().st_size > 1000
        assert not PLOTS[name](plt.figure(), {"psro": None})


def test_a_run_without_psro_rows_has_no_psro_section(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "eval"}) + "\n")
    assert psro_summary([tmp_path]) is None
    assert psro_summary([tmp_path / "missing"]) is None
