"""Image observations (a uint8 Box) are kept as uint8 from the collector's items to the
replay table, its checkpoint and the replay files, and cast to float32 only at the network's
input on the learner's device; float32 spaces keep the item specs older runs wrote, and a
checkpoint written before (float32 images) resumes into the uint8 tables.

The run is a tiny DQN job with the `cnn` torso on `user_nets`' 12x12x3 image env, in this
process (a few seconds), resumed once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gymnasium
import h5py
import numpy as np
import pytest
import torch

import hpcmarl
from hpcmarl.__main__ import main as hpcmarl_main
from hpcmarl.algos.base import on_device
from hpcmarl.algos.dqn import DQN
from hpcmarl.algos.ppo import PPO
from hpcmarl.algos.r2d2 import R2D2
from hpcmarl.algos.torsos import space_json
from hpcmarl.algos.value_decomposition import ValueDecomposition
from hpcmarl.items.spec import obs_dtype
from hpcmarl.replay.columns import obs_in, transition_columns
from hpcmarl.replay.compact import CompactTable, StorageForm
from hpcmarl.replay.table import ReplayTable
from hpcmarl.storage.replay_log import ReplayLogWriter
from hpcmarl.testing.groups import group_of, job_with

from . import user_nets
from .conftest import TINY
from .test_compact_replay import collect
from .test_replay_log import batch as log_batch
from .test_torsos import SHORT, SMALL_CNN, image_group

WIDTH = math.prod(user_nets.IMAGE_SHAPE)
IMAGES = [
    f"env.id=tests.unit.user_nets:{user_nets.IMAGE_ENV}",
    "learner.model.torso=cnn",
    f"learner.model.kwargs={SMALL_CNN}",
    "replay_log.enabled=true",
    *SHORT,
]
CARTPOLE_COLUMNS = [
    ["observations", "<f4", [4], "agent"],
    ["actions", "<i8", [], "agent"],
    ["rewards", "<f4", [], "agent"],
    ["next_observations", "<f4", [4], "agent"],
    ["terminations", "|b1", [], "agent"],
    ["truncations", "|b1", [], "agent"],
    ["agent_id", "<i2", [], "agent"],
    ["episode_id", "<i8", [], "group"],
    ["step", "<i4", [], "group"],
    ["policy_version", "<i8", [], "agent"],
]
"""DQN's transition columns for CartPole as runs before uint8 storage wrote them."""


def replay_columns(run_dir: Path) -> dict[str, np.ndarray]:
    """The replay table's columns in the run's newest checkpoint, read into memory."""
    with h5py.File(run_dir / "checkpoints" / "latest" / "replay0.h5", "r") as f:
        group = f["tables/shared/column"]
        return {name: group[name][()] for name in group}


def row_bytes(columns: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes // len(a) for a in columns.values())


def test_dqn_keeps_images_as_uint8_in_its_table_checkpoint_and_replay_file(
    tmp_path: Path,
) -> None:
    trained = hpcmarl.train(TINY, IMAGES, run_dir=tmp_path / "run")
    assert trained.final["updates"] >= 20
    table = replay_columns(trained.run_dir)
    for name in ("observations", "next_observations"):
        assert table[name].dtype == np.uint8 and table[name].shape[1:] == (WIDTH,)
    assert table["observations"].max() == 255  # the env's bright square, not scaled
    columns = transition_columns(WIDTH)  # as float32 rows, the storage before
    as_float = sum(np.dtype(c.dtype).itemsize * math.prod(c.shape) for c in columns)
    assert row_bytes(table) == 900 and as_float == 3492  # 2 x 432 pixels + 36 B of bookkeeping
    with h5py.File(trained.run_dir / "replay" / "collector0.h5", "r") as f:
        assert f["agents/agent_0/observations"].dtype == np.uint8
        space = json.loads(f.attrs["observation_spaces"])["agent_0"]
        assert space == {"type": "Box", "dtype": "uint8", "shape": [WIDTH], "low": 0, "high": 255}
    out = tmp_path / "minari"
    log = trained.run_dir / "replay" / "collector0.h5"
    assert hpcmarl_main(["export", str(log), "--format", "minari", "--out", str(out)]) == 0
    with h5py.File(out / "data" / "main_data.hdf5", "r") as f:
        assert json.loads(f.attrs["observation_space"])["dtype"] == "uint8"
        assert f["episode_0/observations"].dtype == np.uint8

    resumed = hpcmarl.train(TINY, [*IMAGES, "commander.max_updates=30"], trained.run_dir)
    assert resumed.final["updates"] >= 30
    again = replay_columns(trained.run_dir)
    assert again["observations"].dtype == np.uint8 and len(again["step"]) > len(table["step"])


def test_float_spaces_keep_their_specs_and_image_spaces_get_uint8_items() -> None:
    job = job_with(hidden_sizes=[8])
    box = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    cartpole = group_of(4, 2)
    cartpole = type(cartpole)(**{**vars(cartpole), "obs_spaces": {"a0": space_json(box, 4)}})
    assert json.loads(DQN.item_spec(cartpole, job).to_json())["columns"] == CARTPOLE_COLUMNS
    assert DQN.item_spec(group_of(4, 2), job) == DQN.item_spec(cartpole, job)
    images = image_group(agents=2)
    for algo in (DQN, PPO, ValueDecomposition, R2D2):
        spec = algo.item_spec(images, job)
        assert spec.column("observations").dtype == "|u1", algo
        assert algo.item_spec(cartpole, job).column("observations").dtype == "<f4", algo
    image = images.obs_spaces["a0"]
    assert obs_dtype([image, image]) == "|u1"
    assert obs_dtype([image, space_json(box, 4)]) == "<f4"  # one group, one dtype
    assert obs_dtype([None]) == obs_dtype([]) == "<f4"


def test_uint8_rows_reach_the_network_as_float32_of_the_same_values() -> None:
    pixels = np.arange(256, dtype=np.uint8).reshape(4, 64)
    moved = on_device(pixels, torch.device("cpu"))
    assert moved.dtype == torch.float32 and torch.equal(moved, torch.arange(256.0).reshape(4, 64))
    floats = np.ones((3, 2), np.float32)
    kept = on_device(floats, torch.device("cpu"))
    assert kept.dtype == torch.float32 and kept.data_ptr() == floats.ctypes.data  # no copy
    assert on_device(pixels, None, torch.int64).dtype == torch.int64


def pixels(batch: dict[str, np.ndarray], dtype: type) -> dict[str, np.ndarray]:
    """The batch with its observations made whole values 0-255 (per value, so stacks stay
    stacks), in `dtype`: float32 as runs before uint8 storage sent them, or uint8."""

    def image(v: np.ndarray) -> np.ndarray:
        return (np.floor(np.abs(v) * 60) % 256).astype(dtype)

    return {k: image(v) if "observations" in k else v for k, v in batch.items()}


@pytest.mark.parametrize("form", [StorageForm(), StorageForm(2, ignore_obs_next=True)])
def test_a_float32_checkpoint_of_images_resumes_into_a_uint8_table(form: StorageForm) -> None:
    batches, _ = collect(max(form.stack_num, 1), "reset", seed=3)

    def table() -> Any:
        rows = ReplayTable(150, seed=5)
        return CompactTable(rows, form) if form.compact else rows

    old, resumed = table(), table()
    for batch in batches[:-3]:
        old.insert(pixels(batch, np.float32))
    resumed.load_state(obs_in(old.state(), "|u1"))  # as a shard restores an older checkpoint
    for batch in batches[-3:]:
        old.insert(pixels(batch, np.float32))
        resumed.insert(pixels(batch, np.uint8))
    (want, _), (got, _) = old.sample(64), resumed.sample(64)
    assert got["observations"].dtype == np.uint8 and want["observations"].dtype == np.float32
    for name in want:
        np.testing.assert_array_equal(got[name].astype(want[name].dtype), want[name], name)
    assert obs_in(old.state(), "<f4")["column/observations"].dtype == np.float32


def test_a_replay_file_begun_with_float32_images_goes_on_in_float32(tmp_path: Path) -> None:
    path = tmp_path / "collector0.h5"
    agents = ["a", "b", "c"]
    sent = [pixels(log_batch("p0", 0), np.float32), pixels(log_batch("p0", 1), np.uint8)]
    for dtypes, rows in zip([None, dict.fromkeys(agents, "|u1")], sent, strict=True):
        writer = ReplayLogWriter(
            path,
            agents=agents,
            policy_of=dict.fromkeys(agents, "p0"),
            obs_dims=dict.fromkeys(agents, 3),
            n_actions=dict.fromkeys(agents, 4),
            env_id="Test-v0",
            flush_every=1,
            meta={},
            obs_dtypes=dtypes,  # the run before uint8 storage, then its resume
        )
        writer.append(rows)
        writer.close()
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs["observation_spaces"])["a"]["dtype"] == "float32"
        logged = f["agents/a/observations"][()]
    assert logged.dtype == np.float32
    want = [rows["observations"][rows["agent_id"] == 0] for rows in sent]
    np.testing.assert_array_equal(logged, np.concatenate(want).astype(np.float32))
