"""Packing a batch's columns into one buffer, so that a batch moves as one MPI message.

A layout lists each column's name, dtype, shape and byte offset inside one flat uint8 buffer
(offsets aligned to 64 bytes). Producers that know their columns in advance allocate them
packed (`allocate_packed`) and send without any copy; small unpacked batches are copied into
one buffer (cheaper than one message per column); large unpacked ones go column by column.
"""

from __future__ import annotations

import numpy as np

ALIGN = 64
Spec = tuple[str, str, tuple[int, ...]]
Layout = list[tuple[str, str, tuple[int, ...], int]]


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_layout(specs: list[Spec]) -> tuple[Layout, int]:
    """Offsets of each column in a packed buffer, and the buffer's size in bytes."""
    layout: Layout = []
    offset = 0
    for name, dtype, shape in specs:
        layout.append((name, dtype, tuple(shape), offset))
        offset = _aligned(offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return layout, offset


def views(buffer: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    """The columns of a packed buffer, as views (no copy)."""
    out = {}
    for name, dtype, shape, offset in layout:
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        out[name] = buffer[offset : offset + nbytes].view(dt).reshape(shape)
    return out


def allocate_packed(specs: list[Spec]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A fresh packed buffer and its column views, for producers that fill columns in place."""
    layout, nbytes = plan_layout(specs)
    buffer = np.empty(nbytes, np.uint8)
    return buffer, views(buffer, layout)


def spec_of(arrays: dict[str, np.ndarray]) -> list[Spec]:
    return [(name, a.dtype.str, a.shape) for name, a in arrays.items()]


def packed_buffer(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, Layout] | None:
    """The one buffer these arrays already live in, packed as `plan_layout` would, or None."""
    roots = {id(_root(a)) for a in arrays.values()}
    if len(roots) != 1:
        return None
    root = _root(next(iter(arrays.values())))
    if root.dtype != np.uint8 or root.ndim != 1 or not root.flags.c_contiguous:
        return None
    layout, nbytes = plan_layout(spec_of(arrays))
    if nbytes > root.nbytes:
        return None
    start = root.__array_interface__["data"][0]
    for (_, _, _, offset), array in zip(layout, arrays.values(), strict=True):
        if not array.flags.c_contiguous or array.__array_interface__["data"][0] - start != offset:
            return None
    return root[:nbytes], layout


def pack(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, Layout]:
    """Copy the arrays into one new packed buffer."""
    layout, nbytes = plan_layout(spec_of(arrays))
    buffer = np.empty(nbytes, np.uint8)
    for (name, _, _, _), target in zip(layout, views(buffer, layout).values(), strict=True):
        target[...] = arrays[name]
    return buffer, layout


def _root(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array
