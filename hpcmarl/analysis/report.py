"""The summary as Markdown: `report.md`, and (without the plot links) the terminal report.

Markdown tables read well as plain text too, so one renderer serves both. Everything shown is
taken from the JSON summary, so `--json` and the report never disagree.
"""

from __future__ import annotations

from typing import Any

OVER_TRAINING_ROWS = 8
"""Rows of the return-over-training table (the plot has the full resolution)."""


def render(summary: dict[str, Any], plots: list[str] | None = None) -> str:
    lines = ["# Replay analysis", ""] + _psro(summary) + _learners(summary)
    if not summary["totals"]["items"]:
        return "\n".join(
            lines + _files(summary) + ["The files hold no rows (nothing flushed yet).", ""]
        )
    for section in (_files, _totals, _agents, _episodes, _over_training, _team, _actions):
        lines += section(summary)
    for section in (_policies, _priorities, _insertion):
        lines += section(summary)
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += [
        "| " + " | ".join(_num(v) if not isinstance(v, str) else v for v in r) + " |" for r in rows
    ]
    return out + [""]


def _psro(s: dict[str, Any]) -> list[str]:
    psro = s.get("psro")
    if not psro:
        return []
    rows = [
        [r["iteration"], r["env_steps"], r["time_s"], "x".join(map(str, r["population"]))]
        + [r["exploitability"], r["nash_conv"]]
        for r in psro["curve"]
    ]
    header = ["iteration", "env steps", "time s", "population", "exploitability", "NashConv"]
    strategy = " | ".join(" ".join(f"{w:.3f}" for w in m) for m in psro["meta_strategy"])
    return (
        ["## PSRO", ""]
        + _table(header, rows)
        + [
            f"Final exploitability {_num(psro['final_exploitability'])} (best "
            f"{_num(psro['best_exploitability'])}) after {psro['iterations']} iterations; "
            f"meta-strategy (player 0 | player 1): {strategy}.",
            "",
        ]
    )


def _learners(s: dict[str, Any]) -> list[str]:
    learners = s.get("learners")
    if not learners:
        return []
    rows = []
    for name, e in learners.items():
        losses = "; ".join(
            f"{group}: " + ", ".join(f"{k} {v:.4g}" for k, v in values.items())
            for group, values in (e.get("losses") or {}).items()
        )
        rows.append([name, e["tasks"], e.get("updates"), e.get("updates_per_s"), losses or "-"])
    failures = [
        f"- {name}: task {f['task_id']} of group {f['group']} failed after {f['updates']} "
        f"updates: {f['cause']}"
        for name, e in learners.items()
        for f in e["failed"]
    ]
    header = ["learner", "tasks", "updates", "updates/s (last task)", "losses (last task)"]
    return ["## Learners", ""] + _table(header, rows) + (failures + [""] if failures else [])


def _files(s: dict[str, Any]) -> list[str]:
    rows = [
        [f["label"], f["kind"], f["env_id"] or "-", sum(f["rows"].values())] for f in s["files"]
    ]
    return _table(["file", "kind", "env", "rows"], rows)


def _totals(s: dict[str, Any]) -> list[str]:
    t = s["totals"]
    return [
        f"{_num(t['items'])} items (agent transitions), {_num(t['env_steps'])} env steps, "
        f"{_num(t['episodes_complete'])} complete episodes "
        f"({_num(t['episodes_incomplete'])} cut by the start or end of the data), "
        f"{t['agents']} agent(s), {t['policies']} polic{'y' if t['policies'] == 1 else 'ies'}.",
        "",
    ]


def _agents(s: dict[str, Any]) -> list[str]:
    header = ["agent", "policy", "items", "episodes", "complete", "reward mean", "reward std"]
    header += ["reward min", "reward max", "terminations", "truncations"]
    rows = []
    for name, a in s["agents"].items():
        r = a["reward"]
        rows.append(
            [name, a["policy"], a["items"], a["episodes"], a["episodes_complete"]]
            + [r.get("mean"), r.get("std"), r.get("min"), r.get("max")]
            + [a["terminations"], a["truncations"]]
        )
    return ["## Agents", ""] + _table(header, rows)


def _spread(m: dict[str, Any]) -> list[Any]:
    q = m.get("quantiles", {})
    return [m.get("mean"), m.get("std"), m.get("min"), q.get("p5"), q.get("p50"), q.get("p95")] + [
        m.get("max")
    ]


def _episodes(s: dict[str, Any]) -> list[str]:
    e = s["episodes"]
    if not e["complete"]:
        return ["## Episodes", "", "No complete episode in the data.", ""]
    header = ["", "mean", "std", "min", "p5", "p50", "p95", "max"]
    rows = [["return (team)", *_spread(e["return"])], ["length", *_spread(e["length"])]]
    note = (
        ["Quantiles from a uniform sample of episodes.", ""] if e["quantiles_from_sample"] else []
    )
    return ["## Episodes", ""] + _table(header, rows) + note


def _over_training(s: dict[str, Any]) -> list[str]:
    p, steps = s["episodes"]["over_training"], s["totals"]["env_steps"]
    n, rows = len(p["episodes"]), []
    for i in range(OVER_TRAINING_ROWS):
        a, b = i * n // OVER_TRAINING_ROWS, (i + 1) * n // OVER_TRAINING_ROWS
        counts = p["episodes"][a:b]
        ret = _mean_of(p["return_mean"][a:b], counts)
        rows.append(
            [round(b / n * steps), sum(counts), ret, _mean_of(p["length_mean"][a:b], counts)]
        )
    header = ["up to env step", "episodes", "mean return", "mean length"]
    return ["## Episodes over training", ""] + _table(header, rows)


def _mean_of(means: list[float | None], counts: list[int]) -> float | None:
    total = sum(c for m, c in zip(means, counts, strict=True) if m is not None)
    if not total:
        return None
    return sum(m * c for m, c in zip(means, counts, strict=True) if m is not None) / total


def _team(s: dict[str, Any]) -> list[str]:
    if len(s["agents"]) < 2 or not s["episodes"]["complete"]:
        return []
    rows = [
        [name, *_spread(a["return"])[:3], a["return"].get("max")] for name, a in s["agents"].items()
    ]
    rows.append(
        ["team (sum)", *_spread(s["episodes"]["return"])[:3], s["episodes"]["return"]["max"]]
    )
    return ["## Per-agent and team returns", ""] + _table(["", "mean", "std", "min", "max"], rows)


def _actions(s: dict[str, Any]) -> list[str]:
    lines = ["## Actions", ""]
    for name, a in s["agents"].items():
        act = a["actions"]
        parts = [f"{v}: {f:.1%}" for v, f in zip(act["values"], act["fractions"], strict=True)]
        parts += [
            f"dim {d} mean {_num(m.get('mean'))} std {_num(m.get('std'))} "
            f"[{_num(m.get('min'))}, {_num(m.get('max'))}]"
            for d, m in enumerate(act.get("dims", []))
        ]
        lines.append(f"- {name}: " + (", ".join(parts) if parts else "not discrete"))
    return lines + [""]


def _policies(s: dict[str, Any]) -> list[str]:
    header = ["policy", "agents", "items", "env steps", "versions", "lag mean", "lag p50"]
    header += ["lag p95", "lag max"]
    rows = []
    for name, p in s["policies"].items():
        v, lag = p["version"], p["lag"] or {}
        q = lag.get("quantiles", {})
        versions = f"{_num(v['min'])}–{_num(v['max'])}"
        rows.append(
            [name, ", ".join(p["agents"]), p["items"], p["env_steps"], versions]
            + [lag.get("mean"), q.get("p50"), q.get("p95"), lag.get("max")]
        )
    note = "Lag: versions behind the newest data of the same policy in these files."
    return ["## Policies and staleness", ""] + _table(header, rows) + [note, ""]


def _priorities(s: dict[str, Any]) -> list[str]:
    rows = [[name, *_spread(p["priority"])] for name, p in s["policies"].items() if p["priority"]]
    if not rows:
        return []
    header = ["policy", "mean", "std", "min", "p5", "p50", "p95", "max"]
    return ["## Priorities", ""] + _table(header, rows)


def _insertion(s: dict[str, Any]) -> list[str]:
    rate = s["insertion"]
    if rate is None:
        return ["Insertion rate: not available (checkpoint tables have no wall-clock index).", ""]
    values = rate["transitions_per_s"]
    span = rate["bin_s"] * len(values)
    return [
        "## Insertion rate",
        "",
        f"{_num(sum(values) * rate['bin_s'] / span if span else None)} transitions/s on average "
        f"over {_num(span)} s of wall time, peak {_num(max(values))}/s.",
        "",
    ]
