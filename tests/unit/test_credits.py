"""Batched credits (comm/credits.py): a producer and a consumer in one process, stepped in turn,
so the figures are counts, not timings. A slow consumer still holds a fast producer to its
window; a consumer that keeps up sends one credit message per batch and never stalls the
producer; a replay shard sends one credit message per collector and poll."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from hpcmarl.comm.credits import CreditReturn
from hpcmarl.comm.protocol import Message
from hpcmarl.comm.transport import LocalTransport

from .test_checkpoint_writer import shard_world

WINDOW = 8


def stream(count: int, takes_per_step: int, every: int) -> dict[str, int]:
    """Stream `count` messages from p to c with a window of WINDOW and batched credits; c takes
    `takes_per_step` messages on every `every`-th step and flushes on a step that takes none
    (a poll that found nothing). Returns the largest in-flight count and inbox length seen,
    the steps on which p had messages left but no credit, and the credit messages sent."""
    transport = LocalTransport({"p": 0, "c": 0})
    producer, consumer = transport.register("p"), transport.register("c")
    returns = CreditReturn(
        lambda peer, meta: transport.send(Message("credit", "c", peer, meta)), WINDOW // 2
    )
    sent = taken = returned = step = 0
    credits = WINDOW
    seen = {"in_flight": 0, "inbox": 0, "stalled": 0}
    while taken < count:
        step += 1
        seen["stalled"] += credits == 0 and sent < count
        while credits and sent < count:
            transport.send(Message("batch", "p", "c", {"i": sent}))
            sent, credits = sent + 1, credits - 1
        seen["in_flight"] = max(seen["in_flight"], sent - returned)
        seen["inbox"] = max(seen["inbox"], len(consumer))
        took = 0
        while step % every == 0 and consumer and took < takes_per_step:
            assert consumer.popleft().meta["i"] == taken
            returns.owe("p")
            taken, took = taken + 1, took + 1
        if not took:
            returns.flush()
        while producer:
            n = producer.popleft().meta["n"]
            credits, returned = credits + n, returned + n
    returns.flush()
    while producer:
        returned += producer.popleft().meta["n"]
    assert returned == sent == count  # every credit came back, none twice
    return {**seen, "credit_messages": returns.messages}


def test_a_slow_consumer_holds_a_fast_producer_to_its_window() -> None:
    seen = stream(count=200, takes_per_step=1, every=5)
    assert seen["in_flight"] == WINDOW and seen["inbox"] == WINDOW
    assert seen["stalled"] > 100  # the producer waited on the consumer most of the time


def test_a_consumer_that_keeps_up_returns_one_credit_message_per_half_window() -> None:
    seen = stream(count=200, takes_per_step=WINDOW, every=1)
    assert seen["credit_messages"] == 200 // (WINDOW // 2)
    assert seen["stalled"] == 0 and seen["in_flight"] <= WINDOW


def test_a_shard_sends_one_credit_message_per_collector_and_poll(tmp_path: Path) -> None:
    shard, transport, group, batch = shard_world(tmp_path)
    collector: deque[Message] = transport.register("collector0")
    shard.start()
    assert [m.meta["n"] for m in collector] == [shard.cfg.insert_credits]
    collector.clear()
    for value in (1.0, 2.0):  # both arrive before the shard polls
        meta = {"group": group, "items": 8}
        transport.send(Message("batch", "collector0", "replay0", meta, batch(value)))
    shard.poll()
    assert shard.tables[group].size == 16
    assert [(m.kind, m.meta) for m in collector] == [("credit", {"n": 2, "inserted": 2})]
