"""The learners' section of the analysis report: each learner's tasks, updates, rate and last
losses, from the `update_learner_info` rows the commander writes after every learner task, and
the learner tasks that failed (`task_failed` rows of learners: cause, group, updates applied).
Read from the run's `metrics.jsonl`, so a run needs no replay files for this part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_rows(path: Path, kinds: set[str]) -> list[dict[str, Any]] | None:
    """The rows of these kinds in a run directory's `metrics.jsonl`, in order (None when
    `path` is not a run directory). A line cut by a kill is skipped: the rest still counts."""
    metrics = path / "metrics.jsonl"
    if not (path.is_dir() and metrics.is_file()):
        return None
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("kind") in kinds:
            rows.append(row)
    return rows


def learner_summary(paths: list[str | Path]) -> dict[str, Any] | None:
    """Per learner of the first run directory among `paths` with learner rows: its tasks
    (a resumed run's count on), its newest update count, rate, learning rate and losses, and
    its failed tasks; None when no path holds such rows."""
    for path in map(Path, paths):
        rows = run_rows(path, {"update_learner_info", "task_failed"})
        learners: dict[str, dict[str, Any]] = {}
        for row in rows or []:
            if row["kind"] == "task_failed" and "group" not in row:
                continue  # a collector's task (a learner's names its group)
            entry = learners.setdefault(row["role"], {"tasks": 0, "failed": []})
            if row["kind"] == "task_failed":
                keys = ("task_id", "group", "updates", "cause", "env_steps")
                entry["failed"].append({k: row.get(k) for k in keys})
                continue
            entry["tasks"] += 1
            keys = ("updates", "updates_per_s", "lr", "losses", "env_steps")
            entry.update({k: row.get(k) for k in keys})
        if learners:
            return dict(sorted(learners.items()))
    return None
