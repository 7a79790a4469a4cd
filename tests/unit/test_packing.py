"""Packing: layouts round trip, packed producers are recognised, and nothing else is."""

from __future__ import annotations

import numpy as np

from hpcmarl.comm.packing import (
    PackedBatch,
    allocate_packed,
    layout_blob,
    layout_of,
    merge_leading,
    pack,
    plan_layout,
    spec_of,
    views,
    views_of,
)
from hpcmarl.comm.transport import BufferPool, byte_chunks


def sample_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "observations": rng.standard_normal((5, 3)).astype(np.float32),
        "actions": rng.integers(0, 4, 5),
        "terminations": rng.random(5) > 0.5,
        "agent_id": np.arange(5, dtype=np.int16),
        "empty": np.zeros((0, 2), np.float64),
    }


def test_pack_then_views_round_trips_every_dtype_and_shape() -> None:
    batch = sample_batch()
    packed = pack(batch)
    buffer, layout = packed.buffer, packed.layout
    assert buffer.dtype == np.uint8 and all(offset % 64 == 0 for *_, offset in layout)
    out = views(buffer, layout)
    for name, array in batch.items():
        assert out[name].dtype == array.dtype and out[name].shape == array.shape
        assert np.array_equal(out[name], array)


def test_packed_batches_reshape_without_copy_and_keep_their_layout() -> None:
    batch = allocate_packed([("obs", "<f4", (2, 4, 3)), ("act", "<i8", (2, 4))])
    batch["obs"][...] = np.arange(24).reshape(2, 4, 3)
    flat = merge_leading(batch, 2)
    assert isinstance(flat, PackedBatch) and flat.buffer is batch.buffer
    assert flat["obs"].shape == (8, 3) and flat["act"].shape == (8,)
    assert np.shares_memory(flat["obs"], batch["obs"])
    assert np.array_equal(views(flat.buffer, flat.layout)["obs"], flat["obs"])


def test_layout_of_is_the_planned_layout_remembered_per_spec() -> None:
    batch = sample_batch()
    layout, nbytes = layout_of(batch)
    assert (layout, nbytes) == plan_layout(spec_of(batch))
    assert layout_of(sample_batch())[0] is layout
    batch["actions"] = batch["actions"][:3]
    assert layout_of(batch) == plan_layout(spec_of(batch)) != (layout, nbytes)


def test_byte_chunks_cover_the_buffer_exactly() -> None:
    assert byte_chunks(0, 10) == []
    assert byte_chunks(25, 10) == [(0, 10), (10, 20), (20, 25)]


def test_buffer_pool_reuses_only_what_it_lent_and_was_given_back() -> None:
    pool = BufferPool(max_bytes=1 << 20, per_size=2)
    first = pool.take(1024)
    pool.give(first.view(np.float32).reshape(16, 16))
    assert pool.take(1024) is first
    pool.give(np.empty(1024, np.uint8))  # a stranger: ignored
    assert pool.take(1024) is not first


def test_a_layout_sent_as_bytes_is_pickled_once_and_read_back_the_same() -> None:
    batch = pack(sample_batch())
    blob = layout_blob(batch.layout)
    assert layout_blob(batch.layout) is blob  # pickled once per layout object
    assert allocate_packed(spec_of(batch)).layout is allocate_packed(spec_of(batch)).layout
    received = views_of(batch.buffer.copy(), blob)
    assert received.layout == batch.layout
    assert views_of(batch.buffer, blob).layout is received.layout  # read once per layout
    for name, array in sample_batch().items():
        assert received[name].dtype == array.dtype
        assert np.array_equal(received[name], array)


def test_buffer_pool_forgets_a_lent_buffer_collected_without_coming_back() -> None:
    pool = BufferPool()
    lent = pool.take(256)
    assert len(pool.lent) == 1
    del lent
    assert not pool.lent
    kept = pool.take(256)
    pool.give(kept[10:20])
    pool.give(kept)  # given twice: kept once
    assert pool.free[256] == [kept]
