"""A replay table's column schema: names, dtypes and trailing shapes, fixed by its first batch.

Every insert is checked against it, so a collector that sends a wrong column fails at the shard
with the column named, not later inside a learner. The check runs on every insert, so its fast
path is two comparisons per column.
"""

from __future__ import annotations

import numpy as np


class ColumnSchema:
    """Column names, dtypes and trailing shapes fixed by a table's first batch.

    `rows` runs on every insert, so it checks each column with two comparisons against shapes
    precomputed for the last batch length; only a failing batch pays for a detailed message.
    """

    def __init__(self, batch: dict[str, np.ndarray]) -> None:
        if not batch:
            raise ValueError("a batch needs at least one column")
        for name, column in batch.items():
            if not isinstance(column, np.ndarray) or column.ndim == 0:
                raise ValueError(f"column {name!r} must be a numpy array with a leading row axis")
        self.columns = {name: (column.dtype, column.shape[1:]) for name, column in batch.items()}
        self._count = len(self.columns)
        self._first = next(iter(batch))
        self._expect(len(batch[self._first]))
        self.rows(batch)

    def _expect(self, n: int) -> None:
        self._n = n
        self._expected = tuple((k, dt, (n, *shape)) for k, (dt, shape) in self.columns.items())

    def rows(self, batch: dict[str, np.ndarray]) -> int:
        """The batch's row count; a `ValueError` naming the column if it does not fit."""
        try:
            n = len(batch[self._first])
            if n != self._n:
                self._expect(n)
            if len(batch) == self._count:
                for name, dtype, shape in self._expected:
                    column = batch[name]
                    if column.shape != shape or column.dtype is not dtype:
                        break
                else:
                    return n
        except (KeyError, TypeError, AttributeError):
            pass
        return self._careful_rows(batch)

    def _careful_rows(self, batch: dict[str, np.ndarray]) -> int:
        """`rows` for a batch the fast check refused: it may still fit (an equal dtype need not be
        the same object); if not, the error names the first column at fault."""
        missing, extra = self.columns.keys() - batch.keys(), batch.keys() - self.columns.keys()
        if missing or extra:
            raise ValueError(
                f"batch columns differ: missing {sorted(missing)}, extra {sorted(extra)}"
            )
        for name, (dtype, trailing) in self.columns.items():
            column = batch[name]
            if not isinstance(column, np.ndarray) or column.ndim == 0:
                raise ValueError(f"column {name!r} is a {type(column).__name__}, not a row array")
            if column.dtype != dtype or column.shape[1:] != trailing:
                got, held = f"{column.dtype}{list(column.shape[1:])}", f"{dtype}{list(trailing)}"
                raise ValueError(f"column {name!r} is {got}, the table holds {held}")
        n = len(batch[self._first])
        for name in self.columns:
            if len(batch[name]) != n:
                raise ValueError(
                    f"column {name!r} has {len(batch[name])} rows, {self._first!r} {n}"
                )
        return n
