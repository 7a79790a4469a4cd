"""The run's metric rows as TensorBoard scalars in `RUN_DIR/tb`, for `tensorboard --logdir`.

Users of SB3, CleanRL or Sample Factory watch training in TensorBoard; this writes the rows the
commander already records (progress, evaluation, learner statistics) as scalars, so nothing is
measured twice and a new column appears there by itself. The x-axis is env steps (updates
offline, where no env steps are taken). Events go to TensorBoard's writer thread and are flushed
once per progress row, never per scalar: the commander pays about 30 us per scalar, a few dozen
scalars a second. A resumed run writes a new event file beside the old ones, starting with
TensorBoard's restart marker at the checkpoint's step: TensorBoard then hides what the
interrupted run wrote past its checkpoint (that state was lost; the resumed run redoes it).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

TB_DIR = "tb"
"""The folder of the run directory that holds the event files."""
NOT_SCALARS = {
    "progress": frozenset({"time_s", "eval_return", "eval_agent_returns"}),
    "eval": frozenset({"time_s", "env_steps", "updates", "episodes", "versions"}),
    "learn": frozenset({"env_steps"}),
}
"""Per row kind written, the fields that are not its own scalars: wall time (every event has
it), the x-axis, and the evaluation that progress rows repeat (eval rows write it at the step
it was measured). Other row kinds (episodes, schedule, checkpoints) are not written."""


class TensorBoardLog:
    """Scalars from metric rows, stepped by a never-decreasing position in the run."""

    def __init__(self, log_dir: str, x_axis: str = "env_steps") -> None:
        self.log_dir = log_dir
        self.x_axis = x_axis
        self.step = 0
        self._writer: Any = None
        self._closed = False
        self._purge_step: int | None = None

    def write(self, kind: str, row: dict[str, Any]) -> None:
        """Queue the row's numbers as scalars; a kind not in `NOT_SCALARS` writes nothing.

        The step is the largest x-axis value seen: progress and eval rows carry the run's
        totals, a learn row offline only its learner's updates, which never exceed them.
        """
        skip = NOT_SCALARS.get(kind)
        if skip is None or self._closed:
            return
        self.step = max(self.step, int(row.get(self.x_axis) or 0))
        prefix = f"learn/{row['group']}" if kind == "learn" else kind
        writer = self._open()
        for tag, value in scalars(prefix, row, skip | {self.x_axis}):
            writer.add_scalar(tag, value, self.step)

    def resume_at(self, counters: dict[str, Any]) -> None:
        """The run continues from a checkpoint taken at these counters (env steps, updates)."""
        self.step = max(self.step, int(counters[self.x_axis]))
        self._purge_step = self.step

    def flush(self) -> None:
        """Write what is queued, so that a TensorBoard watching the run sees it now."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; later rows are dropped. Safe to call twice."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self) -> Any:
        """The writer, created at the first row: a run that fails earlier leaves no file."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = SummaryWriter(
                self.log_dir, purge_step=self._purge_step, max_queue=1000, flush_secs=60
            )
        return self._writer


def scalars(prefix: str, row: dict[str, Any], skip: frozenset[str]) -> list[tuple[str, float]]:
    """(tag, value) for every number in `row`, nested dicts as `key/subkey` (agents, shards)."""
    out: list[tuple[str, float]] = []
    for key, value in row.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            out += scalars(f"{prefix}/{key}", value, frozenset())
        elif isinstance(value, numbers.Real) and math.isfinite(value):
            out.append((f"{prefix}/{key}", float(value)))
    return out
