"""Every transition a collector produces, appended to an HDF5 replay log for offline analysis.

The log is a record, not a checkpoint: it grows for the whole run, so it cannot be rewritten
atomically like role files. Rows wait in memory (at most `flush_every` fragments); a flush
appends them and flushes HDF5's caches. Between flushes hpcmarl makes no HDF5 call on the file,
so what is on disk is exactly the last flush: a killed job leaves every flushed row readable.
The file stays open (reopening it per flush costs four times as much) without HDF5's file lock,
so an analysis may read it while training runs. A resumed run appends to the same file.

One group per agent (`/agents/<agent>`), not per policy: an agent's rows are one trajectory
stream, which is what analysis and the Minari/D4RL exports read, and the grouping does not
change when the policy mapping does. Columns carry the DESIGN.md §3 names; see
docs/replay-format.md for the full layout.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .hdf5 import _FILTERS, ATTR_TYPE, ATTR_VERSION, SCHEMA_VERSION, StorageError, atomic_path

LOG_TYPE = "replay_log"
"""`hpcmarl_type` of a replay log's root group."""
COLUMNS_TYPE = "replay_columns"
"""`hpcmarl_type` of a group whose datasets are columns of equal length."""
INDEX_TYPE = "wallclock_index"
"""`hpcmarl_type` of the group that maps wall-clock time to rows written."""
AGENTS = "agents"
WALLCLOCK = "wallclock"
CHUNK_BYTES = 32 << 10
"""Uncompressed bytes per chunk. Every flush recompresses the chunk it ends in, so the cost of a
flush grows with this; reads barely speed up beyond it."""
ActionBounds = tuple[Sequence[float], Sequence[float]]
"""A continuous action space's flat (low, high) bounds."""
SPACE_KEYS = ("agents", "policy_of", "observation_spaces", "action_spaces", "env_id")
"""Root attributes a resumed run must match to append to an existing log."""


class ReplayLogWriter:
    """Appends one collector's per-policy batches to `path`, one group per agent."""

    def __init__(
        self,
        path: str | Path,
        *,
        agents: list[str],
        policy_of: dict[str, str],
        obs_dims: dict[str, int],
        n_actions: dict[str, int],
        env_id: str,
        flush_every: int,
        meta: dict[str, Any],
        obs_dtypes: Mapping[str, str] | None = None,
        action_boxes: Mapping[str, ActionBounds] | None = None,
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        for agent in agents:
            if not agent or "/" in agent or agent == ".":
                raise ValueError(f"agent id {agent!r} cannot name an HDF5 group")
        self.path = Path(path)
        self.agents = list(agents)
        self.flush_every = flush_every
        self._fragments = 0
        self._pending: dict[int, list[dict[str, np.ndarray]]] = {k: [] for k in range(len(agents))}
        self._stamps: list[tuple[float, np.ndarray]] = []
        self._columns: dict[int, dict[str, h5py.Dataset]] = {}
        attrs = log_attrs(
            self.agents, policy_of, obs_dims, n_actions, env_id, obs_dtypes, action_boxes
        )
        session = {"opened": time.time(), "meta": meta}
        file = self._reopen(attrs, session) if self.path.exists() else None
        self._file: h5py.File | None = file or self._create(attrs, session)

    # -- public API ----------------------------------------------------------------------------
    def append(self, batch: Mapping[str, np.ndarray]) -> None:
        """Keep a copy of a batch of transition rows of any of the log's agents (the caller's
        arrays go on to an MPI send); they are written out by `end_fragment` or `flush`."""
        if self._file is None:
            raise ValueError(f"{self.path}: append after close")
        parts = self._split_by_agent(batch)
        added = np.zeros(len(self.agents), np.int64)
        for k, rows in parts.items():
            self._pending[k].append(rows)
            added[k] = len(rows["agent_id"])
        self._stamps.append((time.time(), added))

    def end_fragment(self) -> None:
        """A fragment's batches are all appended; every `flush_every` fragments, write out."""
        self._fragments += 1
        if self._fragments % self.flush_every == 0:
            self.flush()

    def flush(self) -> None:
        """Append the waiting rows and flush HDF5, so that they survive a kill."""
        if not self._stamps or self._file is None:
            return
        for k, parts in self._pending.items():
            if parts:
                self._append_rows(k, parts)
        _append_index(self._file[WALLCLOCK], self._stamps)
        self._file.flush()
        self._pending = {k: [] for k in self._pending}
        self._stamps = []

    def close(self) -> None:
        """Flush what is left and close the file; later calls do nothing."""
        if self._file is not None:
            self.flush()
            self._columns = {}
            self._file.close()
            self._file = None

    # -- helpers -------------------------------------------------------------------------------
    def _split_by_agent(self, batch: Mapping[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
        """Each agent's rows of the batch, copied (boolean indexing always copies)."""
        if "agent_id" not in batch:
            raise ValueError("a replay log batch needs an agent_id column")
        agent_id = np.asarray(batch["agent_id"])
        for name, column in batch.items():
            if np.ndim(column) == 0 or len(column) != len(agent_id):
                raise ValueError(f"column {name!r} does not have {len(agent_id)} rows")
        masks = {k: agent_id == k for k in np.unique(agent_id).tolist()}
        unknown = [k for k in masks if not 0 <= k < len(self.agents)]
        if unknown:
            raise ValueError(f"batch has rows of agent ids {unknown}; this log has {self.agents}")
        counts = {k: int(np.count_nonzero(m)) for k, m in masks.items()}
        return {
            k: {name: np.asarray(column)[masks[k]] for name, column in batch.items()}
            for k, n in counts.items()
            if n
        }

    def _append_rows(self, k: int, parts: list[dict[str, np.ndarray]]) -> None:
        """Extend every column of agent `k`; the first flush creates them. The datasets stay
        open so that the chunk a flush ended in is still in HDF5's cache for the next one."""
        columns = self._agent_columns(k, parts[0])
        for name, ds in columns.items():
            data = np.concatenate([p[name] for p in parts])
            if ds.dtype == np.float32 and data.dtype == np.uint8:  # see `_as_logged`
                data = data.astype(np.float32)
            if ds.dtype != data.dtype or ds.shape[1:] != data.shape[1:]:
                raise ValueError(
                    f"{ds.name} holds {ds.dtype}{list(ds.shape[1:])}, "
                    f"the batch has {data.dtype}{list(data.shape[1:])}"
                )
            old = ds.shape[0]
            ds.resize(old + len(data), axis=0)
            ds[old:] = data

    def _agent_columns(self, k: int, rows: dict[str, np.ndarray]) -> dict[str, h5py.Dataset]:
        """Agent `k`'s open column datasets, created from `rows` if the log has none yet."""
        if k not in self._columns:
            assert self._file is not None
            group = self._file[AGENTS][self.agents[k]]
            held = set(group)
            if held and held != set(rows):
                raise ValueError(
                    f"{group.name}: batch columns {sorted(rows)} differ from {sorted(held)}"
                )
            self._columns[k] = {
                name: group[name] if held else _create_column(group, name, data)
                for name, data in rows.items()
            }
        columns = self._columns[k]
        if columns.keys() != rows.keys():
            raise ValueError(f"batch columns {sorted(rows)} differ from {sorted(columns)}")
        return columns

    def _create(self, attrs: dict[str, str], session: dict[str, Any]) -> h5py.File:
        """A new, empty log, written whole to a temporary name so no half file ever exists."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        policy_of = json.loads(attrs["policy_of"])
        with atomic_path(self.path) as tmp, h5py.File(tmp, "w-") as f:
            _stamp(f, LOG_TYPE)
            f.attrs["format"] = "hpcmarl-replay-log"
            for key, value in attrs.items():
                f.attrs[key] = value
            f.attrs["sessions"] = json.dumps([session], default=str)
            agents = f.create_group(AGENTS)
            _stamp(agents, "agents")
            for k, agent in enumerate(self.agents):
                group = agents.create_group(agent)
                _stamp(group, COLUMNS_TYPE)
                group.attrs["agent"] = agent
                group.attrs["agent_index"] = np.int64(k)
                group.attrs["policy"] = policy_of[agent]
            _create_index(f, len(self.agents))
        return h5py.File(self.path, "r+", locking=False)

    def _reopen(self, attrs: dict[str, str], session: dict[str, Any]) -> h5py.File | None:
        """The existing log, ready to append to; None if it is damaged (it is moved aside)."""
        try:
            f = h5py.File(self.path, "r+", locking=False)
        except OSError as err:
            aside = self.path.with_name(f"{self.path.name}.damaged-{int(time.time())}")
            self.path.rename(aside)
            print(
                f"hpcmarl: warning: replay log {self.path} cannot be opened ({err}); "
                f"moved it to {aside} and started a new one",
                file=sys.stderr,
            )
            return None
        try:
            _check_same_job(f, _as_logged(f, attrs), self.path)
            sessions = json.loads(_text(f.attrs.get("sessions", "[]")))
            f.attrs["sessions"] = json.dumps([*sessions, session], default=str)
        except BaseException:
            f.close()
            raise
        return f


def log_attrs(
    agents: list[str],
    policy_of: dict[str, str],
    obs_dims: dict[str, int],
    n_actions: dict[str, int],
    env_id: str,
    obs_dtypes: Mapping[str, str] | None = None,
    action_boxes: Mapping[str, ActionBounds] | None = None,
) -> dict[str, str]:
    """The root attributes that describe the data, as JSON strings any HDF5 tool can show.

    Spaces use Minari's serialisation: observations are flat boxes (the collector flattens
    them) of float32, or of uint8 from 0 to 255 for agents whose `obs_dtypes` is `|u1` (image
    spaces: the rows are stored as uint8); actions are discrete, or for agents in
    `action_boxes` (continuous actions) flat float32 boxes of `n_actions` values with the
    env's bounds, whose rows hold the policy's unclipped samples.
    """
    obs = {a: _obs_box(obs_dims[a], (obs_dtypes or {}).get(a, "<f4")) for a in agents}
    boxes = action_boxes or {}
    act = {a: _action_space(n_actions[a], boxes.get(a)) for a in agents}
    return {
        "agents": json.dumps(agents),
        "policy_of": json.dumps({a: policy_of[a] for a in agents}),
        "observation_spaces": json.dumps(obs),
        "action_spaces": json.dumps(act),
        "env_id": env_id,
    }


def _action_space(n: int, box: ActionBounds | None) -> dict[str, Any]:
    """Minari's serialised space of an agent's actions: `Discrete(n)`, or the flat float32
    box of width `n` within `box`'s (low, high)."""
    if box is None:
        return {"type": "Discrete", "dtype": "int64", "start": 0, "n": n}
    low, high = box
    return {"type": "Box", "dtype": "float32", "shape": [n], "low": list(low), "high": list(high)}


def _obs_box(width: int, dtype: str) -> dict[str, Any]:
    if np.dtype(dtype) == np.uint8:
        return {"type": "Box", "dtype": "uint8", "shape": [width], "low": 0, "high": 255}
    inf = float("inf")
    return {"type": "Box", "dtype": "float32", "shape": [width], "low": -inf, "high": inf}


def _as_logged(f: h5py.File, attrs: dict[str, str]) -> dict[str, str]:
    """`attrs` with the log's own float32 observation space for each agent whose images it began
    to record as float32 (before they were stored as uint8): a resumed run goes on appending
    to it in float32, the pixel values exactly, rather than being refused."""
    held, ours = (json.loads(_text(a) or "{}") for a in (f.attrs.get(OBS_KEY), attrs[OBS_KEY]))
    for agent, space in ours.items():
        before = held.get(agent)
        if space["dtype"] == "uint8" and before == _obs_box(space["shape"][0], "<f4"):
            ours[agent] = before
    return {**attrs, OBS_KEY: json.dumps(ours)}


OBS_KEY = "observation_spaces"


def _stamp(group: h5py.Group, kind: str) -> None:
    group.attrs[ATTR_VERSION] = np.int64(SCHEMA_VERSION)
    group.attrs[ATTR_TYPE] = kind


def _check_same_job(f: h5py.File, attrs: dict[str, str], path: Path) -> None:
    """Appending rows of another environment or agent set would make the file meaningless."""
    if _text(f.attrs.get(ATTR_TYPE)) != LOG_TYPE:
        raise StorageError(
            f"{path} exists and is not an hpcmarl replay log",
            "move it away or set another runtime.run_dir",
        )
    for key in SPACE_KEYS:
        held = _text(f.attrs.get(key))
        if key != "env_id" and held is not None:
            same = json.loads(held) == json.loads(attrs[key])
        else:
            same = held == attrs[key]
        if not same:
            raise StorageError(
                f"{path} holds a replay log of another job ({key} is {held}, "
                f"this run has {attrs[key]})",
                "give this run its own runtime.run_dir, or move the old log away",
            )


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _create_index(f: h5py.File, n_agents: int) -> None:
    index = f.create_group(WALLCLOCK)
    _stamp(index, INDEX_TYPE)
    opts = {**_FILTERS, "chunks": (1024,), "maxshape": (None,)}
    index.create_dataset("time", shape=(0,), dtype="<f8", **opts)
    opts = {**_FILTERS, "chunks": (1024, n_agents), "maxshape": (None, n_agents)}
    index.create_dataset("rows", shape=(0, n_agents), dtype="<i8", **opts)


def _append_index(index: h5py.Group, stamps: list[tuple[float, np.ndarray]]) -> None:
    """One entry per fragment: when it was appended and how many rows each agent had then."""
    times = np.array([t for t, _ in stamps], np.float64)
    rows = np.cumsum(np.stack([added for _, added in stamps]), axis=0)
    time_ds, rows_ds = index["time"], index["rows"]
    old = time_ds.shape[0]
    if old:
        rows += rows_ds[old - 1]
    for ds, data in ((time_ds, times), (rows_ds, rows)):
        ds.resize(old + len(data), axis=0)
        ds[old:] = data


def _create_column(group: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    trailing = data.shape[1:]
    row_bytes = max(1, data.dtype.itemsize * int(np.prod(trailing, dtype=np.int64)))
    rows = 1 << max(6, min(16, (CHUNK_BYTES // row_bytes).bit_length() - 1))
    opts = {**_FILTERS, "chunks": (rows, *trailing), "maxshape": (None, *trailing)}
    ds = group.create_dataset(name, shape=(0, *trailing), dtype=data.dtype, **opts)
    ds.attrs[ATTR_TYPE] = "column"
    return ds
