"""Running summaries whose memory does not grow with the number of rows folded into them.

Each one gives the same answer whatever the chunking of its input (up to float rounding of
sums), so a file read 64k rows at a time summarises exactly as one read whole: histograms use
fixed bins chosen from the bits of a float32, not from data seen so far, and the episode sample
keeps the episodes with the smallest hash of their id, not the first or last ones seen.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_HIST_SHIFT = 20
"""float32 bits kept after the shift: sign, 8 exponent bits, 3 mantissa bits. Bins are then
1/8 octave wide (at most 9 % of the value), whatever the value's magnitude."""
_HIST_BINS = 1 << (32 - _HIST_SHIFT)


class Moments:
    """Count, sum, mean, standard deviation, min and max of a stream of numbers.

    Sums are float64, through reused buffers (a fresh float64 copy per chunk costs more than
    the sums) and numpy's own loops: BLAS `dot` starts threads, which stall on a busy node."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.lo = np.inf
        self.hi = -np.inf
        self._buf = np.zeros((2, 0), np.float64)

    def add(self, values: np.ndarray) -> None:
        n = len(values)
        if n == 0:
            return
        if self._buf.shape[1] < n:
            self._buf = np.empty((2, n), np.float64)
        x, sq = self._buf[0, :n], self._buf[1, :n]
        x[:] = values
        np.multiply(x, x, out=sq)
        self.count += n
        self.total += float(x.sum())
        self.total_sq += float(sq.sum())
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))

    def to_dict(self) -> dict[str, Any]:
        if not self.count:
            return {"count": 0}
        mean = self.total / self.count
        var = max(self.total_sq / self.count - mean * mean, 0.0)
        return {
            "count": self.count,
            "sum": self.total,
            "mean": mean,
            "std": var**0.5,
            "min": self.lo,
            "max": self.hi,
        }


class FloatHistogram:
    """Counts per 1/8-octave bin of |value|, for both signs; 4096 fixed bins found by a shift."""

    def __init__(self) -> None:
        self.counts = np.zeros(_HIST_BINS, np.int64)
        self._keys = np.zeros(0, np.int64)

    def add(self, values: np.ndarray) -> None:
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        if len(self._keys) < len(bits):
            self._keys = np.empty(len(bits), np.int64)
        keys = np.right_shift(bits, _HIST_SHIFT, out=self._keys[: len(bits)])  # bincount's dtype
        self.counts += np.bincount(keys, minlength=_HIST_BINS)

    def bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(low edges, high edges, counts) of the non-empty finite bins, in value order."""
        keys = np.flatnonzero(self.counts)
        keys = keys[((keys >> 3) & 0xFF) != 0xFF]  # exponent 255: inf and NaN
        half = _HIST_BINS // 2
        neg = keys[keys >= half][::-1] - half  # magnitudes of negative bins, largest first
        pos = keys[keys < half]
        lo = np.concatenate([-_key_value(neg + 1), _key_value(pos)])
        hi = np.concatenate([-_key_value(neg), _key_value(pos + 1)])
        return lo, hi, np.concatenate([self.counts[neg + half], self.counts[pos]])

    def nonfinite(self) -> int:
        keys = np.arange(_HIST_BINS)
        return int(self.counts[((keys >> 3) & 0xFF) == 0xFF].sum())

    def quantiles(self, qs: tuple[float, ...]) -> list[float | None]:
        """Each quantile as the midpoint of its bin (within 5 % of the exact value; 0 for the
        bin that holds zero)."""
        lo, hi, counts = self.bins()
        total = counts.sum()
        if not total:
            return [None for _ in qs]
        cum = np.cumsum(counts)
        mid = np.where((lo <= 0) & (hi >= 0), 0.0, (lo + hi) / 2)
        at = np.minimum(np.searchsorted(cum, np.array(qs) * total), len(cum) - 1)
        return [float(v) for v in mid[at]]

    def to_dict(self) -> dict[str, Any]:
        lo, hi, counts = self.bins()
        return {"lo": lo.tolist(), "hi": hi.tolist(), "count": counts.tolist()}


def _key_value(keys: np.ndarray) -> np.ndarray:
    """The float32 value whose bits start with `keys` followed by zeros (a bin's low edge)."""
    bits = (keys.astype(np.uint64) << _HIST_SHIFT).astype(np.uint32)
    return bits.view(np.float32).astype(np.float64)


class IntCounts:
    """Exact counts of small non-negative-ish integers (actions, policy versions), grown as
    larger values appear; memory follows the value range, never the row count."""

    def __init__(self) -> None:
        self.offset = 0
        self.counts = np.zeros(0, np.int64)

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        v = np.asarray(values, dtype=np.int64)
        lo = int(v.min())
        if not len(self.counts):
            self.offset = lo
        elif lo < self.offset:
            self.counts = np.concatenate([np.zeros(self.offset - lo, np.int64), self.counts])
            self.offset = lo
        counts = np.bincount(v - self.offset if self.offset else v)
        if len(counts) > len(self.counts):
            counts[: len(self.counts)] += self.counts
            self.counts = counts
        else:
            self.counts[: len(counts)] += counts

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, counts) of the values seen."""
        nz = np.flatnonzero(self.counts)
        return nz + self.offset, self.counts[nz]


class EpisodeSample:
    """Up to `k` episodes kept by the smallest hash of their id: a uniform sample that does not
    depend on the order episodes were found in. Quantiles and histograms come from it; they are
    exact while there are at most `k` episodes."""

    def __init__(self, k: int, width: int) -> None:
        self.k = k
        self.keys = np.zeros(0, np.uint64)
        self.values = np.zeros((0, width), np.float64)

    def add(self, ids: np.ndarray, values: np.ndarray) -> None:
        keys = np.concatenate([self.keys, _mix64(ids)])
        values = np.concatenate([self.values, values])
        if len(keys) > self.k:
            keep = np.argpartition(keys, self.k - 1)[: self.k]
            keys, values = keys[keep], values[keep]
        self.keys, self.values = keys, values


def _mix64(ids: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: consecutive episode ids get unrelated keys."""
    z = np.asarray(ids).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class ProgressBins:
    """Per-episode values binned by where in training the episode ended (0..1 of the data)."""

    def __init__(self, bins: int, width: int) -> None:
        self.count = np.zeros(bins, np.int64)
        self.total = np.zeros((bins, width), np.float64)
        self.lo = np.full((bins, width), np.inf)
        self.hi = np.full((bins, width), -np.inf)

    def add(self, where: np.ndarray, values: np.ndarray) -> None:
        n = len(self.count)
        b = np.minimum((np.asarray(where) * n).astype(np.int64), n - 1)
        self.count += np.bincount(b, minlength=n)
        np.add.at(self.total, b, values)
        np.minimum.at(self.lo, b, values)
        np.maximum.at(self.hi, b, values)

    def means(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.total / self.count[:, None]
