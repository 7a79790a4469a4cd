"""The empirical payoff table of a PSRO population: what each matchup of policies earned.

Entry `(i_0, ..., i_{P-1})` is the matchup in which player p plays its policy `i_p`. The table
keeps per-player sums, sums of squares and episode counts rather than means, so evaluation
episodes from any number of collector tasks add up in any order and a standard error comes for
free. A PSRO iteration adds one policy per player (`add_policy`), which opens a new slab of
entries; `missing` lists those that still want episodes, so the schedule knows which matchups to
hand to collectors. The arrays are the checkpoint (`state_dict`), and every entry recorded
before a growth or a resume is kept bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpcmarl.storage.hdf5 import (
    ATTR_TYPE,
    ATTR_VERSION,
    DAMAGED_FIX,
    SCHEMA_VERSION,
    StorageError,
    check_group,
)

HDF5_TYPE = "psro_payoff_table"
"""The `hpcmarl_type` stamped on a group written by `PayoffTable.save`."""

_NAMES = ("sums", "sums_sq", "counts")


class PayoffTable:
    """Per-entry sums [P, *sizes], sums of squares [P, *sizes] and episode counts [*sizes]."""

    def __init__(self, n_players: int = 2) -> None:
        if n_players < 1:
            raise ValueError(f"a payoff table needs at least one player, not {n_players}")
        empty = (0,) * n_players
        self.sums = np.zeros((n_players, *empty))
        self.sums_sq = np.zeros((n_players, *empty))
        self._counts = np.zeros(empty, dtype=np.int64)

    @property
    def n_players(self) -> int:
        return self.sums.shape[0]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Population size of each player: the length of each axis."""
        return tuple(self._counts.shape)

    @property
    def counts(self) -> np.ndarray:
        """Episodes recorded per entry [*sizes] (a read-only view)."""
        view = self._counts.view()
        view.flags.writeable = False
        return view

    def add_policy(self, player: int) -> int:
        """Open a new policy's row (column, slab) for `player`, unplayed; returns its index."""
        self._check_player(player)
        index = self.sizes[player]
        self.sums = _grown(self.sums, player + 1)
        self.sums_sq = _grown(self.sums_sq, player + 1)
        self._counts = _grown(self._counts, player)
        return index

    def record(self, entry: tuple[int, ...], returns: np.ndarray) -> None:
        """Add evaluation episodes of one matchup: returns [P] (one) or [n_episodes, P]."""
        entry = self._checked_entry(entry)
        episodes = np.atleast_2d(np.asarray(returns, dtype=np.float64))
        if episodes.ndim != 2 or episodes.shape[1] != self.n_players:
            raise ValueError(
                f"returns of shape {np.shape(returns)} do not fit a {self.n_players}-player "
                f"table: pass [n_players] for one episode or [n_episodes, n_players]"
            )
        if not np.isfinite(episodes).all():
            raise ValueError(f"returns for entry {entry} hold NaN or infinite values")
        for player in range(self.n_players):
            self.sums[(player, *entry)] += episodes[:, player].sum()
            self.sums_sq[(player, *entry)] += (episodes[:, player] ** 2).sum()
        self._counts[entry] += len(episodes)

    def record_moments(
        self, entry: tuple[int, ...], episodes: int, sums: Any, sums_sq: Any
    ) -> None:
        """Add `episodes` episodes of one matchup given as per-player sums and sums of squares
        [P] (what an evaluation task reports instead of every episode's returns)."""
        entry = self._checked_entry(entry)
        sums, sums_sq = (np.asarray(x, dtype=np.float64) for x in (sums, sums_sq))
        if sums.shape != (self.n_players,) or sums_sq.shape != (self.n_players,) or episodes < 1:
            raise ValueError(
                f"moments of shapes {sums.shape}, {sums_sq.shape} over {episodes} episodes do "
                f"not fit a {self.n_players}-player table"
            )
        if not (np.isfinite(sums).all() and np.isfinite(sums_sq).all()):
            raise ValueError(f"moments for entry {entry} hold NaN or infinite values")
        for player in range(self.n_players):
            self.sums[(player, *entry)] += sums[player]
            self.sums_sq[(player, *entry)] += sums_sq[player]
        self._counts[entry] += int(episodes)

    def mean(self) -> np.ndarray:
        """Mean return per player and entry [P, *sizes]; NaN where no episode was recorded."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._counts > 0, self.sums / self._counts, np.nan)

    def standard_error(self) -> np.ndarray:
        """Standard error of each mean [P, *sizes] (sample std, ddof 1); NaN under 2 episodes."""
        n = self._counts.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = (self.sums_sq - self.sums**2 / n) / (n - 1)
            error = np.sqrt(np.clip(variance, 0.0, None) / n)
        return np.where(self._counts > 1, error, np.nan)

    def missing(self, wanted: int) -> list[tuple[int, ...]]:
        """Entries with fewer than `wanted` episodes, in row-major order (new slabs included)."""
        return [tuple(int(i) for i in entry) for entry in np.argwhere(self._counts < wanted)]

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the three arrays: a tree the checkpoint writer stores as datasets."""
        return {
            "sums": self.sums.copy(),
            "sums_sq": self.sums_sq.copy(),
            "counts": self.counts.copy(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray]) -> PayoffTable:
        absent = [name for name in _NAMES if name not in state]
        if absent:
            raise ValueError(f"a payoff-table state lacks {absent}; it holds {sorted(state)}")
        sums, sums_sq = (np.array(state[name], dtype=np.float64) for name in _NAMES[:2])
        counts = np.array(state["counts"])
        if counts.dtype.kind not in "iu" or sums.shape != sums_sq.shape:
            raise ValueError(
                f"a payoff-table state with counts of dtype {counts.dtype}, sums {sums.shape} "
                f"and sums_sq {sums_sq.shape} is not one PayoffTable.state_dict wrote"
            )
        if sums.ndim < 2 or sums.shape != (sums.ndim - 1, *counts.shape):
            raise ValueError(
                f"payoff-table arrays do not agree: sums {sums.shape}, counts {counts.shape} "
                f"(sums must be [n_players, *counts.shape] with one axis per player)"
            )
        table = cls(sums.shape[0])
        table.sums, table.sums_sq, table._counts = sums, sums_sq, counts.astype(np.int64)
        return table

    def save(self, group: h5py.Group) -> None:
        """Write the arrays as plain datasets of `group`, readable by any h5py user."""
        group.attrs[ATTR_VERSION] = SCHEMA_VERSION
        group.attrs[ATTR_TYPE] = HDF5_TYPE
        for name, array in self.state_dict().items():
            if name in group:
                del group[name]
            group.create_dataset(name, data=array)

    @classmethod
    def load(cls, group: h5py.Group) -> PayoffTable:
        file = Path(group.file.filename)
        check_group(group, file, HDF5_TYPE)
        state = {
            name: group[name][()] for name in _NAMES if isinstance(group.get(name), h5py.Dataset)
        }
        try:
            return cls.from_state(state)
        except ValueError as error:
            raise StorageError(f"{file} (group {group.name}): {error}", DAMAGED_FIX) from None

    def _check_player(self, player: int) -> None:
        if not 0 <= player < self.n_players:
            raise IndexError(f"player {player} is not one of this table's {self.n_players}")

    def _checked_entry(self, entry: tuple[int, ...]) -> tuple[int, ...]:
        index = tuple(int(i) for i in entry)
        inside = all(0 <= i < n for i, n in zip(index, self.sizes, strict=False))
        if len(index) != self.n_players or not inside:
            raise IndexError(f"entry {entry} is outside a payoff table of sizes {self.sizes}")
        return index


def _grown(array: np.ndarray, axis: int) -> np.ndarray:
    """`array` with one zero slab appended along `axis`; everything already there is kept."""
    pad = [(0, 0)] * array.ndim
    pad[axis] = (0, 1)
    return np.pad(array, pad)
