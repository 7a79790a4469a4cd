"""Deterministic mode: 2N updates in one run equal N updates, a checkpoint, a new mpirun, a
resume and N more — bit for bit in every role's state, row for row in the `round` metrics."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint

from ..mpi.conftest import run_mpi
from .test_resume import leaves

JOB = [
    "commander.deterministic=true",
    "commander.stop_value=null",
    "topology.collectors=3",
    "checkpoint.interval_s=0",
]


def rounds(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "round"]


MAPPO = [
    "jobs/spread_mappo.yaml",
    *JOB,
    "env.num_envs=4",
    "learner.ppo.batch_fragments=12",
    "learner.ppo.epochs=3",
    "topology.learners=2",
]
"""3 collectors x 4 env copies: one batch of 12 fragments per round; 2 learners average it."""

QMIX = [
    "jobs/spread_qmix.yaml",
    *JOB,
    "env.num_envs=4",
    "learner.batch_size=8",
    "learner.updates_per_task=10",
    "learner.qmix.target_network_update_freq=7",
    "replay.learning_starts=12",
]
"""Episodes of the team (12 per round), their recurrent states and the mixer's targets."""

R2D2 = [
    "jobs/cartpole_novel_r2d2.yaml",
    *JOB,
    "env.num_envs=4",
    "learner.batch_size=8",
    "learner.updates_per_task=10",
    "learner.r2d2.target_network_update_freq=7",
    "replay.learning_starts=12",
    "commander.stop_value=null",
]
"""Prioritized sequences with their stored recurrent states, burn-in and n-step targets."""

STACKED = [
    "jobs/cartpole_novel_stacked.yaml",
    *JOB,
    "topology.replay_shards=3",
    "learner.updates_per_task=50",
    "replay.learning_starts=300",
]
"""Compact tables (frames stored once, no next observations), one home shard per collector,
and the open runs and kept-aside frames they checkpoint."""

COMPACT_SEQUENCES = [
    *R2D2,
    "env.id=hpcmarl.envs.partial:CartPoleNoVelocityStacked-v1",
    "replay.stack_num=4",
    "replay.save_only_last_obs=true",
    "replay.ignore_obs_next=true",
]
"""Sequences stored as single frames, each with its first stack's older frames and its final
next frame (`replay.compact_items`)."""


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("job", "updates"),
    [(JOB, 400), (MAPPO, 24), (QMIX, 60), (R2D2, 60), (STACKED, 400), (COMPACT_SEQUENCES, 60)],
    ids=["dqn", "mappo", "qmix", "r2d2", "stacked", "compact-sequences"],
)
def test_a_resumed_run_equals_an_uninterrupted_one(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, job: list[str], updates: int
) -> None:
    halves = tmp_path / "halves"
    steps = [
        [*job, f"commander.max_updates={updates // 2}", f"runtime.run_dir={halves}"],
        ["resume", str(halves), f"commander.max_updates={updates}"],
    ]
    # The uninterrupted run beside the two halves: in deterministic mode one rank works at a
    # time, so two runs take little longer than one.
    with ThreadPoolExecutor(1) as beside:
        uninterrupted = beside.submit(trained, tmp_path_factory, job, updates)
        for args in steps:
            result = run_mpi(4, ["-m", "hpcmarl", *args], timeout=300)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        whole, _ = uninterrupted.result()
    assert_runs_equal(whole, halves, updates=updates)


_TRAINED: dict[tuple[str, ...], tuple[Path, str]] = {}


def trained(factory: pytest.TempPathFactory, job: list[str], updates: int) -> tuple[Path, str]:
    """The run directory and stdout of an uninterrupted deterministic run of `job` to `updates`
    at -n 4, made once per session: such a run is the same bit for bit every time, so the
    tests that need the same one (here, and tests/mpi/test_compact_items.py's full QMIX and
    compact R2D2 runs) read one run instead of training it again. Readers must not change it."""
    key = (*job, f"commander.max_updates={updates}")
    if key not in _TRAINED:
        run_dir = factory.mktemp("deterministic")
        args = ["-m", "hpcmarl", *key, f"runtime.run_dir={run_dir}"]
        result = run_mpi(4, args, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        _TRAINED[key] = (run_dir, result.stdout)
    return _TRAINED[key]


def assert_runs_equal(whole: Path, halves: Path, updates: int) -> None:
    """The last checkpoints of both runs hold the same arrays; the round rows are the same."""
    a, _ = latest_checkpoint(whole)
    b, _ = latest_checkpoint(halves)
    assert a is not None and b is not None and b.id == "000002"
    assert sorted(a.roles()) == sorted(b.roles())
    for role in a.roles():
        left, right = leaves(a.read_role(role)), leaves(b.read_role(role))
        assert left.keys() == right.keys(), role
        for key in left:
            assert np.array_equal(left[key], right[key]), f"{role}: {key} differs"
    assert rounds(whole) == rounds(halves)
    assert rounds(whole)[-1]["updates"] == updates
