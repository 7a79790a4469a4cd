"""Will a checkpoint fit in the warning Slurm gives before the time limit?

`slurm/train.sh` asks Slurm for a signal some seconds before the limit (`--signal=B:USR1@120`)
and tells hpcmarl how many (`HPCMARL_SIGNAL_LEAD_S`). In that time the run must cut, write every
table and exit; a job whose replay tables hold more than the run directory's filesystem can
write in that time is killed mid-checkpoint and loses everything since the last one. Rank 0
measures the filesystem's write rate once at start-up, with a small probe file, and names a
warning that is too short, with the lead it needs.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config.schema import JobConfig
from .memory import Node, node_needs
from .topology import Topology

if TYPE_CHECKING:
    from .build import EnvSpec

LEAD_ENV = "HPCMARL_SIGNAL_LEAD_S"
PROBE_BYTES = 32 << 20
MARGIN = 1.5
"""Writes slow down when every rank writes at once and the filesystem is shared: needed lead =
MARGIN x the measured write time + SETTLE_S."""
SETTLE_S = 15.0
"""Seconds to quiesce running tasks before the cut, and to shut the ranks down after it."""


def signal_lead() -> float | None:
    """The seconds of warning the batch script asked Slurm for, if it said."""
    text = os.environ.get(LEAD_ENV, "").strip()
    try:
        return float(text) if text else None
    except ValueError:
        return None


def measure_write_rate(folder: Path, nbytes: int = PROBE_BYTES) -> float:
    """Bytes per second of a written and fsynced file in `folder` (removed again)."""
    probe = folder / f".write-probe-{uuid.uuid4().hex[:8]}.tmp"
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    try:
        with open(probe, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return nbytes / max(time.perf_counter() - start, 1e-6)
    finally:
        probe.unlink(missing_ok=True)


def checkpoint_bytes(
    cfg: JobConfig, spec: EnvSpec, topology: Topology, nodes: Sequence[Node]
) -> int:
    """What a full checkpoint writes, at most: every node's tables and networks."""
    return sum(need.total for need in node_needs(cfg, spec, topology, nodes))


def lead_warning(lead_s: float, nbytes: int, rate: float) -> str | None:
    """The warning line when `lead_s` seconds cannot hold a checkpoint of `nbytes`."""
    write_s = nbytes / rate
    needed = MARGIN * write_s + SETTLE_S
    if lead_s >= needed:
        return None
    return (
        f"hpcmarl: warning: Slurm warns {lead_s:g} s before the time limit, but a checkpoint "
        f"of {nbytes / 1e9:.2f} GB (the replay tables and networks when full) takes about "
        f"{write_s:.0f} s at the {rate / 1e6:.0f} MB/s measured in the run directory; "
        f"fix: submit with --signal=B:USR1@{int(np.ceil(needed))} (and set {LEAD_ENV} if you "
        "override it on the command line), or lower replay.table_capacity"
    )


def check_signal_lead(
    cfg: JobConfig, spec: EnvSpec, topology: Topology, nodes: Sequence[Node], run_dir: str
) -> str | None:
    """The warning for a batch job whose signal comes too late to checkpoint, if any."""
    lead = signal_lead()
    if lead is None:
        return None
    rate = measure_write_rate(Path(run_dir))
    return lead_warning(lead, checkpoint_bytes(cfg, spec, topology, nodes), rate)
