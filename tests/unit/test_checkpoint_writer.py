"""Checkpoints written beside the role's loop: large arrays written part by part and without
gzip, snapshots safe from what the role does next, a writer thread whose errors reach the role,
and a replay shard that defers inserts (but not its collectors) while its tables are written."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcmarl.comm.protocol import Message
from hpcmarl.config.loader import load_job
from hpcmarl.launch import memory, run
from hpcmarl.launch.build import build_replay_shard, item_specs
from hpcmarl.launch.signal_lead import lead_warning, measure_write_rate
from hpcmarl.replay.table import ReplayTable
from hpcmarl.roles.state_tree import flatten
from hpcmarl.storage.checkpoint import role_file
from hpcmarl.storage.hdf5 import COMPRESS_BELOW, Pieces, read_tree, write_tree_atomic
from hpcmarl.storage.writer import TRUSTED_BYTES, CheckpointWriter, snapshot, tree_nbytes
from hpcmarl.testing.world import OneRank


def test_pieces_are_written_as_one_array(tmp_path: Path) -> None:
    rows = COMPRESS_BELOW // 64 + 123  # over the threshold: written in parts, uncompressed
    whole = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    small = np.arange(10, dtype=np.int64)
    tree = {
        "big": Pieces((whole[1000:], whole[:1000])),
        "small": Pieces((small[5:], small[:5])),
        "plain_big": whole,
    }
    path = tmp_path / "t.h5"
    write_tree_atomic(path, tree, "test")
    back = read_tree(path, "test")
    np.testing.assert_array_equal(back["big"], np.concatenate([whole[1000:], whole[:1000]]))
    np.testing.assert_array_equal(back["small"], np.concatenate([small[5:], small[:5]]))
    np.testing.assert_array_equal(back["plain_big"], whole)
    with h5py.File(path) as f:
        for key in ("big", "plain_big"):
            assert f[key].compression is None and f[key].fletcher32  # checksummed, not gzipped
        assert f["small"].compression == "gzip" and f["small"].fletcher32
    assert tree_nbytes(tree) == 2 * whole.nbytes + small.nbytes


def test_a_snapshot_copies_what_the_role_may_still_change() -> None:
    live = np.zeros(4)
    view = np.zeros(TRUSTED_BYTES // 8 + 8)[:-8]  # large but not its own memory
    owned = np.zeros(TRUSTED_BYTES // 8)  # large and owned: a table's fresh gather
    pieces = Pieces((live,))
    tree = {"a": live, "nested": {"v": view, "o": owned, "p": pieces, "l": [live]}, "n": 3}
    snap = snapshot(tree)
    live[:] = 1
    view[:] = 1
    assert (
        not snap["a"].any() and not snap["nested"]["v"].any() and not snap["nested"]["l"][0].any()
    )
    assert snap["nested"]["o"] is owned and snap["nested"]["p"] is pieces and snap["n"] == 3


def test_the_writer_reports_its_record_or_raises_its_error(tmp_path: Path) -> None:
    tree = {"x": np.arange(5)}
    writer = CheckpointWriter(tmp_path, "000001", "replay0", tree)
    record = writer.result()
    assert writer.done() and record.size == role_file(tmp_path, "000001", "replay0").stat().st_size
    bad = CheckpointWriter(tmp_path, "000003", "replay0", {"x": np.array(["text"])})
    with pytest.raises(TypeError, match="not numeric"):
        bad.result()


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_table_state_as_views_equals_its_copy(prioritized: bool) -> None:
    table = ReplayTable(100, prioritized=prioritized, seed=1)
    for start in range(0, 250, 30):  # wraps around the ring twice
        n = np.arange(start, start + 30)
        table.insert({"obs": np.stack([n, -n], 1).astype(np.float32), "rewards": n * 1.0})
    copy, views = table.state(), table.state(views=True)
    assert copy.keys() == views.keys()
    for key, value in views.items():
        joined = np.concatenate(value.parts) if isinstance(value, Pieces) else value
        np.testing.assert_array_equal(joined, copy[key])


def shard_world(tmp_path: Path):
    cfg = load_job("jobs/cartpole_dqn.yaml", ["replay.learning_starts=1"])
    world = OneRank(cfg)
    spec, transport = world.spec, world.transport
    shard = build_replay_shard(cfg, spec, world.topology, transport, "replay0")
    (group,) = item_specs(cfg, spec)
    items = item_specs(cfg, spec)[group]

    def batch(value: float, n: int = 8) -> dict[str, np.ndarray]:
        out = {c.name: np.zeros((n, *items.item_shape(c)), c.dtype) for c in items.columns}
        out["rewards"][:] = value
        return out

    return shard, transport, group, batch


def test_a_shard_defers_inserts_while_its_tables_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard, transport, group, batch = shard_world(tmp_path)
    commander: deque[Message] = transport.register("commander")
    collector: deque[Message] = transport.register("collector0")

    def send_batch(value: float) -> None:
        meta = {"group": group, "items": 8}
        transport.send(Message("batch", "collector0", "replay0", meta, batch(value)))
        shard.poll()

    send_batch(1.0)
    at_cut = flatten(shard.tables[group].state())
    monkeypatch.setenv("HPCMARL_FAULT_WRITE_DELAY", "replay0:0.5")
    expect = {"replay0": {"collector0": 1}}
    meta = {"id": "000001", "run_dir": str(tmp_path), "expect": expect}
    transport.send(Message("checkpoint", "commander", "replay0", meta))
    shard.poll()
    assert shard.writing and [m.kind for m in commander if m.kind == "snapshotted"]
    send_batch(2.0)  # during the write: credited at once, inserted later
    credits = [m for m in collector if m.kind == "credit"]
    assert len(credits) == 2 and shard.tables[group].size == 8
    shard.checkpoint_writer.result()
    shard.poll()  # reports the file
    shard.poll()  # inserts what waited
    kinds = [m.kind for m in commander if m.kind in ("snapshotted", "checkpointed")]
    assert kinds == ["snapshotted", "checkpointed"] and not shard.writing
    assert shard.tables[group].size == 16  # the deferred batch is in now
    assert len([m for m in collector if m.kind == "credit"]) == 2  # and was not credited twice
    saved = read_tree(role_file(tmp_path, "000001", "replay0"), "role_state")
    table = flatten(saved["tables"][group])
    assert table.keys() == at_cut.keys()
    for key, value in at_cut.items():
        np.testing.assert_array_equal(table[key], value)


def test_a_too_short_slurm_warning_is_named_with_the_lead_it_needs(tmp_path: Path) -> None:
    assert lead_warning(120, 10 << 20, 100e6) is None  # 0.1 s of writing
    line = lead_warning(120, 8_000_000_000, 100e6)  # 80 s at 100 MB/s
    assert line is not None
    assert "8.00 GB" in line and "about 80 s" in line and "--signal=B:USR1@135" in line
    assert "replay.table_capacity" in line
    assert measure_write_rate(tmp_path, 1 << 20) > 0 and not list(tmp_path.iterdir())


def test_the_start_up_names_a_slurm_warning_too_short_for_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def start_up(lead: str, run_dir: Path) -> list[str]:
        monkeypatch.setenv("HPCMARL_SIGNAL_LEAD_S", lead)
        status, _ = run.plan_on_rank0(None, [f"runtime.run_dir={run_dir}"], [memory.this_node()])
        assert status == "ok"
        return [x for x in capsys.readouterr().out.splitlines() if "hpcmarl: warning: " in x]

    (line,) = start_up("5", tmp_path / "short")  # less than the 15 s to quiesce and stop
    assert line.startswith("hpcmarl: warning: Slurm warns 5 s before the time limit")
    assert "MB/s measured in the run directory" in line and "--signal=B:USR1@" in line
    assert start_up("120", tmp_path / "enough") == []


def test_a_write_delay_with_a_count_slows_only_that_many_checkpoints_of_each_role(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpcmarl.testing import faults

    monkeypatch.setattr(faults, "_delayed_writes", {})
    monkeypatch.setenv("HPCMARL_FAULT_WRITE_DELAY", "replay_shard:2.5:1")
    assert faults.write_delay("replay_shard", "replay0") == 2.5
    assert faults.write_delay("replay_shard", "replay1") == 2.5  # its own first checkpoint
    assert faults.write_delay("replay_shard", "replay0") == 0.0
    assert faults.write_delay("learner", "learner0") == 0.0
    monkeypatch.setenv("HPCMARL_FAULT_WRITE_DELAY", "replay0:1.5")
    assert [faults.write_delay("replay_shard", "replay0") for _ in range(3)] == [1.5] * 3
