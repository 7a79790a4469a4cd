"""Packing a batch's columns into one buffer, so that a batch moves as one MPI message.

A layout lists each column's name, dtype, shape and byte offset inside one flat uint8 buffer
(offsets aligned to 64 bytes). Producers that know their columns in advance allocate them
packed (`allocate_packed`, a `PackedBatch`) and send without any copy; small unpacked batches
are copied into one buffer (cheaper than one message per column); large unpacked ones go
column by column.
"""

from __future__ import annotations

import functools
import math
import pickle

import numpy as np

ALIGN = 64
Spec = tuple[str, str, tuple[int, ...]]
Layout = list[tuple[str, str, tuple[int, ...], int]]


class PackedBatch(dict):
    """Columns that live in one packed buffer, carrying that buffer and its layout, so that the
    transport sends them as one message without inspecting a single array."""

    buffer: np.ndarray
    layout: Layout


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@functools.lru_cache(maxsize=256)
def _dtype(code: str) -> np.dtype:
    return np.dtype(code)


def plan_layout(specs: list[Spec]) -> tuple[Layout, int]:
    """Offsets of each column in a packed buffer, and the buffer's size in bytes."""
    layout: Layout = []
    offset = 0
    for name, dtype, shape in specs:
        layout.append((name, dtype, tuple(shape), offset))
        offset = aligned(offset + math.prod(shape) * _dtype(dtype).itemsize)
    return layout, offset


def views(buffer: np.ndarray, layout: Layout) -> PackedBatch:
    """The columns of a packed buffer, as views (no copy)."""
    out = PackedBatch()
    for name, dtype, shape, offset in layout:
        dt = _dtype(dtype)
        out[name] = buffer[offset : offset + math.prod(shape) * dt.itemsize].view(dt).reshape(shape)
    out.buffer, out.layout = buffer, layout
    return out


def allocate_packed(specs: list[Spec]) -> PackedBatch:
    """A fresh packed buffer's column views, for producers that fill columns in place (the
    layout of the same specs is the same object: see `layout_blob`)."""
    layout, nbytes = _planned(tuple((name, dtype, tuple(shape)) for name, dtype, shape in specs))
    return views(np.empty(nbytes, np.uint8), layout)


def merge_leading(batch: PackedBatch, dims: int) -> PackedBatch:
    """The same columns with their first `dims` axes merged into one row axis (no copy)."""
    layout = [
        (name, dtype, (math.prod(shape[:dims]),) + shape[dims:], offset)
        for name, dtype, shape, offset in batch.layout
    ]
    return views(batch.buffer, layout)


def spec_of(arrays: dict[str, np.ndarray]) -> list[Spec]:
    return [(name, a.dtype.str, a.shape) for name, a in arrays.items()]


def layout_of(arrays: dict[str, np.ndarray]) -> tuple[Layout, int]:
    """`plan_layout` of these arrays' specs, remembered: a stream of messages repeats a few."""
    return _planned(tuple((name, a.dtype.str, a.shape) for name, a in arrays.items()))


@functools.lru_cache(maxsize=256)
def _planned(specs: tuple[Spec, ...]) -> tuple[Layout, int]:
    return plan_layout(list(specs))


def pack(arrays: dict[str, np.ndarray]) -> PackedBatch:
    """Copy the arrays into one new packed buffer."""
    out = allocate_packed(spec_of(arrays))
    for name, target in out.items():
        target[...] = arrays[name]
    return out


CACHED_LAYOUTS = 256
"""Distinct layouts remembered by `layout_blob` and `views_of` (all forgotten when full)."""
_BLOBS: dict[int, tuple[Layout, bytes]] = {}
_PLANS: dict[bytes, tuple[Layout, list[tuple[str, np.dtype, int, int, tuple[int, ...]]]]] = {}


def layout_blob(layout: Layout) -> bytes:
    """`layout` pickled, once per layout object: a message header carries its layout as these
    bytes, which the header's pickling copies instead of pickling every column's entry again
    (a stream of messages repeats a few layouts: `layout_of`, `allocate_packed` and the item
    writers each hand out the same layout object for the same columns)."""
    entry = _BLOBS.get(id(layout))
    if entry is None or entry[0] is not layout:
        if len(_BLOBS) >= CACHED_LAYOUTS:
            _BLOBS.clear()
        entry = _BLOBS[id(layout)] = (layout, pickle.dumps(layout, pickle.HIGHEST_PROTOCOL))
    return entry[1]


def views_of(buffer: np.ndarray, blob: bytes) -> PackedBatch:
    """`views` of the layout that `layout_blob` made `blob` of; each distinct layout is read
    and its columns' byte ranges worked out once, so a received message costs a slice per
    column."""
    plan = _PLANS.get(blob)
    if plan is None:
        if len(_PLANS) >= CACHED_LAYOUTS:
            _PLANS.clear()
        layout: Layout = pickle.loads(blob)
        columns = [
            (name, dt, offset, offset + math.prod(shape) * dt.itemsize, tuple(shape))
            for name, dt, shape, offset in ((n, _dtype(d), s, o) for n, d, s, o in layout)
        ]
        plan = _PLANS[blob] = (layout, columns)
    out = PackedBatch()
    for name, dt, start, stop, shape in plan[1]:
        out[name] = buffer[start:stop].view(dt).reshape(shape)
    out.buffer, out.layout = buffer, plan[0]
    return out
