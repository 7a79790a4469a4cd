"""Algorithms: the learning contract (`contract.py`), the registry of names (`catalog.py`,
torch-free) and one module per algorithm, resolved by `registry.py` when a role needs one.

Importing this package imports nothing heavy, so that reading a job stays fast.
"""
