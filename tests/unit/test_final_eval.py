"""A run that stops by its budget while a collector evaluates keeps that evaluation: the
collector finishes it before acknowledging the stop (within its grace), so the run's last
return is not lost. An interrupted run stops at once."""

from __future__ import annotations

import numpy as np

from hpcmarl.comm.protocol import Message
from hpcmarl.config.schema import JobConfig
from hpcmarl.launch.build import build_collector
from hpcmarl.roles.param_server import ParameterServer
from hpcmarl.testing.world import OneRank


def evaluating_collector():
    """A collector inside an evaluation task, its commander's inbox, and its server."""
    cfg = JobConfig()
    cfg.topology.collectors, cfg.topology.learners, cfg.topology.replay_shards = 1, 1, 1
    world = OneRank(cfg)
    transport, population = world.transport, world.population()
    server = ParameterServer("ps0", transport)
    for key in population.keys():
        table = server.create_table(key, population.spec(key).to_json())
        table.set_weights(np.zeros(population.spec(key).size, np.float32))
    collector = build_collector(cfg, world.spec, world.topology, transport, "collector0")
    commander_inbox = transport.register("commander")
    transport.register("replay0")
    bindings = dict(world.spec.bindings(cfg.agents.strategy_spec_id))
    task = {"task_id": "eval-1", "kind": "eval", "episodes": 10, "bindings": bindings}
    transport.send(Message("task", "commander", "collector0", task))
    for _ in range(5):  # the task lands, its weights are pulled, the first steps are taken
        collector.poll()
        server.poll()
    assert collector.evaluation is not None
    return collector, server, transport, commander_inbox


def stop(transport, exit_code: int) -> None:
    meta = {"reason": "step budget reached", "exit_code": exit_code}
    transport.send(Message("stop", "commander", "collector0", meta))


def run_until_finished(collector, server) -> None:
    for _ in range(20_000):
        if collector.finished:
            return
        collector.poll()
        server.poll()
    raise AssertionError("the collector never finished")


def test_a_budget_stop_waits_for_the_evaluation_in_hand() -> None:
    collector, server, transport, inbox = evaluating_collector()
    stop(transport, exit_code=0)
    run_until_finished(collector, server)
    kinds = [msg.kind for msg in inbox if msg.kind in ("task_done", "stopped")]
    assert kinds == ["task_done", "stopped"]
    done = next(msg for msg in inbox if msg.kind == "task_done")
    assert done.meta["kind"] == "eval" and done.meta["eval"]["episodes"] == 10


def test_an_interrupted_run_stops_at_once() -> None:
    collector, server, transport, inbox = evaluating_collector()
    stop(transport, exit_code=75)
    collector.poll()
    assert collector.finished
    assert [msg.kind for msg in inbox if msg.kind in ("task_done", "stopped")] == ["stopped"]


def test_an_evaluation_longer_than_the_grace_is_dropped() -> None:
    collector, server, transport, inbox = evaluating_collector()
    collector.stop_grace_s = 0.0
    stop(transport, exit_code=0)
    run_until_finished(collector, server)
    assert [msg.kind for msg in inbox if msg.kind in ("task_done", "stopped")] == ["stopped"]
