"""The tensorboard logger: the run's scalars as event files in `RUN_DIR/tb`, for
`tensorboard --logdir`.

Users of SB3, CleanRL or Sample Factory watch training in TensorBoard; `loggers.py` turns the
rows the commander records into scalars and their step, and this writes them. Events go to
TensorBoard's writer thread and are flushed once per progress row, never per scalar: the
commander pays about 30 us per scalar, a few dozen scalars a second. A resumed run writes a new
event file beside the old ones, starting with TensorBoard's restart marker at the checkpoint's
step: TensorBoard then hides what the interrupted run wrote past its checkpoint (that state was
lost; the resumed run redoes it).
"""

from __future__ import annotations

import os
from typing import Any

TB_DIR = "tb"
"""The folder of the run directory that holds the event files."""


class TensorBoardLog:
    """Scalars in one event file per process, opened at the first scalar."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._writer: Any = None
        self._closed = False
        self._purge_step: int | None = None

    def log(self, step: int, points: list[tuple[str, float]]) -> None:
        """Queue the scalars at `step`; after `close` they are dropped."""
        if self._closed:
            return
        writer = self._open()
        for tag, value in points:
            writer.add_scalar(tag, value, step)

    def resume_at(self, step: int) -> None:
        """The run continues from a checkpoint taken at this step."""
        self._purge_step = step

    def flush(self) -> None:
        """Write what is queued, so that a TensorBoard watching the run sees it now."""
        if self._writer is not None:
            self._writer.flush()

    def close(self, exit_code: int = 0) -> None:
        """Flush and close the event file; later scalars are dropped. Safe to call twice."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self) -> Any:
        """The writer, created at the first scalar: a run that fails earlier leaves no file."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = SummaryWriter(
                self.log_dir, purge_step=self._purge_step, max_queue=1000, flush_secs=60
            )
        return self._writer
