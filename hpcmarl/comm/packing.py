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
    """A fresh packed buffer's column views, for producers that fill columns in place."""
    layout, nbytes = plan_layout(specs)
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
