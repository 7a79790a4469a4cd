"""hpcmarl: multi-agent reinforcement learning as an MPI batch job.

From Python: `hpcmarl.train(job) -> Run` and `hpcmarl.load_policy(run_dir) -> Policy`. They
are imported on first use, so that `import hpcmarl` stays cheap (no torch, no mpi4py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Policy", "Run", "load_policy", "train"]

if TYPE_CHECKING:
    from .api import Run, train
    from .policy import Policy, load_policy

_HOMES = {"train": "api", "Run": "api", "load_policy": "policy", "Policy": "policy"}
"""Where each lazily imported name lives."""


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'hpcmarl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
