"""notify_fail: a collector whose environment raises reports the lost task and carries on,
and the commander releases that task's space; an environment that keeps failing ends the job."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.comm.protocol import Message
from hpcmarl.config.schema import JobConfig
from hpcmarl.launch.build import build_collector
from hpcmarl.roles.param_server import ParameterServer
from hpcmarl.testing.world import OneRank


class FailingSteps:
    """A real vector env whose `step` raises on chosen calls (fault injection)."""

    def __init__(self, env, fail_on: set[int]) -> None:
        self.env, self.fail_on, self.calls = env, fail_on, 0

    def __getattr__(self, name: str):
        return getattr(self.env, name)

    def step(self, actions):
        self.calls += 1
        if self.calls in self.fail_on:
            raise ValueError(f"env broke at step {self.calls}")
        return self.env.step(actions)


def setup(tmp_path, fail_on: set[int]):
    cfg = JobConfig()
    cfg.topology.collectors, cfg.topology.learners, cfg.topology.replay_shards = 1, 1, 1
    world = OneRank(cfg)
    transport, population = world.transport, world.population()
    commander = world.commander(tmp_path, population)
    server = ParameterServer("ps0", transport)
    for key in population.keys():  # the learner's first push, by hand
        table = server.create_table(key, population.spec(key).to_json())
        table.set_weights(np.zeros(population.spec(key).size, np.float32))
    collector = build_collector(cfg, world.spec, world.topology, transport, "collector0")
    collector.env = FailingSteps(collector.env, fail_on)
    transport.register("replay0")
    transport.send(Message("credit", "replay0", "collector0", {"n": 100}))
    commander.start()
    return commander, collector, server


def test_env_failure_releases_task_space_and_collector_continues(tmp_path) -> None:
    commander, collector, server = setup(tmp_path, fail_on={5})
    for _ in range(20):  # until the next task is in hand (its first whole fragment would
        collector.poll()  # set the failure count back to 0)
        commander.poll()
        server.poll()
        if collector.env_failures and collector.task is not None:
            break
    assert commander.collector_space.used == 1  # the failed task was released, a new one runs
    assert collector.env_failures == 1 and collector.task is not None
    rows = (tmp_path / "metrics.jsonl").read_text()
    assert "task_failed" in rows and "env broke at step 5" in rows
    steps_before = collector.env_steps
    for _ in range(10):
        collector.poll()
        server.poll()
    assert collector.env_steps > steps_before


def test_env_that_keeps_failing_ends_the_collector(tmp_path) -> None:
    commander, collector, server = setup(tmp_path, fail_on=set())
    collector.remake_env = lambda: FailingSteps(collector.env.env, fail_on=set(range(1, 100)))
    collector.env = FailingSteps(collector.env.env, fail_on=set(range(1, 100)))
    with pytest.raises(RuntimeError, match="environment failed 3 time"):
        for _ in range(50):
            collector.poll()
            commander.poll()
            server.poll()
