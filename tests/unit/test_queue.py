"""The on-policy FIFO queue's lag filter, and the commander's books of fragments."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.replay.queue import ItemQueue
from hpcmarl.replay.redistribute import deal_queues
from hpcmarl.schedules.ledger import FragmentLedger, dealt_counts


def items(versions: list[int], start: int = 0) -> dict[str, np.ndarray]:
    n = len(versions)
    return {
        "policy_version": np.repeat(np.array(versions, np.int64)[:, None], 4, axis=1),
        "actions": np.arange(start, start + n, dtype=np.int64)[:, None].repeat(4, axis=1),
    }


def test_take_serves_an_id_range_and_drops_its_items_older_than_the_lag() -> None:
    queue = ItemQueue(capacity=100)
    queue.insert(items([1, 1, 2], start=0))
    queue.insert(items([3, 2], start=3))
    later, dropped = queue.take([[4, 1], [3, 1]], min_version=2)  # another learner's, first
    assert dropped == 0 and later is not None and later["actions"][:, 0].tolist() == [4, 3]
    batch, dropped = queue.take([[0, 3]], min_version=2)
    assert dropped == 2 and queue.dropped == 2  # both version-1 items, never served
    assert batch is not None and batch["actions"][:, 0].tolist() == [2]
    assert queue.take([[0, 5]], min_version=0) == (None, 0)
    assert (queue.size, queue.taken, queue.total_inserted) == (0, 3, 5)


def test_a_full_queue_evicts_its_oldest_and_counts_them() -> None:
    queue = ItemQueue(capacity=3)
    queue.insert(items([1, 1], start=0))
    queue.insert(items([2, 2], start=2))
    assert queue.size == 3 and queue.evicted == 1
    batch, _ = queue.take([[0, 4]], min_version=0)
    assert batch is not None and batch["actions"][:, 0].tolist() == [1, 2, 3]


def test_state_round_trip_and_redealing_over_other_shard_counts() -> None:
    first, second = ItemQueue(10), ItemQueue(10)
    first.insert(items([1, 2, 3], start=0))
    second.insert(items([4, 5], start=3))
    restored = ItemQueue(10)
    restored.load_state(first.state())
    assert restored.take([[0, 3]], 0)[0]["actions"][:, 0].tolist() == [0, 1, 2]  # type: ignore[index]
    dealt = deal_queues([first.state(), second.state()], 3)
    held = []
    for state in dealt:
        queue = ItemQueue(10)
        queue.load_state(state)
        batch, _ = queue.take([[0, 10]], 0)
        held.append([] if batch is None else batch["actions"][:, 0].tolist())
    assert held == [[0, 3], [1, 4], [2]]  # item i to shard i mod 3, as the ledger counts them
    assert list(dealt_counts(5, ("a", "b", "c")).values()) == [2, 2, 1]
    with pytest.raises(ValueError, match="capacity"):
        ItemQueue(1).load_state(first.state())


def ledger(batch: int = 4, lag: int = 0, per_task: int = 2) -> FragmentLedger:
    return FragmentLedger({"g": (batch, lag, ("main/p",))}, ("r0", "r1"), per_task)


def test_collection_stays_within_the_lag_window() -> None:
    books = ledger(batch=4, lag=0, per_task=2)
    grants = 0
    while books.may_collect():
        books.on_granted(f"t{grants}")
        grants += 1
    assert grants == 2  # (lag + 1) x batch / per_task
    assert not books.ready("g")  # tasks still running
    books.on_collected("t1", {"g": {"r0": [[0, 1]], "r1": [[0, 1]]}})  # t1 inserted first
    assert not books.ready("g")
    books.on_collected("t0", {"g": {"r0": [[1, 1]], "r1": [[1, 1]]}})
    assert books.ready("g")
    takes = books.assign("g", ("l0", "l1"))  # t0's fragments first: the older plan
    assert takes == {"l0": {"r0": [[1, 1]], "r1": [[1, 1]]}, "l1": {"r0": [[0, 1]], "r1": [[0, 1]]}}
    assert not books.may_collect()  # the batch trains at version 1: version 2 not out yet
    books.on_trained("g", version=2)
    assert books.may_collect() and books.versions() == {"main/p": 2}


def test_with_lag_one_collectors_fill_the_next_batch_with_older_weights() -> None:
    books = ledger(batch=2, lag=1, per_task=2)
    books.on_granted("t0")
    books.on_collected("t0", {"g": {"r0": [[0, 2]]}})
    assert books.versions() == {"main/p": 1}
    assert books.may_collect()  # the second batch may be collected with version 1
    books.on_granted("t1")
    books.assign("g", ("l0",))
    assert not books.may_collect()  # a third batch would need version 2
    books.on_trained("g", version=2)
    assert books.may_collect() and books.versions() == {"main/p": 2}


def test_learners_sharing_a_shard_get_disjoint_id_ranges() -> None:
    books = ledger(batch=6, lag=0, per_task=6)
    books.on_granted("t0")
    books.on_collected("t0", {"g": {"r0": [[0, 6]]}})
    assert books.assign("g", ("l0", "l1")) == {"l0": {"r0": [[0, 3]]}, "l1": {"r0": [[3, 3]]}}
    books.on_trained("g", version=2)
    books.on_granted("t1")
    books.on_collected("t1", {"g": {"r0": [[6, 2]], "r1": [[0, 4]]}})
    assert books.assign("g", ("l0", "l1")) == {
        "l0": {"r0": [[6, 2]], "r1": [[0, 1]]},
        "l1": {"r1": [[1, 3]]},
    }
    state = books.state()
    other = FragmentLedger({"g": (6, 0, ("main/p",))}, ("r0", "r1", "r2"), 6)
    state["g"]["held"] = [[-1, "r0", 8, 4], [-1, "r1", 4, 3]]
    other.load_state(state)  # another shard count: the books hold what the queues re-deal
    assert other.books["g"].held == [(-1, "r0", 0, 3), (-1, "r1", 0, 2), (-1, "r2", 0, 2)]
