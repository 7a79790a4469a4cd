"""Rate limiters: when a replay table lets collectors insert and learners sample.

Without one, a fast learner re-reads the same few transitions many times and a fast collector
fills the table with data nobody trains on. A limiter is a named object with its formula in its
docstring (after Reverb's `rate_limiters`), so a job's back-pressure can be read, not guessed.
Counts are transitions, not batches.
"""

from __future__ import annotations


class SampleToInsertRatio:
    """Keep samples per inserted transition near `samples_per_insert` (spi), within a buffer.

    With `inserts` and `samples` counted in transitions:

        diff     = inserts * spi - samples
        offset   = spi * min_size_to_sample
        min_diff = offset - error_buffer
        max_diff = offset + error_buffer

        insert allowed  while  diff < max_diff
        sample allowed  while  table_size >= min_size_to_sample  and  diff > min_diff

    Both checks look at the counters *before* the operation, so a batch of any size may overshoot
    the bound by itself but never blocks both sides: `min_diff < max_diff` (error_buffer > 0)
    means at least one of the two conditions on `diff` holds, and a blocked insert implies
    `inserts > min_size_to_sample`, so a table whose capacity is at least `min_size_to_sample`
    can be sampled. `diff` thus stays within one batch of `[min_diff, max_diff]`, and
    samples / inserts converges to spi. `spi == 0` switches the ratio off: inserts are always
    allowed and only the minimum size gates sampling.
    """

    def __init__(
        self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float
    ) -> None:
        if samples_per_insert < 0:
            raise ValueError(f"samples_per_insert must be >= 0, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        if samples_per_insert > 0 and error_buffer <= 0:
            raise ValueError(
                f"error_buffer must be > 0 when samples_per_insert > 0, got {error_buffer}: "
                "with no buffer inserts and samples can both be blocked"
            )
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.error_buffer = float(error_buffer)
        offset = self.samples_per_insert * self.min_size_to_sample
        self.min_diff = offset - self.error_buffer
        self.max_diff = offset + self.error_buffer
        self.inserts = 0
        self.samples = 0
        self.relaxed = False

    @property
    def diff(self) -> float:
        """`inserts * spi - samples`: how far sampling lags the target ratio."""
        return self.inserts * self.samples_per_insert - self.samples

    def _ratio_off(self) -> bool:
        return self.relaxed or self.samples_per_insert == 0

    def can_insert(self) -> bool:
        """Whether a collector's next batch may go in now."""
        return self._ratio_off() or self.diff < self.max_diff

    def can_sample(self, table_size: int) -> bool:
        """Whether a learner's next batch may be drawn from a table holding `table_size` items."""
        if table_size < self.min_size_to_sample:
            return False
        return self._ratio_off() or self.diff > self.min_diff

    def on_insert(self, n: int) -> None:
        """Count `n` transitions inserted."""
        self.inserts += int(n)

    def on_sample(self, n: int) -> None:
        """Count `n` transitions sampled."""
        self.samples += int(n)

    def relax(self) -> None:
        """Stop enforcing the ratio for a shutdown drain: collectors must be able to flush what
        they hold, and learners may finish on what is there; only the minimum size still
        gates sampling."""
        self.relaxed = True

    def state(self) -> dict[str, float | int]:
        """Counters for a checkpoint, so a resumed run keeps the ratio it had reached."""
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state(self, state: dict[str, float | int]) -> None:
        """Restore counters saved by `state`."""
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])

    def __repr__(self) -> str:
        return (
            f"SampleToInsertRatio(samples_per_insert={self.samples_per_insert}, "
            f"min_size_to_sample={self.min_size_to_sample}, error_buffer={self.error_buffer}, "
            f"inserts={self.inserts}, samples={self.samples}, relaxed={self.relaxed})"
        )
