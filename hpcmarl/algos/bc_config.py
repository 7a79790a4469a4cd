"""Behaviour cloning's declaration, beside its code (bc.py): it has no keys of its own and
learns only from a dataset (`offline.dataset`)."""

from __future__ import annotations

IMPL = "hpcmarl.algos.bc:BehaviourCloning"
"""The implementation, imported when a role needs it."""
OFFLINE_ONLY = True
