"""Offline datasets: replay files that fill the replay shards in place of collectors.

A job with `offline.dataset` trains on transitions recorded earlier: replay logs written by
collectors (`RUN_DIR/replay/<collector>.h5`), a checkpoint's replay tables, or a run directory
holding either. Nothing else changes: learners sample from the shards as they always do, the
shards checkpoint what they hold, and collectors only run the greedy evaluations.

Rank 0 checks the dataset against the job before any work starts (`check_dataset`): the files
must be readable replay files of the same environment, agents and space sizes, every policy must
have rows, and each shard's share must fit its table. Every shard then reads only its share
(`load_share`): a policy's rows, in file order, are cut into one contiguous range per shard, so
every shard holds rows of every policy and no learner request waits on an empty table.

Rows go to the policy the *job* maps their agent to (`agent_id` indexes the env's agent list),
so a dataset recorded with shared weights can train independent policies, and vice versa. For
an environment with legal-action masks the dataset must hold them too (`MASK_COLUMNS`): the
job's items carry them, and a target over illegal actions would be wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.reader import Source, Table, continuous_agents, open_sources, replay_files
from ..config.schema import JobConfig
from ..errors import ConfigError
from ..storage.hdf5 import StorageError
from .columns import BATCH_COLUMNS, MASK_COLUMNS

if TYPE_CHECKING:
    from ..launch.build import EnvSpec

CHUNK_ROWS = 1 << 16


@dataclass
class Stream:
    """One agent's rows in one table, in file order."""

    table: Table
    agent: int
    rows: int
    whole: bool
    """Every row of the table is this agent's (a log's agent group): read ranges directly."""
    columns: tuple[str, ...] = BATCH_COLUMNS
    """The columns the job's items need from it."""


def dataset_columns(spec: EnvSpec) -> tuple[str, ...]:
    """The columns an offline job reads: every transition column, and the masks where the env
    has them."""
    return BATCH_COLUMNS + MASK_COLUMNS if spec.action_masks else BATCH_COLUMNS


def check_dataset(cfg: JobConfig, spec: EnvSpec) -> dict[str, int]:
    """Refuse a dataset or job that cannot train; return the transitions per policy."""
    c = cfg.commander
    if not (c.max_updates or c.max_wall_time_s):
        raise ConfigError(
            "offline training collects no env steps, so commander.max_env_steps never stops it",
            "set commander.max_updates (e.g. 20000) or commander.max_wall_time_s",
        )
    shards, capacity = cfg.topology.replay_shards, cfg.replay.table_capacity
    with ExitStack() as stack:
        streams = survey(cfg.offline.dataset, spec, stack, env_id=cfg.env.id)
    rows = {p: sum(s.rows for s in streams.get(p, [])) for p in spec.policies}
    for policy, n in rows.items():
        members = [a for a in spec.agents if spec.policy_of[a] == policy]
        if n < shards:
            raise ConfigError(
                f"offline.dataset holds {n} transitions of policy {policy} (agents {members}), "
                f"fewer than the {shards} replay shards that each need some",
                "record more data, or map these agents to a policy that has data",
            )
        share = -(-n // shards)
        if share > capacity:
            raise ConfigError(
                f"offline.dataset holds {n} transitions of policy {policy}: {share} per replay "
                f"shard, above replay.table_capacity = {capacity}",
                f"set replay.table_capacity={share} or topology.replay_shards="
                f"{-(-n // capacity)} so that the whole dataset is held",
            )
    return rows


def load_share(
    dataset: str, spec: EnvSpec, index: int, shards: int
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """(policy, batch) chunks of shard `index`'s share, at most `CHUNK_ROWS` rows each."""
    with ExitStack() as stack:
        for policy, streams in survey(dataset, spec, stack).items():
            total = sum(s.rows for s in streams)
            lo, hi = total * index // shards, total * (index + 1) // shards
            offset = 0
            for stream in streams:
                start, stop = max(lo - offset, 0), min(hi - offset, stream.rows)
                if stop > start:
                    for batch in read_stream(stream, start, stop):
                        yield policy, batch
                offset += stream.rows


def survey(
    dataset: str, spec: EnvSpec, stack: ExitStack, env_id: str | None = None
) -> dict[str, list[Stream]]:
    """The dataset's rows as per-agent streams grouped by the job's policy; files stay open
    until `stack` closes. With `env_id`, also check every file against the job."""
    path = Path(dataset)
    if not path.exists():
        raise ConfigError(
            f"offline.dataset = {dataset!r} does not exist",
            "give a replay file (RUN_DIR/replay/<collector>.h5), a checkpoint replay file or "
            "a run directory",
        )
    streams: dict[str, list[Stream]] = {}
    columns = dataset_columns(spec)
    for source in open_sources(list(replay_files([path])), stack):
        _refuse_continuous(source)
        if env_id is not None:
            _check_origin(source, spec, env_id)
        found = []
        for table in source.tables:
            table.require(columns)
            found += _streams_of(source, table, spec.agents, columns)
        if env_id is not None:
            _check_sizes(found, spec, env_id, source.n_actions)
        for stream in found:
            streams.setdefault(spec.policy_of[spec.agents[stream.agent]], []).append(stream)
    return streams


def read_stream(stream: Stream, start: int, stop: int) -> Iterator[dict[str, np.ndarray]]:
    """Rows [start, stop) of the stream, counted among its agent's rows, in chunks."""
    table = stream.table
    if stream.whole:
        for first in range(start, stop, CHUNK_ROWS):
            yield table.read(stream.columns, first, min(first + CHUNK_ROWS, stop))
        return
    seen = 0  # the agent's rows before this chunk
    for first in range(0, table.rows, CHUNK_ROWS):
        if seen >= stop:
            return
        chunk = table.read(stream.columns, first, first + CHUNK_ROWS)
        agents = chunk["agent_id"] == stream.agent
        position = np.cumsum(agents) - 1 + seen
        mine = agents & (position >= start) & (position < stop)
        seen = int(position[-1]) + 1 if len(position) else seen
        if mine.any():
            yield {name: column[mine] for name, column in chunk.items()}


def _streams_of(
    source: Source, table: Table, agents: list[str], columns: tuple[str, ...]
) -> list[Stream]:
    """A log group is one agent; a checkpoint table may mix agents, counted by a scan."""
    if source.kind != "checkpoint":
        agent = agents.index(source.agents[source.tables.index(table)])
        return [Stream(table, agent, table.rows, whole=True, columns=columns)]
    counts = np.zeros(len(agents), np.int64)
    for first in range(0, table.rows, CHUNK_ROWS):
        ids = table.read(("agent_id",), first, first + CHUNK_ROWS)["agent_id"].astype(np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(agents)):
            raise StorageError(
                f"{table.file}: {table.group} holds agent ids up to {ids.max()}, the "
                f"environment has {len(agents)} agents",
                "train on data recorded in this environment",
            )
        counts += np.bincount(ids, minlength=len(agents))
    return [
        Stream(table, k, int(n), whole=int(n) == table.rows, columns=columns)
        for k, n in enumerate(counts)
        if n
    ]


_SAME_ENV_FIX = "train on data recorded in the job's environment, or set env.id to the dataset's"


def _refuse_continuous(source: Source) -> None:
    """A log of continuous actions (a PPO run's on a `Box` env) has no action index for BC's
    or DQN's heads to learn."""
    boxed = continuous_agents(source)
    if boxed:
        raise StorageError(
            f"{source.label} records continuous (Box) actions of agents {boxed}, and offline "
            "training (learner.algo=bc or dqn) learns discrete actions only",
            "give offline.dataset replay files recorded in an env with Discrete actions",
        )


def _check_origin(source: Source, spec: EnvSpec, env_id: str) -> None:
    """A replay log names its environment and agents: they must be the job's."""
    if source.env_id is not None and source.env_id != env_id:
        raise StorageError(
            f"{source.label} was recorded in {source.env_id}, the job runs {env_id}",
            _SAME_ENV_FIX,
        )
    if source.kind != "checkpoint" and list(source.agents) != list(spec.agents):
        raise StorageError(
            f"{source.label} holds agents {source.agents}, the environment has {spec.agents}",
            _SAME_ENV_FIX,
        )


def _check_sizes(
    streams: list[Stream], spec: EnvSpec, env_id: str, recorded_actions: dict[str, int]
) -> None:
    """Observation widths and action counts must fit the networks the job builds."""
    highest_in: dict[int, int] = {}  # a mixed table is one stream per agent: scan it once
    for stream in streams:
        agent, table = spec.agents[stream.agent], stream.table
        obs_shape = table.datasets["observations"].shape[1:]
        if obs_shape != (spec.obs_dims[agent],):
            raise StorageError(
                f"{table.file}: {table.group} holds observations of shape {list(obs_shape)}, "
                f"agent {agent} of {env_id} observes {spec.obs_dims[agent]} values",
                _SAME_ENV_FIX,
            )
        n = spec.n_actions[agent]
        recorded = recorded_actions.get(agent)
        if recorded is None and id(table) not in highest_in:
            highest_in[id(table)] = _highest_action(table)
        highest = highest_in[id(table)] if recorded is None else recorded - 1
        if highest >= n:
            raise StorageError(
                f"{table.file}: {table.group} holds actions up to {highest}, agent {agent} of "
                f"{env_id} has {n}",
                _SAME_ENV_FIX,
            )


def _highest_action(table: Table) -> int:
    """Checkpoint tables do not record their action space: look at the data."""
    highest = -1
    for first in range(0, table.rows, CHUNK_ROWS):
        actions = table.read(("actions",), first, first + CHUNK_ROWS)["actions"]
        highest = max(highest, int(actions.max()) if len(actions) else -1)
    return highest


def plan_offline(cfg: JobConfig, spec: EnvSpec, fresh: bool) -> str | None:
    """Check an offline job on rank 0 (the dataset only when the run starts afresh: a resume
    refills the shards from its checkpoint) and say what it will train on."""
    if not cfg.offline.dataset:
        return None
    if not fresh:
        return f"hpcmarl: offline: {cfg.learner.algo} on {cfg.offline.dataset} (as checkpointed)"
    rows = check_dataset(cfg, spec)
    held = ", ".join(f"{p} {n:,}" for p, n in rows.items())
    return (
        f"hpcmarl: offline: {cfg.learner.algo} on {cfg.offline.dataset}; transitions by policy: "
        f"{held}; split over {cfg.topology.replay_shards} replay shard(s); no env steps but "
        "evaluations"
    )
