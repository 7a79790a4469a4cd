"""MALib's producer options in a real run: a feed-forward DQN on CartPole without its
velocities, acting on stacks of its last 4 observations (`replay.stack_num`), with tables that
store each frame once and no next observations (`replay.ignore_obs_next`), learns what a single
frame cannot tell it: it passes 100 by 20k env steps (about 150 at 15k) where the same DQN on
single frames stays near 45 (tests/mpi/test_recurrent.py holds it below 90). Two collectors
feed two shards, one each; the run checkpoints, resumes and its tables come back as stored."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint

from .conftest import run_mpi
from .test_train import finished_line

JOB = [
    "jobs/cartpole_novel_stacked.yaml",
    "commander.stop_value=null",
    "commander.eval_interval_s=4",
    "topology.collectors=2",
    "topology.replay_shards=2",
    "topology.learners=1",
    "replay.samples_per_insert=32",
]


def evals(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["return_mean"] for r in rows if r["kind"] == "eval"]


@pytest.mark.mpi
@pytest.mark.slow
def test_stacked_frames_let_a_feed_forward_dqn_balance_without_velocities(tmp_path: Path) -> None:
    first = run_mpi(
        1,
        ["-m", "hpcmarl", *JOB, "commander.max_env_steps=7000", f"runtime.run_dir={tmp_path}"],
        timeout=300,
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "replay stores 44 B per transition (stack_num 4, ignore_obs_next: 0.44" in first.stdout
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    for shard in ("replay0", "replay1"):
        with h5py.File(checkpoint.path / f"{shard}.h5", "r") as f:
            table = f["tables/shared"]
            assert table["column/observations"].shape[1] == 2  # one frame, not four
            assert "next_observations" not in table["column"]
            assert len(table["column/rewards"]) > 1000  # each shard was fed by its collector
    resumed = run_mpi(
        1, ["-m", "hpcmarl", "resume", str(tmp_path), "commander.max_env_steps=20000"], timeout=400
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from checkpoint" in resumed.stdout
    assert "step budget reached" in finished_line(resumed.stdout)
    curve = evals(tmp_path)
    assert max(curve) > 100, curve
