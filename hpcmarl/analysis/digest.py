"""The running summaries of an `Analysis`, turned into the plain-JSON summary everything reads.

Only finite numbers and None go in, so `json.dumps` of the result is strict JSON. Where a value
comes from a sample or a histogram rather than every row, the summary says so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .stats import FloatHistogram, IntCounts, Moments, ProgressBins

if TYPE_CHECKING:
    from .summary import AgentStats, Analysis, PolicyStats

LAG_BINS = 40
HIST_BINS = 30


def build_summary(a: Analysis) -> dict[str, Any]:
    agents = {name: _agent(s) for name, s in sorted(a.agents.items())}
    policies = {p: _policy(p, s, a.agents) for p, s in sorted(a.policies.items())}
    return {
        "files": a.files,
        "totals": {
            "items": sum(s.items for s in a.agents.values()),
            "env_steps": a.env_steps,
            "episodes_complete": a.returns.count,
            "episodes_incomplete": a.incomplete,
            "agents": len(agents),
            "policies": len(policies),
        },
        "agents": agents,
        "policies": policies,
        "episodes": _episodes(a),
        "insertion": a.rate,
    }


def _agent(s: AgentStats) -> dict[str, Any]:
    values, counts = s.actions.values()
    return {
        "policy": s.policy,
        "items": s.items,
        "env_steps": s.items,
        "episodes": s.episodes,
        "episodes_complete": s.complete,
        "terminations": s.terminations,
        "truncations": s.truncations,
        "reward": _moments(s.rewards, s.reward_hist),
        "actions": {
            "values": values.tolist(),
            "counts": counts.tolist(),
            "fractions": _fractions(counts),
            **({"dims": [_moments(m) for m in s.action_dims]} if s.action_dims else {}),
        },
        "return": _moments(s.returns),
        "return_over_training": _finite(s.progress.means()[:, 0]),
    }


def _policy(name: str, s: PolicyStats, agents: dict[str, AgentStats]) -> dict[str, Any]:
    members = sorted(a for a, st in agents.items() if st.policy == name)
    out: dict[str, Any] = {
        "agents": members,
        "items": s.items,
        "env_steps": max((agents[a].items for a in members), default=0),
        "version": _versions(s.versions),
        "lag": _lag(s.versions),
        "priority": None,
    }
    if s.priorities.count:
        out["priority"] = _moments(s.priorities, s.priority_hist)
    return out


def _episodes(a: Analysis) -> dict[str, Any]:
    sample = a.sample.values
    sampled = a.returns.count > len(sample)
    out: dict[str, Any] = {
        "complete": a.returns.count,
        "incomplete": a.incomplete,
        "quantiles_from_sample": sampled,
        "return": _moments(a.returns),
        "length": _moments(a.lengths),
        "over_training": _progress(a.progress, a.env_steps),
    }
    for i, key in enumerate(("return", "length")):
        if len(sample):
            out[key]["quantiles"] = _quantiles(_finite(np.quantile(sample[:, i], _QS)))
            out[key]["histogram"] = _histogram(sample[:, i])
    return out


_QS = (0.05, 0.25, 0.5, 0.75, 0.95)
_QKEYS = tuple(f"p{round(q * 100)}" for q in _QS)


def _quantiles(values: Any) -> dict[str, float | None]:
    return {k: None if v is None else float(v) for k, v in zip(_QKEYS, values, strict=True)}


def _moments(m: Moments, hist: FloatHistogram | None = None) -> dict[str, Any]:
    out = m.to_dict()
    if hist is not None and m.count:
        out["quantiles"] = _quantiles(hist.quantiles(_QS))
        out["nonfinite"] = hist.nonfinite()
        out["histogram"] = hist.to_dict()
    return {k: None if _bad_float(v) else v for k, v in out.items()}


def _bad_float(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _histogram(values: np.ndarray) -> dict[str, Any]:
    values = values[np.isfinite(values)]
    if not len(values):
        return {"edges": [], "count": [], "sample_size": 0}
    lo, hi = float(values.min()), float(values.max())
    counts, edges = np.histogram(values, bins=HIST_BINS, range=(lo, hi if hi > lo else lo + 1))
    return {"edges": edges.tolist(), "count": counts.tolist(), "sample_size": len(values)}


def _progress(p: ProgressBins, env_steps: int) -> dict[str, Any]:
    n = len(p.count)
    means = p.means()
    return {
        "env_steps": [round((i + 0.5) / n * env_steps) for i in range(n)],
        "episodes": p.count.tolist(),
        "return_mean": _finite(means[:, 0]),
        "return_min": _finite(p.lo[:, 0]),
        "return_max": _finite(p.hi[:, 0]),
        "length_mean": _finite(means[:, 1]),
    }


def _versions(counts: IntCounts) -> dict[str, Any]:
    values, _ = counts.values()
    if not len(values):
        return {"min": None, "max": None, "distinct": 0}
    return {"min": int(values.min()), "max": int(values.max()), "distinct": len(values)}


def _lag(counts: IntCounts) -> dict[str, Any] | None:
    """Staleness: how many versions older than the newest data of the policy each row is."""
    values, n = counts.values()
    if not len(values):
        return None
    lag = values.max() - values[::-1]
    n = n[::-1]
    total = int(n.sum())
    cum = np.cumsum(n)
    at = np.searchsorted(cum, np.array(_QS) * total)
    quantiles = dict(zip(_QKEYS, lag[at].tolist(), strict=True))
    edges = np.linspace(0, lag.max() + 1, min(LAG_BINS, int(lag.max()) + 1) + 1)
    hist, _ = np.histogram(lag, bins=edges, weights=n)
    return {
        "mean": float((lag * n).sum() / total),
        "max": int(lag.max()),
        "quantiles": quantiles,
        "histogram": {"edges": edges.tolist(), "count": hist.astype(np.int64).tolist()},
    }


def _fractions(counts: np.ndarray) -> list[float]:
    total = counts.sum()
    return (counts / total).tolist() if total else []


def _finite(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]
