"""PNG plots of the summary, drawn with matplotlib's Agg backend (no display needed).

matplotlib (the analysis extra) is imported only here and only when plots are asked for, so
the rest of the analysis works where it is not installed: `analyze --no-plots`. Without it,
`analyze` ends before reading anything, in one line naming the extra and `--no-plots`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpcmarl.extras import require

Figure = Any


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; the analysis extra's error where it is missing."""
    matplotlib = require("matplotlib", "analyze with plots", "pass --no-plots")
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", "analyze with plots", "pass --no-plots")


def write_plots(summary: dict[str, Any], folder: Path) -> list[str]:
    """Write every plot the summary has data for; return their file names."""
    plt = pyplot()
    written = []
    for name, draw in PLOTS.items():
        fig = plt.figure(figsize=(8, 4.5))
        try:
            if draw(fig, summary):
                fig.tight_layout()
                fig.savefig(folder / name, dpi=100)
                written.append(name)
        except (ValueError, TypeError, OverflowError) as err:  # odd data: skip one plot
            print(f"hpcmarl: warning: plot {name} skipped ({err})", file=sys.stderr)
        finally:
            plt.close(fig)
    return written


def _over_training(fig: Figure, s: dict[str, Any]) -> bool:
    p = s["episodes"]["over_training"]
    if not s["episodes"]["complete"]:
        return False
    x = np.array(p["env_steps"], float)
    ax = fig.add_subplot(1, 1, 1)
    ax.fill_between(x, _arr(p["return_min"]), _arr(p["return_max"]), alpha=0.2, label="min–max")
    ax.plot(x, _arr(p["return_mean"]), marker=".", label="mean return (team)")
    ax.set_xlabel("env steps (position in the data)")
    ax.set_ylabel("episode return")
    twin = ax.twinx()
    twin.plot(x, _arr(p["length_mean"]), color="tab:gray", linestyle="--", label="mean length")
    twin.set_ylabel("episode length")
    ax.legend(loc="upper left")
    twin.legend(loc="lower right")
    ax.set_title("Episode return and length over training")
    return True


def _distributions(fig: Figure, s: dict[str, Any]) -> bool:
    e = s["episodes"]
    if not e["complete"]:
        return False
    for i, key in enumerate(("return", "length")):
        h = e[key]["histogram"]
        ax = fig.add_subplot(1, 2, i + 1)
        edges = np.array(h["edges"])
        ax.bar(edges[:-1], h["count"], width=np.diff(edges), align="edge")
        ax.set_xlabel(f"episode {key}")
        ax.set_ylabel("episodes" + (" (sample)" if e["quantiles_from_sample"] else ""))
    fig.suptitle("Episode return and length distributions")
    return True


def _agent_returns(fig: Figure, s: dict[str, Any]) -> bool:
    if len(s["agents"]) < 2 or not s["episodes"]["complete"]:
        return False
    p = s["episodes"]["over_training"]
    ax = fig.add_subplot(1, 1, 1)
    x = np.array(p["env_steps"], float)
    for name, a in s["agents"].items():
        ax.plot(x, _arr(a["return_over_training"]), marker=".", label=name)
    ax.plot(x, _arr(p["return_mean"]), color="black", linewidth=2, label="team (sum)")
    ax.set_xlabel("env steps (position in the data)")
    ax.set_ylabel("mean episode return")
    ax.legend()
    ax.set_title("Per-agent and team returns")
    return True


def _actions(fig: Figure, s: dict[str, Any]) -> bool:
    agents = {n: a["actions"] for n, a in s["agents"].items() if a["actions"]["values"]}
    if not agents:
        return False
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(agents)
    for i, (name, act) in enumerate(agents.items()):
        ax.bar(np.array(act["values"]) + i * width - 0.4, act["fractions"], width, label=name)
    ax.set_xlabel("action")
    ax.set_ylabel("fraction of rows")
    ax.legend()
    ax.set_title("Action distribution per agent")
    return True


def _rewards(fig: Figure, s: dict[str, Any]) -> bool:
    hists = {n: a["reward"].get("histogram") for n, a in s["agents"].items()}
    return _sparse(fig, hists, "reward per step", "rows", "Reward per agent")


def _staleness(fig: Figure, s: dict[str, Any]) -> bool:
    return _histograms(fig, {p: v["lag"] for p, v in s["policies"].items()}, "version lag")


def _priorities(fig: Figure, s: dict[str, Any]) -> bool:
    hists = {n: p["priority"]["histogram"] for n, p in s["policies"].items() if p["priority"]}
    return _sparse(fig, hists, "priority", "items", "Priority distribution per policy")


def _sparse(fig: Figure, hists: dict[str, Any], xlabel: str, ylabel: str, title: str) -> bool:
    """Fixed-bin histograms with few filled bins: a point per filled bin, on a log scale when
    the values span more than two decades."""
    hists = {n: h for n, h in hists.items() if h and h["count"]}
    if not hists:
        return False
    ax = fig.add_subplot(1, 1, 1)
    magnitudes = []
    for name, h in hists.items():
        centers = (np.array(h["lo"]) + np.array(h["hi"])) / 2
        ax.plot(centers, h["count"], marker="o", linestyle=":", label=name)
        magnitudes += [abs(c) for c in centers if c]
    if magnitudes and max(magnitudes) > 100 * min(magnitudes):
        ax.set_xscale("symlog", linthresh=min(magnitudes))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.set_title(title)
    return True


def _insertion(fig: Figure, s: dict[str, Any]) -> bool:
    rate = s["insertion"]
    if rate is None:
        return False
    values = rate["transitions_per_s"]
    x = (np.arange(len(values)) + 0.5) * rate["bin_s"]
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(x, values, marker=".")
    ax.set_xlabel("wall time since the first write (s)")
    ax.set_ylabel("transitions / s")
    ax.set_title("Insertion rate")
    return True


def _histograms(fig: Figure, hists: dict[str, Any], label: str) -> bool:
    hists = {k: v for k, v in hists.items() if v}
    if not hists:
        return False
    ax = fig.add_subplot(1, 1, 1)
    for name, h in hists.items():
        edges = np.array(h["histogram"]["edges"])
        ax.stairs(h["histogram"]["count"], edges, label=name)
    ax.set_xlabel(label)
    ax.set_ylabel("rows")
    ax.legend()
    ax.set_title("Policy-version lag of stored data")
    return True


def _psro_exploitability(fig: Figure, s: dict[str, Any]) -> bool:
    psro = s.get("psro")
    points = [r for r in (psro or {}).get("curve", []) if r["exploitability"] is not None]
    if not points:
        return False
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([r["iteration"] for r in points], [r["exploitability"] for r in points], marker="o")
    ax.set_xlabel("PSRO iteration")
    ax.set_ylabel("exploitability (OpenSpiel)")
    ax.set_yscale("log")
    twin = ax.twiny()
    twin.set_xlim(ax.get_xlim())
    ticks = [r["iteration"] for r in points][:: max(1, len(points) // 6)]
    twin.set_xticks(ticks)
    times = {r["iteration"]: r["time_s"] for r in points}
    twin.set_xticklabels([f"{times[t]:.0f}s" for t in ticks])
    twin.set_xlabel("wall time")
    ax.set_title("Exploitability of the meta-strategy")
    return True


def _psro_payoffs(fig: Figure, s: dict[str, Any]) -> bool:
    psro = s.get("psro")
    if not psro or not psro["payoffs"]:
        return False
    payoffs = _arr_2d(psro["payoffs"])
    ax = fig.add_subplot(1, 1, 1)
    bound = float(np.nanmax(np.abs(payoffs))) or 1.0
    image = ax.imshow(payoffs, cmap="RdBu", vmin=-bound, vmax=bound)
    fig.colorbar(image, ax=ax, label="player 0's mean return")
    ax.set_xlabel("player 1's policy")
    ax.set_ylabel("player 0's policy")
    ax.set_title(f"Payoff matrix after iteration {psro['iterations']}")
    return True


def _arr_2d(values: list[list[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in values], float)


def _arr(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], float)


PLOTS: dict[str, Callable[[Figure, dict[str, Any]], bool]] = {
    "returns_over_training.png": _over_training,
    "episode_distributions.png": _distributions,
    "agent_returns.png": _agent_returns,
    "actions.png": _actions,
    "rewards.png": _rewards,
    "staleness.png": _staleness,
    "priorities.png": _priorities,
    "insertion_rate.png": _insertion,
    "psro_exploitability.png": _psro_exploitability,
    "psro_payoffs.png": _psro_payoffs,
}
