"""Compact joint items: MALib's producer options for a team's episodes and R2D2's sequences,
stored in a lighter form and rebuilt exactly when sampled (DESIGN.md §7).

An episode or sequence item holds its steps in order, `[T, agents, ...]`, so each item
carries everything needed to rebuild itself; unlike compact transition rows
(`replay.compact`), nothing links one item to another, and items can be dealt to any shard.
- frame stacks (`replay.stack_num` k): an observation is a stack of k frames, newest last
  (flattened, so the newest frame is its last `width / k` values). Each step stores its newest
  frame; the item stores the k - 1 older frames of its first step's stack
  (`observations_head`), which hold the frames from before a sequence's start or the padding
  of an episode's first stack. Step t's stack is then frames t - k + 1 .. t.
- `ignore_obs_next`: `next_observations` (and a mixer's `next_state`) are not stored: within
  an item, step t's next observation is step t + 1's observation. Each agent's last real step
  keeps its own (`final_next_observations`; the item's last for `final_next_state`): an
  episode's final observation, or the step after a sequence's end.
- `save_only_last_obs`: the env stacks its own frames, stored as the first option stores them.

Padding holds zeros, as writers leave it: the steps after an item's last real one (`filled`),
and an agent's steps after it finished (`active`). An insert checks that the items obey these
relations and refuses them with the cause otherwise (an env that stacks on another axis, a
player that acts again after a turn it sat out), so a sample never returns data other than
what was sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcmarl.items.spec import Column, ItemSpec
from hpcmarl.replay.compact import StorageForm
from hpcmarl.replay.table import ReplayTable, SampleInfo

FORM_KEY = "item_form"
"""The table-state entry naming the form a compact item table stores: [stack_num, ignore]."""
HEAD = "observations_head"
FINAL_OBS = "final_next_observations"
FINAL_STATE = "final_next_state"
COMPACT_KINDS = ("episode", "sequence")
"""Item kinds stored compactly: replayed many times, with their steps in order."""


def stored_columns(item: ItemSpec, form: StorageForm) -> tuple[Column, ...]:
    """The columns a table of `item`s stores in `form`, each with the shape of one item's
    value (`[T, agents, ...]` for steps, `[agents, ...]` for the item-wide ones)."""
    k = form.stack_num
    out: list[Column] = []
    for column in item.columns:
        shape = item.item_shape(column)
        width = shape[-1] if shape else 1
        frame = width // k
        if column.name == "observations":
            out.append(Column(column.name, column.dtype, (*shape[:-1], frame)))
            if k > 1:
                out.append(Column(HEAD, column.dtype, (*shape[1:-1], width - frame)))
        elif column.name == "next_observations":
            if form.ignore_obs_next:
                out.append(Column(FINAL_OBS, column.dtype, (*shape[1:-1], frame)))
            else:
                out.append(Column(column.name, column.dtype, (*shape[:-1], frame)))
        elif column.name == "next_state" and form.ignore_obs_next:
            out.append(Column(FINAL_STATE, column.dtype, shape[1:]))
        else:
            out.append(Column(column.name, column.dtype, shape))
    return tuple(out)


def stored_item_bytes(item: ItemSpec, form: StorageForm) -> int:
    """Bytes one item takes in a table of `form`."""
    return sum(
        int(np.prod(c.shape, dtype=np.int64)) * np.dtype(c.dtype).itemsize
        for c in stored_columns(item, form)
    )


def encode_items(batch: dict[str, np.ndarray], form: StorageForm) -> dict[str, np.ndarray]:
    """The stored columns of a batch of items `[B, T, ...]`; a `ValueError` naming the cause
    when the items are not what `form` can rebuild."""
    k = form.stack_num
    steps = Steps.of(batch)
    obs = batch["observations"]
    frame = obs.shape[-1] // k
    out = dict(batch)
    for name in ("observations", "next_observations"):
        if name in batch:
            _check(batch[name] == 0, ~steps.real, f"{name} are not zeros", padding=True)
    for name in ("state", "next_state"):
        if name in batch:
            _check(batch[name] == 0, ~steps.filled, f"{name} is not zeros", padding=True)
    if k > 1:
        # step t's stack is step t - 1's without its oldest frame, plus one new frame
        shifted = obs[:, 1:, ..., :-frame] == obs[:, :-1, ..., frame:]
        _check(shifted, steps.real[:, 1:], f"observations are not stacks of {k} frames in turn")
        out["observations"] = np.ascontiguousarray(obs[..., -frame:])
        out[HEAD] = np.ascontiguousarray(obs[:, 0, ..., :-frame])
    if "next_observations" in batch:
        nxt = batch["next_observations"]
        if form.ignore_obs_next:
            same = nxt[:, :-1] == obs[:, 1:]
            _check(same, steps.real[:, 1:], "a next observation is not the next observation")
            final = nxt[steps.rows, steps.last, steps.agents]  # [B, agents, width]
            out[FINAL_OBS] = np.ascontiguousarray(final[..., -frame:] if k > 1 else final)
            del out["next_observations"]
        elif k > 1:
            same = nxt[..., :-frame] == obs[..., frame:]
            _check(same, steps.real, f"next observations are not stacks of {k} frames in turn")
            out["next_observations"] = np.ascontiguousarray(nxt[..., -frame:])
    if form.ignore_obs_next and "next_state" in batch:
        state, nxt = batch["state"], batch["next_state"]
        _check(nxt[:, :-1] == state[:, 1:], steps.filled[:, 1:], "a next state is not the next")
        out[FINAL_STATE] = np.ascontiguousarray(nxt[steps.rows[:, 0], steps.last_filled])
        del out["next_state"]
    return out


def decode_items(stored: dict[str, np.ndarray], form: StorageForm) -> dict[str, np.ndarray]:
    """The full columns of items from their stored ones: the inverse of `encode_items`. Each
    rebuilt column is written once, then its padding zeroed."""
    k = form.stack_num
    out = dict(stored)
    steps = Steps.of(stored)
    frames = stored["observations"]
    obs = frames
    if k > 1:
        head = out.pop(HEAD)
        frame, length = frames.shape[-1], frames.shape[1]
        older = np.moveaxis(head.reshape(*head.shape[:-1], k - 1, frame), -2, 1)
        timeline = np.concatenate([older, frames], axis=1)  # [B, k - 1 + T, agents, frame]
        obs = np.empty((*frames.shape[:-1], k * frame), frames.dtype)
        for j in range(k):  # frame j of step t's stack is frame t + j of the timeline
            obs[..., j * frame : (j + 1) * frame] = timeline[:, j : j + length]
        obs[~steps.real] = 0
        out["observations"] = obs
    if form.ignore_obs_next:
        final = out.pop(FINAL_OBS)
        if k > 1:
            before = obs[steps.rows, steps.last, steps.agents]
            final = np.concatenate([before[..., final.shape[-1] :], final], axis=-1)
        last_step = (steps.rows, steps.last, steps.agents)
        out["next_observations"] = _following(obs, last_step, final, ~steps.real)
    elif k > 1:
        newest = stored["next_observations"]
        nxt = np.empty_like(obs)
        nxt[..., : -newest.shape[-1]] = obs[..., newest.shape[-1] :]
        nxt[..., -newest.shape[-1] :] = newest
        nxt[~steps.real] = 0
        out["next_observations"] = nxt
    if FINAL_STATE in out:
        last_filled = (steps.rows[:, 0], steps.last_filled)
        final_state = out.pop(FINAL_STATE)
        out["next_state"] = _following(stored["state"], last_filled, final_state, ~steps.filled)
    return out


def _following(
    values: np.ndarray, at_last: tuple[np.ndarray, ...], final: np.ndarray, padding: np.ndarray
) -> np.ndarray:
    """Each step's next value within its item [B, T, ...]: the next step's, `final` at the
    last real step (`at_last` indexes it), zeros at `padding`."""
    out = np.empty_like(values)
    out[:, :-1] = values[:, 1:]
    out[at_last] = final
    out[padding] = 0
    return out


@dataclass(frozen=True)
class Steps:
    """Which steps of a batch of items are real: the item's (`filled`, a prefix of its time
    axis) and each agent's (also `active`: an agent that finished before the others has
    padding after its last step, as a parallel env's writer leaves it)."""

    filled: np.ndarray
    """bool [B, T]."""
    real: np.ndarray
    """bool [B, T, agents]: filled and the agent active."""
    last_filled: np.ndarray
    """int [B]: each item's last real step (items hold at least one)."""
    last: np.ndarray
    """int [B, agents]: each agent's last real step in each item (0 for one with none)."""
    rows: np.ndarray
    agents: np.ndarray
    """Index arrays [B, 1] and [1, agents] that pick (item, agent) pairs with `last`."""

    @classmethod
    def of(cls, batch: dict[str, np.ndarray]) -> Steps:
        filled = np.asarray(batch["filled"], bool)
        agents = batch["observations"].shape[2]
        real = np.repeat(filled[:, :, None], agents, axis=2)
        if "active" in batch:
            real &= np.asarray(batch["active"], bool)
        if np.any(real[:, 1:] & ~real[:, :-1]):
            raise ValueError(
                "replay.stack_num / replay.ignore_obs_next cannot store these items: an agent "
                "acts again after a step it did not act in (a turn-based env?); set "
                "replay.stack_num=1 and replay.ignore_obs_next=false"
            )
        return cls(
            filled=filled,
            real=real,
            last_filled=np.maximum(filled.sum(axis=1) - 1, 0),
            last=np.maximum(real.sum(axis=1) - 1, 0),
            rows=np.arange(len(filled))[:, None],
            agents=np.arange(agents)[None, :],
        )


def form_of(state: Mapping[str, Any]) -> StorageForm | None:
    """The form a saved table state (or its HDF5 group) stores its items in, or None for
    full items."""
    return StorageForm.of_words(state[FORM_KEY]) if FORM_KEY in state else None


class CompactItemTable(ReplayTable):
    """A `ReplayTable` of episodes or sequences stored in a `StorageForm`: `insert` takes and
    `sample` returns full items, as if the table stored them whole."""

    def __init__(self, capacity: int, form: StorageForm, **table: Any) -> None:
        super().__init__(capacity, **table)
        self.form = form

    def insert(self, batch: dict[str, np.ndarray]) -> None:
        super().insert(encode_items(batch, self.form))

    def sample(self, n: int) -> tuple[dict[str, np.ndarray], SampleInfo]:
        stored, info = super().sample(n)
        return decode_items(stored, self.form), info

    def state(self, views: bool = False) -> dict[str, Any]:
        state = super().state(views=views)
        state[FORM_KEY] = self.form.words()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        saved = form_of(state) or StorageForm()
        if saved != self.form:
            raise ValueError(
                f"the checkpoint's table stores {saved.describe() or 'full items'}; this job "
                f"asks for {self.form.describe() or 'full items'}"
            )
        super().load_state({k: v for k, v in state.items() if k != FORM_KEY})


def _check(equal: np.ndarray, where: np.ndarray, what: str, padding: bool = False) -> None:
    """Refuse items where `equal` (per step and agent, then values) fails at a step `where`."""
    held = equal.reshape(*where.shape, -1).all(axis=-1)
    if not np.any(where & ~held):
        return
    if padding:
        raise ValueError(
            f"replay.stack_num / replay.ignore_obs_next rebuild padding as zeros, and after an "
            f"item's or an agent's last step these items' {what}; set replay.stack_num=1 and "
            "replay.ignore_obs_next=false"
        )
    raise ValueError(
        f"replay.stack_num / replay.ignore_obs_next cannot store these items: {what} (an env "
        "that stacks its own frames must stack them on the first axis, newest last); set "
        "replay.stack_num=1 and replay.ignore_obs_next=false"
    )
