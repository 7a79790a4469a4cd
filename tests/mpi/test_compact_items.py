"""MALib's producer options for episodes and sequences in real runs: R2D2 on a CartPole that
stacks its own 4 frames, its sequences stored as single frames with no next observations
(`replay.save_only_last_obs`, `stack_num`, `ignore_obs_next`), and QMIX's episodes stored
without next observations or next states, train exactly as with full items, update for
update, in deterministic mode: what the tables rebuild is what the collectors sent. The
compact checkpoint holds less, and `export` rebuilds the same observations from it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint

from ..checkpoint.test_deterministic import COMPACT_SEQUENCES, QMIX, R2D2, rounds, trained
from .conftest import run_local

STACKED_ENV = "env.id=hpcmarl.envs.partial:CartPoleNoVelocityStacked-v1"
COMPACT = {
    # R2D2's sequences as single frames: the same run as test_deterministic's (read from it).
    "r2d2": COMPACT_SEQUENCES,
    "qmix": [*QMIX, "replay.ignore_obs_next=true"],
}
FULL = {"r2d2": [*R2D2, STACKED_ENV], "qmix": QMIX}
UPDATES = 60
"""test_deterministic's updates for these jobs: its uninterrupted compact R2D2 and full QMIX
runs are the ones compared here, trained once per session (`trained`)."""


def exported(run_dir: Path, out: Path) -> dict[str, np.ndarray]:
    checkpoint, _ = latest_checkpoint(run_dir)
    assert checkpoint is not None
    shard = checkpoint.path / "replay0.h5"
    cmd = ["-m", "hpcmarl", "export", str(shard), "--format", "d4rl", "--agent", "0"]
    result = run_local([*cmd, "--out", str(out)], 120)
    assert result.returncode == 0, result.stderr[-3000:]
    with h5py.File(out) as f:
        return {name: f[name][()] for name in ("observations", "next_observations", "actions")}


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ["r2d2", "qmix"])
def test_compact_items_train_exactly_as_full_ones(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, algo: str
) -> None:
    with ThreadPoolExecutor(1) as beside:  # deterministic runs: one rank works at a time
        full_run = beside.submit(trained, tmp_path_factory, FULL[algo], UPDATES)
        compact, said = trained(tmp_path_factory, COMPACT[algo], UPDATES)
        full, _ = full_run.result()
    assert rounds(compact) == rounds(full)
    assert len(rounds(compact)) >= 3 and rounds(compact)[-1]["updates"] == UPDATES
    stored = json.dumps([line for line in said.splitlines() if "replay stores" in line])
    assert "ignore_obs_next: 0." in stored, said[-3000:]

    checkpoint, _ = latest_checkpoint(compact)
    assert checkpoint is not None
    with h5py.File(checkpoint.path / "replay0.h5") as f:
        (table,) = f["tables"].values()  # the one group: the agents share their policy
        columns = table["column"]
        assert "next_observations" not in columns and "final_next_observations" in columns
        if algo == "r2d2":  # one frame of (x, angle) per step, not a stack of 4
            assert columns["observations"].shape[-1] == 2
            assert columns["observations_head"].shape[-1] == 6
        else:
            assert "next_state" not in columns and "final_next_state" in columns
    rebuilt = exported(compact, tmp_path / "compact.h5")
    sent = exported(full, tmp_path / "full.h5")
    assert len(rebuilt["observations"]) > 100
    for name, column in sent.items():
        np.testing.assert_array_equal(rebuilt[name], column, err_msg=name)


@pytest.mark.mpi
def test_a_team_acts_on_frame_stacks_its_tables_store_once(tmp_path: Path) -> None:
    """QMIX on simple_spread stacked by hpcmarl (`envs.frames`): the agents act on their last
    2 observations, the tables keep one frame per step, and the team export rebuilds the
    stacks, each the last one shifted by a frame."""
    args = [
        "-m",
        "hpcmarl",
        "jobs/spread_qmix.yaml",
        "replay.stack_num=2",
        "replay.ignore_obs_next=true",
        "commander.max_env_steps=1500",
        "replay.learning_starts=8",
        "topology.collectors=1",
        "checkpoint.interval_s=0",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "(stack_num 2, ignore_obs_next: 0." in result.stdout, result.stdout[-3000:]
    checkpoint, _ = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    shard = checkpoint.path / "replay0.h5"
    with h5py.File(shard) as f:
        (table,) = f["tables"].values()
        assert table["column/observations"].shape[-1] == 18  # one frame of 18, not a stack
        assert table["column/observations_head"].shape[-1] == 18
    out = tmp_path / "team"
    cmd = ["-m", "hpcmarl", "export", str(shard), "--format", "minari", "--team"]
    export = run_local([*cmd, "--out", str(out)], 120)
    assert export.returncode == 0, export.stderr[-3000:]
    with h5py.File(out / "data" / "main_data.hdf5") as f:
        obs = f["episode_0/observations/#0"][()]  # 26 rows: every step's, then the final one
        assert obs.shape == (26, 36)
        np.testing.assert_array_equal(obs[1:, :18], obs[:-1, 18:])
        np.testing.assert_array_equal(obs[0, :18], obs[0, 18:])  # the first frame stands in
