"""Items: what a collector cuts from experience, a shard stores and a learner trains on.

An algorithm declares its item spec (`spec.py`); collectors fill items with the writers in
`writers.py`; the same spec describes the columns in replay tables, checkpoints and messages.
"""

from hpcmarl.items.spec import ITEM_KINDS, Column, ItemSpec, ReplaySpec

__all__ = ["ITEM_KINDS", "Column", "ItemSpec", "ReplaySpec"]
