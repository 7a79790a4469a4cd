"""Groups that fill at different rates (agents leaving episodes at different times) under a
samples-per-insert limiter: the fast group's limiter, holding its batches (and with them the
collectors' shared credits) back, once stopped the slow group's inserts, whose learner waited
for them, for ever. Now a starved group lets every other group's batches in; and a run whose
env steps and updates stop anyway ends with what waits on what."""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import pytest

from hpcmarl.comm.protocol import Message
from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import build_replay_shard, item_specs
from hpcmarl.testing.world import OneRank

from ..mpi.conftest import run_local

EARLY_EXIT = ["env.id=hpcmarl.testing.early_exit", "env.kwargs={}", "agents.mapping=independent"]


def two_groups(tmp_path, *overrides: str):
    cfg = load_job("jobs/spread_independent.yaml", [*EARLY_EXIT, *overrides])
    cfg.runtime.run_dir = str(tmp_path)
    world = OneRank(cfg)
    shard = build_replay_shard(cfg, world.spec, world.topology, world.transport, "replay0")
    items = item_specs(cfg, world.spec)
    return cfg, world, shard, items


def batch(items, group: str, n: int) -> dict[str, np.ndarray]:
    spec = items[group]
    return {c.name: np.zeros((n, *spec.item_shape(c)), c.dtype) for c in spec.columns}


def test_a_starved_group_lets_the_other_groups_batches_in(tmp_path) -> None:
    cfg, world, shard, items = two_groups(
        tmp_path, "replay.learning_starts=8", "replay.error_buffer=16"
    )
    transport = world.transport
    collector: deque[Message] = transport.register("collector0")
    transport.register("learner0")

    def send(group: str, n: int) -> None:
        transport.send(
            Message("batch", "collector0", "replay0", {"group": group}, batch(items, group, n))
        )
        shard.poll()

    send("runner", 16)  # runner's limiter: diff 256 >= max_diff 8 * 16 + 16: inserts held
    send("runner", 16)
    assert shard.tables["runner"].size == 16 and len(shard.pending_inserts) == 1
    request = {"group": "quitter", "n": 4}  # quitter holds nothing: its learner waits
    transport.send(Message("sample_request", "learner0", "replay0", request))
    shard.poll()
    assert shard.tables["runner"].size == 32, "runner's batch was held while quitter starved"
    assert len([m for m in collector if m.kind == "credit"]) == 2
    send("quitter", 8)
    assert shard.tables["quitter"].size == 8


def test_a_stall_names_what_waits_on_what(tmp_path) -> None:
    cfg, world, shard, items = two_groups(tmp_path)
    cfg.runtime.stall_timeout_s = 0.01  # the check itself; a job may not set less than 30 s
    commander = world.commander(tmp_path)
    transport = world.transport
    transport.register("learner0")
    transport.send(Message("sample_request", "learner0", "replay0", {"group": "quitter", "n": 4}))
    shard.poll()
    commander.stats.on_role_stats(shard.counters())
    commander.check_stall()
    time.sleep(0.05)
    with pytest.raises(RuntimeError, match="stalled: no env step and no update for 0.01 s") as err:
        commander.check_stall()
    assert "replay0 refuses quitter's samples (1 requests wait" in str(err.value)


def test_spread_independents_settings_on_agents_that_leave_early_finish(tmp_path) -> None:
    """It stalled at 4,200 env steps (1,200 updates) for good in one process."""
    args = [
        "-m",
        "hpcmarl",
        "jobs/spread_independent.yaml",
        *EARLY_EXIT,
        "replay.learning_starts=100",
        "commander.max_env_steps=6000",
        "runtime.stall_timeout_s=60",
        "checkpoint.at_end=false",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(args, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "finished: step budget reached after 6000 env steps" in result.stdout
