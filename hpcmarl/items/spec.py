"""Item specs: the kind of item an algorithm trains on, its columns, and the replay it needs.

Kinds (DESIGN.md §7):
- `transition`: one step of one agent. Rows of several agents of a group are separate items
  (`agent_id` names the agent), which is what independent learners (DQN, BC) want.
- `fragment`: on-policy data, `length` consecutive steps of one environment copy with every
  agent of the group side by side, `[T, agents, ...]`, so a centralised critic sees them together.
- `episode` (VDN, QMIX): one episode of one env copy, `[T_max, agents, ...]`, padded after its
  last step (`filled` marks the real ones); `sequence` (R2D2): `length` consecutive steps of
  one episode, consecutive sequences sharing `overlap` steps, never crossing an episode's end.
  Both have the layout of `fragment` (a leading time axis, then agents).

A column is per agent (it gets the agents axis of joint items) or per group (global `state`,
`policy_version`). The replay spec says how a shard stores and serves the items: sampled with
replacement, uniformly or by priority, under a samples-per-insert limiter (off-policy), or a
FIFO queue whose items older than `max_policy_lag` versions are dropped and counted (on-policy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ITEM_KINDS = ("transition", "fragment", "sequence", "episode")
"""What one item holds; see the module docstring."""
SELECTORS = ("uniform", "prioritized", "fifo")
"""How a shard picks items to serve: with replacement (uniform, prioritized) or each once."""
PER = ("agent", "group")
OBS_DTYPES = {"uint8": "|u1"}
"""Observation spaces whose values items keep in their own dtype (a uint8 Box: images at a
quarter of float32's bytes in items, tables, checkpoints, replay files and messages); every
other space is stored as float32 rows. Networks cast on their device (`algos.base.on_device`)."""


def obs_dtype(spaces: Any) -> str:
    """The dtype of the `observations` columns for agents with these observation spaces (as
    JSON, `algos.torsos.space_json`): `|u1` where every one is a uint8 Box, else `<f4` (also for
    none known)."""
    kinds = {OBS_DTYPES.get(str(space.get("dtype")), "<f4") if space else "<f4" for space in spaces}
    return kinds.pop() if len(kinds) == 1 else "<f4"


@dataclass(frozen=True)
class Column:
    """One column of an item: its name, dtype, the shape of one value, and whose value it is."""

    name: str
    dtype: str
    """A numpy dtype string, e.g. `<f4`."""
    shape: tuple[int, ...] = ()
    """The shape of one agent's (or the group's) value at one step."""
    per: str = "agent"
    """`agent`: one value per agent (joint items get an agents axis); `group`: one per step."""

    def __post_init__(self) -> None:
        if self.per not in PER:
            raise ValueError(f"column {self.name!r}: per must be one of {PER}, not {self.per!r}")


@dataclass(frozen=True)
class ReplaySpec:
    """How a replay shard stores and serves an algorithm's items."""

    selector: str = "uniform"
    """`uniform` or `prioritized` (sampled with replacement, samples-per-insert limiter) or
    `fifo` (each item served once, oldest policy version first)."""
    max_policy_lag: int = 0
    """`fifo` only: items more than this many versions older than the learner's are dropped
    (and counted) instead of trained on."""

    def __post_init__(self) -> None:
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {SELECTORS}, not {self.selector!r}")

    @property
    def on_policy(self) -> bool:
        return self.selector == "fifo"


@dataclass(frozen=True)
class ItemSpec:
    """The item kind, its columns and the replay it needs: all a role knows of an algorithm's
    data. Shapes here are per item; a batch adds a leading axis of items."""

    kind: str
    columns: tuple[Column, ...]
    agents: int = 1
    """Agents of the group side by side in a joint item (fragments); 1 for transitions."""
    length: int = 1
    """Steps per item: the fragment length T; 1 for transitions."""
    replay: ReplaySpec = field(default_factory=ReplaySpec)
    n_step: int = 1
    """Transitions: steps each one spans (n-step returns). With n > 1 a transition's reward is
    sum_k gamma^k r_{t+k} up to n steps or the episode's end, `next_observations` is where
    that ends, and its `discounts` column holds the bootstrap's gamma^m."""
    gamma: float = 1.0
    """The discount of n-step returns (used when n_step > 1)."""
    overlap: int = 0
    """Sequences: steps an item shares with the next item of the same episode (its first
    `overlap` steps are the previous item's last ones); 0 for episodes."""

    def __post_init__(self) -> None:
        if self.kind not in ITEM_KINDS:
            raise ValueError(f"item kind must be one of {ITEM_KINDS}, not {self.kind!r}")
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"item columns repeat a name: {names}")
        if self.n_step > 1 and (self.kind != "transition" or "discounts" not in names):
            raise ValueError("n-step items are transitions with a `discounts` column")

    @property
    def joint(self) -> bool:
        """Whether an item holds every agent of the group (a time axis and an agents axis)."""
        return self.kind != "transition"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"the {self.kind} item has no column {name!r}; it has {list(self.names)}")

    def item_shape(self, column: Column) -> tuple[int, ...]:
        """One item's shape of `column`: `[T, agents, *shape]` for joint items (no agents axis
        for group columns), `shape` for transitions."""
        if not self.joint:
            return column.shape
        agents = (self.agents,) if column.per == "agent" else ()
        return (self.length, *agents, *column.shape)

    def batch_specs(self, items: int) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of a batch of `items` items, for `comm.packing.allocate_packed`."""
        return [(c.name, c.dtype, (items, *self.item_shape(c))) for c in self.columns]

    def check(self, batch: dict[str, np.ndarray]) -> int:
        """The number of items in `batch`; a `ValueError` naming the first column that does not
        fit this spec."""
        missing = [n for n in self.names if n not in batch]
        if missing:
            raise ValueError(f"{self.kind} batch lacks columns {missing}")
        items = len(batch[self.columns[0].name])
        for column in self.columns:
            array = batch[column.name]
            want = (items, *self.item_shape(column))
            if array.shape != want or array.dtype != np.dtype(column.dtype):
                raise ValueError(
                    f"column {column.name!r} is {array.dtype}{list(array.shape)}, the {self.kind} "
                    f"item spec wants {np.dtype(column.dtype)}{list(want)}"
                )
        return items

    def to_json(self) -> str:
        """The spec as JSON, for checkpoint attributes and messages (no pickles)."""
        plain: dict[str, Any] = {
            "kind": self.kind,
            "agents": self.agents,
            "length": self.length,
            "replay": vars(self.replay),
            "n_step": self.n_step,
            "gamma": self.gamma,
            "overlap": self.overlap,
            "columns": [[c.name, c.dtype, list(c.shape), c.per] for c in self.columns],
        }
        return json.dumps(plain)

    @classmethod
    def from_json(cls, text: str) -> ItemSpec:
        plain = json.loads(text)
        columns = tuple(Column(n, d, tuple(s), p) for n, d, s, p in plain["columns"])
        return cls(
            plain["kind"],
            columns,
            plain["agents"],
            plain["length"],
            ReplaySpec(**plain["replay"]),
            int(plain.get("n_step", 1)),
            float(plain.get("gamma", 1.0)),
            int(plain.get("overlap", 0)),
        )

    def one_step(self) -> ItemSpec:
        """The one-step transitions n-step ones are made of (what a collector records)."""
        columns = tuple(c for c in self.columns if c.name != "discounts")
        return ItemSpec(self.kind, columns, self.agents, self.length, self.replay)


def fragment_columns(obs_dim: int, obs: str = "<f4", action_dim: int | None = None) -> list[Column]:
    """What every on-policy fragment holds, whatever trains on it (PPO, a user's algorithm):
    each agent's observation, its action and the log-probability the actor sampled it with,
    what followed, and where in its episode the group was. An algorithm adds its own (a
    critic's inputs, legal-action masks). `obs` is the observations' dtype
    (`GroupSpec.obs_dtype`); `action_dim`, for continuous actions, the width of the float32
    action vectors (None: one int64 action index)."""
    action = (
        Column("actions", "<i8") if action_dim is None else Column("actions", "<f4", (action_dim,))
    )
    return [
        Column("observations", obs, (obs_dim,)),
        action,
        Column("log_probs", "<f4"),
        Column("rewards", "<f4"),
        Column("terminations", "|b1"),
        Column("truncations", "|b1"),
        Column("active", "|b1"),
        Column("episode_id", "<i8", per="group"),
        Column("step", "<i4", per="group"),
        Column("policy_version", "<i8", per="group"),
    ]
