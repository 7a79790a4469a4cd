"""SampleToInsertRatio: the formula's bounds, freedom from deadlock and the long-run ratio."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.replay.rate_limiters import SampleToInsertRatio


def test_min_size_gates_sampling() -> None:
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=5.0)
    assert limiter.can_insert()
    limiter.on_insert(9)
    assert not limiter.can_sample(table_size=9)
    limiter.on_insert(1)
    assert limiter.can_sample(table_size=10)


def test_bounds_follow_the_formula() -> None:
    # offset = 2 * 10 = 20, min_diff = 15, max_diff = 25
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=5.0)
    limiter.on_insert(12)  # diff = 24
    assert limiter.can_insert()
    limiter.on_insert(1)  # diff = 26
    assert not limiter.can_insert()
    limiter.on_sample(11)  # diff = 15
    assert limiter.can_insert() and not limiter.can_sample(table_size=13)
    limiter.on_insert(1)  # diff = 17
    assert limiter.can_sample(table_size=14)


def test_zero_ratio_only_gates_on_min_size() -> None:
    limiter = SampleToInsertRatio(samples_per_insert=0.0, min_size_to_sample=3, error_buffer=0.0)
    limiter.on_insert(1000)
    limiter.on_sample(10**6)
    assert limiter.can_insert()
    assert limiter.can_sample(table_size=3) and not limiter.can_sample(table_size=2)


def test_relax_lifts_the_ratio_but_not_min_size() -> None:
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=2.0)
    limiter.on_insert(100)
    assert not limiter.can_insert()
    limiter.relax()
    assert limiter.can_insert()
    assert limiter.can_sample(table_size=4) and not limiter.can_sample(table_size=3)


@pytest.mark.parametrize(
    ("spi", "min_size", "error_buffer"),
    [(1.0, 100, 10.0), (8.0, 64, 1.0), (0.25, 32, 0.5), (32.0, 1000, 200.0)],
)
def test_never_deadlocks_and_converges_to_ratio(spi: float, min_size: int, error_buffer: float):
    rng = np.random.default_rng(int(spi * 100))
    limiter = SampleToInsertRatio(spi, min_size, error_buffer)
    capacity, table_size = 2 * min_size, 0
    for _ in range(20_000):
        can_insert, can_sample = limiter.can_insert(), limiter.can_sample(table_size)
        assert can_insert or can_sample, repr(limiter)
        if can_insert and (not can_sample or rng.random() < 0.5):
            n = int(rng.integers(1, 200))
            limiter.on_insert(n)
            table_size = min(capacity, table_size + n)
        else:
            limiter.on_sample(int(rng.integers(1, 300)))
    assert limiter.samples / limiter.inserts == pytest.approx(spi, rel=0.02)


def test_state_round_trip() -> None:
    limiter = SampleToInsertRatio(samples_per_insert=4.0, min_size_to_sample=8, error_buffer=4.0)
    limiter.on_insert(10)
    limiter.on_sample(7)
    restored = SampleToInsertRatio(samples_per_insert=4.0, min_size_to_sample=8, error_buffer=4.0)
    restored.load_state(limiter.state())
    assert restored.state() == {"inserts": 10, "samples": 7}
    assert restored.diff == limiter.diff == 33.0


def test_rejects_settings_that_could_deadlock() -> None:
    with pytest.raises(ValueError, match="error_buffer"):
        SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=8, error_buffer=0.0)
    with pytest.raises(ValueError):
        SampleToInsertRatio(samples_per_insert=-1.0, min_size_to_sample=8, error_buffer=1.0)
    with pytest.raises(ValueError):
        SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=0, error_buffer=1.0)
