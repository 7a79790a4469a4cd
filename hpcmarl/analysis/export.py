"""One agent's transitions from a replay file, as a D4RL file or a Minari dataset folder.

D4RL is flat: every stored row of the agent in file order, `terminals` = terminations and
`timeouts` = truncations, plus `infos/episode_id`, `infos/step` and `infos/policy_version` so
episodes can be found again. Minari is one group `episode_<n>` per complete episode (n counts
from 0, as Minari requires; the hpcmarl episode id is the group's `hpcmarl_episode_id`), with
`observations` holding T + 1 rows (the final next_observation appended). Its metadata is
Minari's `data/metadata.json` beside `data/main_data.hdf5`, mirrored as root attributes for
h5py-only readers. A Minari episode ends at the agent's first done row: rows an environment
pads a finished agent with are not transitions and are left out. Episodes cut by the start or
end of the file are left out too, and counted.

`--team` (Minari only) writes a team's episodes instead: one episode per env episode with every
agent's data, in Minari's Dict layout (`observations/<agent>`, `actions/<agent>`, and Dict
observation and action spaces in the metadata). Its `rewards` are the team reward (the sum over
the agents), `infos/rewards/<agent>` each agent's own, `infos/active/<agent>` which steps an
agent really took: an agent that finished first is padded to the team's length with its final
observation, action 0 (a zero vector for continuous actions) and reward 0. The episode
terminates where its last agent's episode terminated, else it is truncated. A team episode
with any agent's rows missing is left out.

Continuous (Box) actions are exported as the env took them, clipped to the bounds of the
file's action space (a replay log keeps the policy's unclipped samples).

Both outputs are written under a temporary name and renamed when complete; an existing output
is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..storage.hdf5 import StorageError, atomic_path
from .reader import STATS_COLUMNS, TRANSITION_COLUMNS, Source, chunks, open_sources

COLUMNS = (*TRANSITION_COLUMNS, *STATS_COLUMNS)
MINARI_FORMAT_VERSION = "0.5.0"
"""The Minari dataset format the folder follows (`minari_version` in its metadata)."""
Columns = dict[str, np.ndarray]
_D4RL_NAMES = {"terminations": "terminals", "truncations": "timeouts"}
_D4RL_INFOS = ("episode_id", "step", "policy_version")


def export(
    path: str | Path,
    fmt: str,
    agent: str | None,
    out: str | Path | None,
    chunk_rows: int,
    team: bool = False,
) -> dict[str, Any]:
    """Write the export and return what was written (path, rows, episodes, left out)."""
    with ExitStack() as stack:
        source = _one_source(path, stack)
        if team:
            return _export_team(source, Path(path), fmt, agent, out, chunk_rows)
        k = _pick_agent(source, agent)
        target = _new_target(out, Path(path), source.agents[k], fmt)
        rows = _agent_rows(source, k, chunk_rows)
        writer = D4rlWriter(source, k) if fmt == "d4rl" else MinariWriter(source, k)
        result = writer.write(rows, target)
    return {"format": fmt, "agent": source.agents[k], "out": str(target), **result}


def _one_source(path: str | Path, stack: ExitStack) -> Source:
    sources = open_sources([path], stack)
    if len(sources) != 1:
        names = ", ".join(s.label for s in sources)
        raise StorageError(f"{path} holds {len(sources)} replay logs ({names})", "export one")
    return sources[0]


def _pick_agent(source: Source, agent: str | None) -> int:
    if agent is not None:
        return source.agent_index(agent)
    if len(source.agents) != 1:
        raise StorageError(
            f"{source.label} holds {len(source.agents)} agents: {', '.join(source.agents)}",
            "choose one with --agent ID",
        )
    return 0


def _new_target(out: str | Path | None, path: Path, agent: str, fmt: str) -> Path:
    """`--out`, or the default beside the file; never one that exists."""
    target = Path(out) if out else _default_out(path, agent, fmt)
    if target.exists():
        raise StorageError(f"{target} exists", "delete it or choose another path with --out")
    return target


def _runs(key: np.ndarray) -> Iterator[tuple[int, int]]:
    """(start, stop) of each run of equal consecutive values of `key`."""
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return zip(starts.tolist(), [*starts[1:].tolist(), len(key)], strict=True)


def _box(dim: int, dtype: np.dtype | None = None) -> dict[str, Any]:
    """Minari's serialised Box of `dim` values: unbounded float32, or uint8 from 0 to 255
    where the rows are stored as uint8 (image observations)."""
    if dtype == np.uint8:
        return {
            "type": "Box",
            "dtype": "uint8",
            "shape": [dim],
            "low": [0] * dim,
            "high": [255] * dim,
        }
    inf = [float("inf")] * dim
    return {
        "type": "Box",
        "dtype": "float32",
        "shape": [dim],
        "low": [-x for x in inf],
        "high": inf,
    }


def _action_space(source: Source, agent: str, max_action: int) -> dict[str, Any]:
    """Minari's serialised space of the agent's actions: the file's own (a Discrete count, or
    the Box of continuous actions), else a Discrete of as many actions as were seen."""
    space = source.action_spaces.get(agent)
    if space and space.get("type") == "Box":
        return dict(space)
    n = int(space["n"]) if space else max_action + 1
    return {"type": "Discrete", "dtype": "int64", "start": 0, "n": n}


def _highest(so_far: int, actions: np.ndarray) -> int:
    """The highest discrete action seen (continuous action vectors leave it as it was)."""
    if actions.dtype.kind not in "iu" or not len(actions):
        return so_far
    return max(so_far, int(actions.max()))


def _default_out(path: Path, agent: str, fmt: str) -> Path:
    stem = path.stem if path.is_file() else path.name
    suffix = ".hdf5" if fmt == "d4rl" else ""
    return path.parent / f"{stem}-{agent.lstrip('#')}-{fmt}{suffix}"


def _agent_rows(source: Source, k: int, chunk_rows: int) -> Iterator[Columns]:
    """The agent's rows in file order, as column chunks (a log keeps them in their own group)."""
    policy = source.policy_of[source.agents[k]]
    tables = [t for t in source.tables if t.policy == policy]
    if source.kind == "replay_log":
        tables = [t for t in tables if t.group.endswith(f"/{source.agents[k]}")]
    for table in tables:
        table.require(COLUMNS)
    own = Source(source.label, source.kind, source.files, tables, source.agents, {})
    for _, _, cols in chunks(own, COLUMNS, chunk_rows):
        mine = cols["agent_id"] == k
        yield _executed(source, cols if mine.all() else {n: c[mine] for n, c in cols.items()})


def _executed(source: Source, cols: Columns) -> Columns:
    """The rows with continuous actions as the env took them, clipped to each agent's Box (a
    log keeps the policy's unclipped samples); discrete actions as they are."""
    actions = cols["actions"]
    if actions.dtype.kind != "f" or not len(actions):
        return cols
    clipped = actions.copy()
    for k in np.unique(cols["agent_id"]).tolist():
        space, rows = source.action_spaces[source.agents[k]], cols["agent_id"] == k
        clipped[rows] = np.clip(actions[rows], space["low"], space["high"])
    return {**cols, "actions": clipped}


class D4rlWriter:
    """Flat arrays, appended chunk by chunk."""

    def __init__(self, source: Source, k: int) -> None:
        self.source, self.k = source, k

    def write(self, rows: Iterable[Columns], target: Path) -> dict[str, Any]:
        total = 0
        with atomic_path(target) as tmp, h5py.File(tmp, "w-") as f:
            _describe(f, self.source, self.k, "d4rl")
            for cols in rows:
                for name, data in cols.items():
                    if name != "agent_id":
                        _extend(f, _d4rl_name(name), data)
                total += len(cols["rewards"])
        return {"rows": total}


def _d4rl_name(column: str) -> str:
    return f"infos/{column}" if column in _D4RL_INFOS else _D4RL_NAMES.get(column, column)


def _extend(f: h5py.File, name: str, data: np.ndarray) -> None:
    if name not in f:
        shape = (0, *data.shape[1:])
        rows = max(1, 65536 // max(1, data[:1].nbytes))
        f.create_dataset(
            name,
            shape=shape,
            maxshape=(None, *data.shape[1:]),
            dtype=data.dtype,
            chunks=(rows, *data.shape[1:]),
            compression="gzip",
            shuffle=True,
        )
    ds = f[name]
    old = ds.shape[0]
    ds.resize(old + len(data), axis=0)
    ds[old:] = data


def _describe(f: h5py.File, source: Source, k: int, fmt: str) -> None:
    f.attrs["hpcmarl_export"] = fmt
    f.attrs["source"] = source.label
    f.attrs["agent"] = source.agents[k]
    f.attrs["env_id"] = source.env_id or ""


class MinariWriter:
    """Episodes gathered row by row; only the unfinished ones are held in memory."""

    def __init__(self, source: Source, k: int) -> None:
        self.source, self.k = source, k
        self.open: dict[int, _Held] = {}
        self.finished: dict[int, None] = {}  # ids written, in order: later rows are padding
        self.count = self.steps = self.cut = 0
        self.max_action = -1
        self.obs_dim = 0
        self.obs_dtype: np.dtype | None = None

    def write(self, rows: Iterable[Columns], target: Path) -> dict[str, Any]:
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
        data = tmp / "data"
        data.mkdir(parents=True)
        try:
            with h5py.File(data / "main_data.hdf5", "w-", track_order=True) as f:
                for cols in rows:
                    self._add(f, cols)
                self.cut += self.unfinished()
                metadata = self._metadata()
                f.attrs.update({k: v for k, v in metadata.items() if not isinstance(v, dict)})
            (data / "metadata.json").write_text(json.dumps(metadata))
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {"episodes": self.count, "steps": self.steps, "episodes_left_out": self.cut}

    def unfinished(self) -> int:
        """Episodes still open at the end of the file: cut by it, left out."""
        return len(self.open)

    def _add(self, f: h5py.File, cols: dict[str, np.ndarray]) -> None:
        if not len(cols["rewards"]):
            return
        self.obs_dim = cols["observations"].shape[1]
        self.obs_dtype = cols["observations"].dtype
        self.max_action = _highest(self.max_action, cols["actions"])
        episode = cols["episode_id"]
        for a, b in _runs(episode):
            self._add_run(f, int(episode[a]), {n: c[a:b] for n, c in cols.items()})

    def _add_run(self, f: h5py.File, episode: int, run: dict[str, np.ndarray]) -> None:
        """Hold a run of the episode's rows; write the episode once its rows up to the agent's
        first done are all held (runs may come in any order: shards interleave fragments)."""
        if episode in self.finished:
            return  # padding after the agent's episode ended
        held = self.open.setdefault(episode, _Held())
        held.add(run)
        cols = held.complete()
        if cols is not None:
            del self.open[episode]
            self._write_episode(f, episode, cols)
            self._close(episode)

    def _close(self, episode: int) -> None:
        self.finished[episode] = None
        if len(self.finished) > 1 << 16:  # padding follows its episode closely; forget old ids
            for old in list(self.finished)[: 1 << 15]:
                del self.finished[old]

    def _write_episode(self, f: h5py.File, episode: int, cols: dict[str, np.ndarray]) -> None:
        group = f.create_group(f"episode_{self.count}")
        group.attrs["id"] = self.count
        group.attrs["total_steps"] = len(cols["rewards"])
        group.attrs["hpcmarl_episode_id"] = episode
        obs = np.concatenate([cols["observations"], cols["next_observations"][-1:]])
        group.create_dataset("observations", data=obs)
        for name in ("actions", "rewards", "terminations", "truncations"):
            group.create_dataset(name, data=cols[name])
        infos = group.create_group("infos")
        for name in ("step", "policy_version"):
            infos.create_dataset(name, data=cols[name])
        self.count += 1
        self.steps += len(cols["rewards"])

    def _metadata(self) -> dict[str, Any]:
        agent = self.source.agents[self.k]
        return {
            "dataset_id": _dataset_id(self.source.env_id or "replay", agent),
            "total_episodes": self.count,
            "total_steps": self.steps,
            "data_format": "hdf5",
            "observation_space": json.dumps(_box(self.obs_dim, self.obs_dtype)),
            "action_space": json.dumps(_action_space(self.source, agent, self.max_action)),
            "minari_version": MINARI_FORMAT_VERSION,
            "algorithm_name": "hpcmarl",
            "hpcmarl": {"source": self.source.label, "agent": agent},
        }


class _Held:
    """The rows of one unfinished episode of the agent, and the step of its first done."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []
        self.done: int | None = None

    def add(self, run: dict[str, np.ndarray]) -> None:
        self.parts.append(run)
        ended = run["step"][run["terminations"] | run["truncations"]]
        if len(ended):
            first = int(ended.min())
            self.done = first if self.done is None else min(self.done, first)

    def complete(self) -> dict[str, np.ndarray] | None:
        """Rows of steps 0..done in step order, once every one of them is held."""
        if self.done is None:
            return None
        cols = {n: np.concatenate([p[n] for p in self.parts]) for n in self.parts[0]}
        keep = np.flatnonzero(cols["step"] <= self.done)
        if len(keep) != self.done + 1:
            return None
        keep = keep[np.argsort(cols["step"][keep], kind="stable")]
        if not np.array_equal(cols["step"][keep], np.arange(self.done + 1)):
            return None
        return {n: c[keep] for n, c in cols.items()}


def _dataset_id(env_id: str, agent: str) -> str:
    """`hpcmarl/<env>-<agent>-v0`, in the characters Minari accepts in an id."""
    name = re.sub(r"[^\w.-]+", "_", f"{env_id}-{agent.lstrip('#')}")
    return f"hpcmarl/{name}-v0"


# -- a team's episodes ---------------------------------------------------------------------------
def _export_team(
    source: Source, path: Path, fmt: str, agent: str | None, out: str | Path | None, chunk: int
) -> dict[str, Any]:
    if fmt != "minari" or agent is not None:
        raise StorageError(
            "--team writes every agent's data into one Minari episode per env episode",
            "use --format minari --team without --agent (D4RL is one agent's flat rows)",
        )
    target = _new_target(out, path, "team", fmt)
    for table in source.tables:
        table.require(COLUMNS)
    rows = (_executed(source, cols) for _, _, cols in chunks(source, COLUMNS, chunk))
    result = TeamMinariWriter(source).write(rows, target)
    return {"format": fmt, "agent": "team", "out": str(target), **result}


class TeamMinariWriter(MinariWriter):
    """Each agent's episode gathered as `MinariWriter` gathers one agent's; a team episode is
    written once every agent's is complete."""

    def __init__(self, source: Source) -> None:
        super().__init__(source, 0)
        self.agents = list(source.agents)
        self.team_open: dict[int, dict[int, _Held]] = {}
        self.done_agents: dict[int, dict[int, dict[str, np.ndarray]]] = {}
        self.max_actions = [-1] * len(self.agents)
        self.obs_dims = [0] * len(self.agents)
        self.obs_dtypes: dict[int, np.dtype] = {}

    def _add(self, f: h5py.File, cols: dict[str, np.ndarray]) -> None:
        if not len(cols["rewards"]):
            return
        key = cols["agent_id"].astype(np.int64) * (1 << 40) + cols["episode_id"]
        for a, b in _runs(key):
            run = {n: c[a:b] for n, c in cols.items()}
            self._add_agent_run(f, int(run["agent_id"][0]), int(run["episode_id"][0]), run)

    def unfinished(self) -> int:
        return len(self.team_open)

    def _add_agent_run(self, f: h5py.File, k: int, episode: int, run: Columns) -> None:
        if episode in self.finished or k in self.done_agents.get(episode, {}):
            return  # padding after the agent's (or the team's) episode ended
        self.obs_dims[k] = run["observations"].shape[1]
        self.obs_dtypes[k] = run["observations"].dtype
        self.max_actions[k] = _highest(self.max_actions[k], run["actions"])
        held = self.team_open.setdefault(episode, {}).setdefault(k, _Held())
        held.add(run)
        cols = held.complete()
        if cols is None:
            return
        del self.team_open[episode][k]
        done = self.done_agents.setdefault(episode, {})
        done[k] = cols
        if len(done) == len(self.agents):
            del self.team_open[episode], self.done_agents[episode]
            self._write_team_episode(f, episode, done)
            self._close(episode)

    def _write_team_episode(
        self, f: h5py.File, episode: int, by_agent: dict[int, dict[str, np.ndarray]]
    ) -> None:
        steps = max(len(cols["rewards"]) for cols in by_agent.values())
        group = f.create_group(f"episode_{self.count}")
        group.attrs["id"] = self.count
        group.attrs["total_steps"] = steps
        group.attrs["hpcmarl_episode_id"] = episode
        obs, actions = group.create_group("observations"), group.create_group("actions")
        infos = group.create_group("infos")
        rewards, active = infos.create_group("rewards"), infos.create_group("active")
        team_reward = np.zeros(steps, np.float64)
        last_terminated = []
        for k, name in enumerate(self.agents):
            cols = by_agent[k]
            t = len(cols["rewards"])
            pad = steps - t
            seen = np.concatenate([cols["observations"], cols["next_observations"][-1:]])
            obs[name] = np.concatenate([seen, np.repeat(seen[-1:], pad, axis=0)])
            done = cols["actions"]
            actions[name] = np.concatenate([done, np.zeros((pad, *done.shape[1:]), done.dtype)])
            own = np.concatenate([cols["rewards"], np.zeros(pad, cols["rewards"].dtype)])
            rewards[name] = own
            active[name] = np.arange(steps) < t
            team_reward += own
            if t == steps:
                last_terminated.append(bool(cols["terminations"][-1]))
        terminated = np.zeros(steps, bool)
        terminated[-1] = all(last_terminated)
        group["rewards"] = team_reward.astype(np.float32)
        group["terminations"] = terminated
        truncated = np.zeros(steps, bool)
        truncated[-1] = not terminated[-1]
        group["truncations"] = truncated
        self.count += 1
        self.steps += steps

    def _metadata(self) -> dict[str, Any]:
        obs = {
            name: _box(self.obs_dims[k], self.obs_dtypes.get(k))
            for k, name in enumerate(self.agents)
        }
        act = {
            name: _action_space(self.source, name, self.max_actions[k])
            for k, name in enumerate(self.agents)
        }
        return {
            "dataset_id": _dataset_id(self.source.env_id or "replay", "team"),
            "total_episodes": self.count,
            "total_steps": self.steps,
            "data_format": "hdf5",
            "observation_space": json.dumps({"type": "Dict", "subspaces": obs}),
            "action_space": json.dumps({"type": "Dict", "subspaces": act}),
            "minari_version": MINARI_FORMAT_VERSION,
            "algorithm_name": "hpcmarl",
            "hpcmarl": {"source": self.source.label, "agents": self.agents},
        }
