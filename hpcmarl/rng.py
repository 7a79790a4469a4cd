"""numpy Generators' states as plain uint64 words, for HDF5 checkpoints without pickles."""

from __future__ import annotations

import numpy as np


def rng_to_words(rng: np.random.Generator) -> np.ndarray:
    """PCG64's state as uint64 words, its 128-bit integers split in halves."""
    state = rng.bit_generator.state
    s, inc = state["state"]["state"], state["state"]["inc"]
    words = [s >> 64, s, inc >> 64, inc, state["has_uint32"], state["uinteger"]]
    return np.array([w & 0xFFFF_FFFF_FFFF_FFFF for w in words], dtype=np.uint64)


def rng_from_words(words: np.ndarray) -> dict:
    """The inverse of `rng_to_words`, as a state dict for `bit_generator.state`."""
    s_hi, s_lo, inc_hi, inc_lo, has_uint32, uinteger = (int(w) for w in words)
    pcg = {"state": (s_hi << 64) | s_lo, "inc": (inc_hi << 64) | inc_lo}
    return {"bit_generator": "PCG64", "state": pcg, "has_uint32": has_uint32, "uinteger": uinteger}
