"""Compact episodes and sequences (`replay.compact_items`): items stored with single frames and
no next observations or next states come back from a table exactly as they were sent, in
every form, after a checkpoint round trip and dealt over another number of shards; items the
form cannot rebuild are refused, never stored wrong."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec
from hpcmarl.launch.memory import row_bytes, storage_line
from hpcmarl.replay.compact import StorageForm
from hpcmarl.replay.compact_items import (
    FINAL_OBS,
    FINAL_STATE,
    HEAD,
    CompactItemTable,
    decode_items,
    encode_items,
    stored_item_bytes,
)
from hpcmarl.replay.redistribute import deal_tables

T, AGENTS, FRAME, K, STATE = 7, 2, 3, 4, 5

FORMS = [
    StorageForm(stack_num=1, ignore_obs_next=True),
    StorageForm(stack_num=K, ignore_obs_next=False),
    StorageForm(stack_num=K, ignore_obs_next=True),
]


def item_spec(kind: str = "episode") -> ItemSpec:
    width = K * FRAME
    columns = (
        Column("observations", "<f4", (width,)),
        Column("actions", "<i8"),
        Column("rewards", "<f4"),
        Column("next_observations", "<f4", (width,)),
        Column("active", "|b1"),
        Column("filled", "|b1", per="group"),
        Column("episode_id", "<i8", per="group"),
        Column("state", "<f4", (STATE,), per="group"),
        Column("next_state", "<f4", (STATE,), per="group"),
    )
    return ItemSpec(kind, columns, AGENTS, T, ReplaySpec("uniform"))


def items(n: int, seed: int = 0, first_id: int = 0) -> dict[str, np.ndarray]:
    """`n` items as a writer sends them: each agent's observation the stack of its last K
    frames (the first stack's older frames whatever the env padded with), s' the next step's,
    each item a random number of real steps (a sequence's are all real), zeros after them."""
    rng = np.random.default_rng(seed)
    frames = rng.standard_normal((n, T + K, AGENTS, FRAME)).astype(np.float32)
    states = rng.standard_normal((n, T + 1, STATE)).astype(np.float32)
    steps = np.arange(T)
    stacks = np.stack([frames[:, t : t + K] for t in range(T + 1)], axis=1)  # [n, T+1, K, ...]
    stacks = np.moveaxis(stacks, 2, 3).reshape(n, T + 1, AGENTS, K * FRAME)
    lengths = rng.integers(1, T + 1, size=n)
    lengths[0] = T
    filled = steps[None, :] < lengths[:, None]
    # the second agent finishes first in some items: padding after its last step, where its
    # next observation is its final one
    ends = np.stack([lengths, np.minimum(lengths, rng.integers(1, T + 1, size=n))], axis=1)
    active = steps[None, :, None] < ends[:, None, :]
    real = active[..., None]
    return {
        "active": active,
        "observations": np.where(real, stacks[:, :T], 0).astype(np.float32),
        "actions": np.where(filled[..., None], rng.integers(0, 5, (n, T, AGENTS)), 0),
        "rewards": np.where(filled[..., None], rng.standard_normal((n, T, AGENTS)), 0).astype(
            np.float32
        ),
        "next_observations": np.where(real, stacks[:, 1:], 0).astype(np.float32),
        "filled": filled,
        "episode_id": np.repeat(first_id + np.arange(n)[:, None], T, axis=1).astype(np.int64),
        "state": np.where(filled[..., None], states[:, :T], 0).astype(np.float32),
        "next_state": np.where(filled[..., None], states[:, 1:], 0).astype(np.float32),
    }


def assert_items_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.describe().replace(", ", "+"))
def test_stored_items_rebuild_exactly(form: StorageForm) -> None:
    batch = items(12)
    stored = encode_items(batch, form)
    assert ("next_observations" in stored) == (not form.ignore_obs_next)
    assert ("next_state" in stored) == (not form.ignore_obs_next)
    assert stored["observations"].shape[-1] == K * FRAME // form.stack_num
    assert_items_equal(decode_items(stored, form), batch)
    per_item = sum(a.nbytes for a in stored.values()) // 12
    assert per_item == stored_item_bytes(item_spec(), form)


def test_a_table_samples_and_checkpoints_full_items() -> None:
    form = FORMS[2]
    table = CompactItemTable(20, form, prioritized=True, seed=3)
    batch = items(30, seed=1)  # more than the capacity: the newest 20 stay
    table.insert(batch)
    assert table.size == 20 and table.evicted == 10
    assert HEAD in table.columns and FINAL_OBS in table.columns and FINAL_STATE in table.columns
    assert "next_observations" not in table.columns
    sampled, info = table.sample(16)
    want = {name: column[info.insert_ids] for name, column in batch.items()}
    assert_items_equal(sampled, want)

    restored = CompactItemTable(20, form, prioritized=True, seed=99)
    restored.load_state(table.state())
    again, _ = restored.sample(16)
    later, _ = table.sample(16)
    assert_items_equal(again, later)  # the same draw: rows, priorities and RNG came back
    with pytest.raises(ValueError, match="stores stack_num 4, ignore_obs_next; this job asks"):
        CompactItemTable(20, FORMS[1]).load_state(table.state())


@pytest.mark.parametrize("n_out", [1, 3])
def test_items_dealt_over_other_shards_stay_exact(n_out: int) -> None:
    form = FORMS[2]
    saved, sent = [], {}
    for shard, count in enumerate([9, 0, 14]):  # a shard that never received an item
        table = CompactItemTable(50, form, seed=shard)
        if count:
            batch = items(count, seed=shard, first_id=100 * shard)
            table.insert(batch)
            for at, episode in enumerate(batch["episode_id"][:, 0]):
                sent[int(episode)] = {name: column[at] for name, column in batch.items()}
        saved.append(table.state())
    held = 0
    for state in deal_tables(saved, n_out, 50):
        table = CompactItemTable(50, form)
        table.load_state(state)
        held += table.size
        if not table.size:
            continue
        got, info = table.sample(table.size)
        for row, episode in enumerate(got["episode_id"][:, 0]):
            for name, value in sent[int(episode)].items():
                np.testing.assert_array_equal(got[name][row], value, err_msg=name)
    assert held == 23


def test_items_the_form_cannot_rebuild_are_refused() -> None:
    broken = items(4)
    broken["observations"][0, 3, 1, 0] += 1.0  # not the previous stack shifted by a frame
    with pytest.raises(ValueError, match="not stacks of 4 frames in turn"):
        encode_items(broken, FORMS[2])
    broken = items(4)
    broken["next_state"][0, 2, 0] += 1.0
    with pytest.raises(ValueError, match="a next state is not the next"):
        encode_items(broken, FORMS[0])
    broken = items(4)
    broken["active"][0, 3:, 1] = False
    broken["active"][0, 5, 1] = True  # acts again, as a turn-based game's player would
    with pytest.raises(ValueError, match="acts again after a step it did not act in"):
        encode_items(broken, FORMS[0])
    broken = items(4)
    padding = np.argwhere(~broken["active"])[0]
    broken["observations"][tuple(padding)] = 1.0
    with pytest.raises(ValueError, match="rebuild padding as zeros"):
        encode_items(broken, FORMS[0])


def test_stacks_of_4_without_next_observations_store_under_a_third_of_the_bytes() -> None:
    """Issue 11's target, for sequences: observations and next observations of a stack of 4
    frames stored as one frame per step plus an item's head and final frame."""
    spec = item_spec("sequence")
    form = FORMS[2]
    obs = [c for c in spec.columns if c.name in ("observations", "next_observations")]
    full = sum(int(np.prod(spec.item_shape(c))) * 4 for c in obs)
    kept = stored_item_bytes(spec, form) - stored_item_bytes(
        ItemSpec("sequence", tuple(c for c in spec.columns if c not in obs), AGENTS, T), form
    )
    assert kept / full <= 0.3, kept / full
    line = storage_line({"team": spec}, form)
    assert line is not None and "(stack_num 4, ignore_obs_next: 0." in line
    assert row_bytes(spec, form) == stored_item_bytes(spec, form) < row_bytes(spec)
