"""Replay logs and checkpoint replay tables, opened for streaming reads behind one view.

A `Table` is one group of equal-length columns: an agent's rows in a replay log
(`/agents/<agent>`), or a policy's rows in a checkpoint replay file (`/tables/<policy>/column`,
oldest first, with priorities beside them). A `Source` is the tables whose episodes belong
together: one collector's log, or all replay files of one checkpoint (a collector's fragments
go round robin to the shards, so an episode is split across them).

Opening trusts nothing, with the checks of `hpcmarl.storage.hdf5`: files are sniffed before
HDF5 parses them, every group must carry hpcmarl's schema attributes, links are refused, and
datasets must be plain numeric arrays stored in the file. Every problem becomes a
`StorageError` naming the file, the cause and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..items.spec import ItemSpec
from ..replay.columns import BOOKKEEPING_COLUMNS
from ..replay.compact import StorageForm
from ..replay.compact_items import decode_items, form_of
from ..storage.checkpoint import latest_checkpoint
from ..storage.hdf5 import (
    ATTR_JSON,
    DAMAGED_FIX,
    FOREIGN_FIX,
    StorageError,
    check_group,
    checked_member,
    plain,
    sniff,
)
from ..storage.hdf5 import damaged as storage_damaged
from ..storage.replay_log import AGENTS, COLUMNS_TYPE, INDEX_TYPE, LOG_TYPE, WALLCLOCK

REBUILT = ("observations", "next_observations", "state", "next_state")
"""Columns a compact joint table rebuilds from what it stores."""
STATS_COLUMNS = ("actions", "rewards", "terminations", "truncations", *BOOKKEEPING_COLUMNS)
"""The columns analysis reads; observations are left on disk."""
TRANSITION_COLUMNS = ("observations", "next_observations")
CHECKPOINT_TYPE = "role_state"
_REPLAY_DAMAGED_FIX = (
    "the file is damaged: use another copy of it, or the run's checkpoint replay files "
    "(RUN_DIR/checkpoints/<id>/replay<N>.h5)"
)
_REPLAY_FIX = (
    "give a replay log (RUN_DIR/replay/<collector>.h5), a checkpoint replay file "
    "(RUN_DIR/checkpoints/<id>/replay<N>.h5) or a run directory"
)


@dataclass
class Table:
    """One group of equal-length columns, read in row ranges."""

    file: Path
    group: str
    policy: str
    rows: int
    datasets: dict[str, h5py.Dataset]
    priorities: h5py.Dataset | None = None
    compact: bool = False
    """A checkpoint table in compact form (replay.stack_num, ignore_obs_next): its observations
    are single frames and it may hold no next observations."""

    def require(self, names: tuple[str, ...]) -> None:
        """Refuse a table that lacks a column the caller needs (an empty log group has none)."""
        if self.compact and any(n in TRANSITION_COLUMNS for n in names):
            raise StorageError(
                f"{self.file}: {self.group} stores compact transitions (replay.stack_num or "
                "replay.ignore_obs_next): single frames, maybe no next observations",
                "export the run's replay logs (RUN_DIR/replay/, from replay_log.enabled=true), "
                "which hold full rows",
            )
        missing = [n for n in names if n not in self.datasets]
        if self.rows and missing:
            raise StorageError(
                f"{self.file}: {self.group} has no {', '.join(missing)} column"
                f"{'s' if len(missing) > 1 else ''}",
                f"{_REPLAY_FIX}; files edited by hand or written by other tools lack columns",
            )

    def read(self, names: tuple[str, ...], start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows [start, stop) of the named columns (plus `priorities` when asked and held)."""
        try:
            out = {n: self.datasets[n][start:stop] for n in names if n in self.datasets}
            if "priorities" in names and self.priorities is not None:
                out["priorities"] = self.priorities[start:stop]
        except (OSError, RuntimeError, ValueError) as err:
            raise damaged(self.file, err) from err
        return out


class JointTable(Table):
    """A checkpoint table of joint items (a team's episodes or sequences, `[T, agents, ...]`)
    read as the per-agent transition rows it holds: one per agent and real step (`filled` and
    `active`), `agent_id` the agent's place in the group. A sequence that starts mid-episode
    begins with the previous sequence's last `overlap` steps; those rows are left to it, so
    each step is read once. Row ranges are in those rows, as for any table."""

    def __init__(
        self,
        file: Path,
        group: str,
        policy: str,
        datasets: dict[str, h5py.Dataset],
        priorities: h5py.Dataset | None,
        spec: ItemSpec,
        form: StorageForm | None = None,
    ) -> None:
        self.file, self.spec = file, spec
        self.form = form if form is not None and form.compact else None
        """The compact form the items are stored in (`replay.compact_items`), if any."""
        self.per_group = {c.name for c in spec.columns if c.per == "group"}
        self.held = self._held(datasets)
        """bool [items, T, agents]: the rows each item holds (read once, at open)."""
        counts = self.held.reshape(len(self.held), -1).sum(axis=1)
        self.first = np.concatenate([[0], np.cumsum(counts)])
        """Row index of each item's first row (and, last, the row count)."""
        super().__init__(file, group, policy, int(self.first[-1]), datasets, priorities)

    def _held(self, datasets: dict[str, h5py.Dataset]) -> np.ndarray:
        try:
            filled = datasets["filled"][:]
            active = datasets["active"][:] if "active" in datasets else None
            first_step = datasets["step"][:, 0]
        except (OSError, RuntimeError, ValueError) as err:
            raise damaged(self.file, err) from err
        held = np.repeat(filled[:, :, None], self.spec.agents, axis=2)
        if active is not None:
            held &= active
        if self.spec.overlap:
            held[first_step > 0, : self.spec.overlap] = False
        return held

    def require(self, names: tuple[str, ...]) -> None:
        made = ("agent_id", *(REBUILT if self.form else ()))  # from the agents axis, or rebuilt
        super().require(tuple(n for n in names if n not in made))

    def read(self, names: tuple[str, ...], start: int, stop: int) -> dict[str, np.ndarray]:
        lo = int(np.searchsorted(self.first, start, side="right")) - 1
        hi = int(np.searchsorted(self.first, stop, side="left"))
        wanted = tuple(n for n in names if n != "agent_id")
        if self.form is not None and any(n in REBUILT for n in wanted):
            extra = ("priorities",) if "priorities" in wanted else ()
            items = decode_items(super().read((*self.datasets, *extra), lo, hi), self.form)
            items = {n: items[n] for n in wanted if n in items}
        else:
            items = super().read(wanted, lo, hi)
        held = self.held[lo:hi]
        out: dict[str, np.ndarray] = {}
        for name, column in items.items():
            if name == "priorities":  # one per item
                column = np.broadcast_to(column[:, None, None], held.shape)
            elif name in self.per_group:
                column = np.broadcast_to(column[:, :, None], (*held.shape, *column.shape[2:]))
            out[name] = column[held]
        if "agent_id" in names:
            out["agent_id"] = np.broadcast_to(np.arange(held.shape[2]), held.shape)[held]
        skip = start - int(self.first[lo])
        return {k: v[skip : skip + stop - start] for k, v in out.items()}


@dataclass
class Source:
    """Tables whose episodes belong together, and what the files say about them."""

    label: str
    kind: str
    files: list[Path]
    tables: list[Table]
    agents: list[str]
    policy_of: dict[str, str]
    env_id: str | None = None
    n_actions: dict[str, int] = field(default_factory=dict)
    observation_spaces: dict[str, Any] = field(default_factory=dict)
    action_spaces: dict[str, Any] = field(default_factory=dict)
    wallclock: tuple[h5py.Dataset, h5py.Dataset] | None = None
    team: int = 0
    """Agents with a row in every env step of an episode: all of them (an agent that finished
    early gets padding rows), so an episode is complete once `team` agents are done."""

    def agent_index(self, name_or_index: str) -> int:
        """The agent's index for `--agent`: its name, or its number."""
        if name_or_index in self.agents:
            return self.agents.index(name_or_index)
        if name_or_index.lstrip("#").isdigit() and int(name_or_index.lstrip("#")) < len(
            self.agents
        ):
            return int(name_or_index.lstrip("#"))
        raise StorageError(
            f"{self.label} has no agent {name_or_index!r}; its agents are {self.agents}",
            "pass one of them with --agent",
        )


def chunks(
    source: Source, names: tuple[str, ...], chunk_rows: int
) -> Iterator[tuple[Table, int, dict[str, np.ndarray]]]:
    """(table, first row, columns) of every table, the tables advancing together in proportion
    to their length, so rows written at about the same time are read at about the same time and
    an episode split over tables is reassembled with few rows held."""
    longest = max((t.rows for t in source.tables), default=0)
    steps = -(-longest // max(1, chunk_rows))
    for i in range(steps):
        for table in source.tables:
            start, stop = table.rows * i // steps, table.rows * (i + 1) // steps
            if stop > start:
                yield table, start, table.read(names, start, stop)


# -- finding and opening files -----------------------------------------------------------------
def replay_files(paths: list[str | Path]) -> list[Path]:
    """The replay files named by files or run directories (their logs, else the newest
    checkpoint's replay tables)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(_files_in(p) if p.is_dir() else [p])
    return files


def _files_in(folder: Path) -> list[Path]:
    logs = sorted((folder / "replay").glob("*.h5"))
    if logs:
        return logs
    if (folder / "checkpoints").is_dir():
        ckpt, _ = latest_checkpoint(folder)
        if ckpt is not None:
            return sorted(ckpt.path.glob("replay*.h5"))
    shards = sorted(folder.glob("replay*.h5"))
    if shards:
        return shards
    raise StorageError(
        f"{folder} holds no replay files (no replay/*.h5, no complete checkpoint)",
        "run the job with replay_log.enabled=true, or give the path of a replay file",
    )


def open_sources(paths: list[str | Path], stack: ExitStack) -> list[Source]:
    """Every replay file, open until `stack` closes; checkpoint files of one folder form one
    source, each log file its own."""
    sources: list[Source] = []
    shards: dict[Path, list[tuple[Path, h5py.File]]] = {}
    for file in replay_files(paths):
        f = _open(file, stack)
        kind = plain(f.attrs.get("hpcmarl_type"))
        if kind == LOG_TYPE:
            sources.append(_log_source(file, f))
        elif kind == CHECKPOINT_TYPE and "tables" in f:
            shards.setdefault(file.parent, []).append((file, f))
        else:
            raise StorageError(f"{file} holds a {kind!r} without replay tables", _REPLAY_FIX)
    sources.extend(_checkpoint_source(folder, opened) for folder, opened in shards.items())
    return sources


def _open(file: Path, stack: ExitStack) -> h5py.File:
    sniff(file)
    try:
        f = stack.enter_context(h5py.File(file, "r", locking=False))
    except (OSError, RuntimeError, ValueError) as err:
        raise damaged(file, err) from err
    check_group(f, file, None)
    return f


def damaged(file: Path, err: Exception) -> StorageError:
    """hdf5's diagnosis of a file HDF5 cannot read, with a fix that fits replay files."""
    error = storage_damaged(file, err)
    return StorageError(error.cause, _REPLAY_DAMAGED_FIX) if error.fix == DAMAGED_FIX else error


def _member(group: h5py.Group, key: str, file: Path, kind: str | None) -> Any:
    if group.get(key, getlink=True) is None:
        raise StorageError(f"{file}: {group.name} has no {key!r}", _REPLAY_FIX)
    return checked_member(group, key, file, kind)


def _columns(group: h5py.Group, file: Path) -> tuple[dict[str, h5py.Dataset], int]:
    datasets = {key: _member(group, key, file, None) for key in group}
    lengths = {len(ds) if ds.ndim else -1 for ds in datasets.values()}
    if len(lengths) > 1 or -1 in lengths:
        raise StorageError(
            f"{file}: the columns of {group.name} differ in length", "the file is damaged"
        )
    return datasets, lengths.pop() if lengths else 0


def _json_attr(f: h5py.File, key: str, file: Path) -> Any:
    try:
        return json.loads(plain(f.attrs[key]))
    except (KeyError, TypeError, ValueError):
        raise StorageError(
            f"{file}: root attribute {key!r} is missing or not JSON", FOREIGN_FIX
        ) from None


def _log_source(file: Path, f: h5py.File) -> Source:
    agents = _json_attr(f, "agents", file)
    policy_of = _json_attr(f, "policy_of", file)
    actions = _json_attr(f, "action_spaces", file)
    group = _member(f, AGENTS, file, None)
    tables = []
    for agent in agents:
        sub = _member(group, agent, file, COLUMNS_TYPE)
        datasets, rows = _columns(sub, file)
        tables.append(Table(file, sub.name, policy_of[agent], rows, datasets))
    index = _member(f, WALLCLOCK, file, INDEX_TYPE)
    time_ds, rows_ds = _member(index, "time", file, None), _member(index, "rows", file, None)
    return Source(
        label=str(file),
        kind=LOG_TYPE,
        files=[file],
        tables=tables,
        agents=list(agents),
        policy_of=dict(policy_of),
        env_id=plain(f.attrs.get("env_id")),
        n_actions={a: action_count(space) for a, space in actions.items()},
        observation_spaces=_json_attr(f, "observation_spaces", file),
        action_spaces=actions,
        wallclock=(time_ds, rows_ds),
        team=len(agents),
    )


def action_count(space: dict[str, Any]) -> int:
    """A log's serialised action space's size: a `Discrete` space's count, a (flat) `Box`'s
    width."""
    return int(space["shape"][0]) if space.get("type") == "Box" else int(space["n"])


def continuous_agents(source: Source) -> list[str]:
    """The agents whose actions the source's files record as `Box` (float32 vectors)."""
    return [a for a, space in source.action_spaces.items() if space.get("type") == "Box"]


def _checkpoint_source(folder: Path, opened: list[tuple[Path, h5py.File]]) -> Source:
    """Checkpoint tables do not name their agents: they are shown by index (`#0`), and the
    agent count is the number of distinct `agent_id` values held (a team's episodes and
    sequences: the agent's place in the team). On-policy queues hold
    fragments ([T, agents, ...] items), not transition rows: they are left out (replay logs
    hold the same steps as rows)."""
    tables: list[Table] = []
    queues = 0
    for file, f in opened:
        specs = _item_specs(f, file)
        group = _member(f, "tables", file, "tree")
        for policy in group:
            sub = _member(group, policy, file, "tree")
            if "queue_counters" in sub:
                queues += 1
                continue
            if "column" not in sub:
                continue  # a table that never received an item holds no columns
            datasets, rows = _columns(_member(sub, "column", file, "tree"), file)
            priorities = _member(sub, "priorities", file, None) if "priorities" in sub else None
            spec = specs.get(policy)
            if spec is not None and spec.joint:
                form = form_of(sub)
                tables.append(JointTable(file, sub.name, policy, datasets, priorities, spec, form))
            else:
                compact = "storage_form" in sub
                tables.append(Table(file, sub.name, policy, rows, datasets, priorities, compact))
    if queues and not tables:
        raise StorageError(
            f"{opened[0][0]} holds only on-policy fragment queues, no transition tables",
            "analyse the run's replay logs instead (run it with replay_log.enabled=true)",
        )
    ids = _agent_ids(tables)
    agents = [f"#{k}" for k in range(int(ids.max()) + 1 if len(ids) else 0)]
    policy_of = {}
    for table in tables:
        for k in _agent_ids([table]):
            policy_of[f"#{k}"] = table.policy
    files = [file for file, _ in opened]
    label = str(files[0]) if len(files) == 1 else f"{folder}/replay*.h5"
    return Source(label, "checkpoint", files, tables, agents, policy_of, team=len(ids))


def _item_specs(f: h5py.File, file: Path) -> dict[str, ItemSpec]:
    """The shard's item spec of each table (saved since episodes and sequences; older files
    hold transitions only)."""
    if "items" not in f:
        return {}
    try:
        texts = json.loads(plain(f["items"].attrs[ATTR_JSON]))
        return {group: ItemSpec.from_json(text) for group, text in texts.items()}
    except (KeyError, TypeError, ValueError):
        raise StorageError(f"{file}: its item specs are not readable JSON", FOREIGN_FIX) from None


def _agent_ids(tables: list[Table], chunk_rows: int = 1 << 16) -> np.ndarray:
    seen = np.zeros(0, np.int64)
    for table in tables:
        table.require(("agent_id",))
        for start in range(0, table.rows, chunk_rows):
            ids = table.read(("agent_id",), start, start + chunk_rows)["agent_id"]
            seen = np.union1d(seen, np.unique(ids))
    return seen
