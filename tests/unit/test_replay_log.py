"""The replay log writer: exact round trip, self-describing layout, kill safety, resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcmarl.storage import StorageError
from hpcmarl.storage.replay_log import ReplayLogWriter

AGENTS = ["a", "b", "c"]
POLICY_OF = {"a": "p0", "b": "p1", "c": "p1"}
H5DUMP = Path("/usr/bin/h5dump")


def make_writer(path: Path, flush_every: int = 2, agents: list[str] = AGENTS) -> ReplayLogWriter:
    return ReplayLogWriter(
        path,
        agents=agents,
        policy_of={a: POLICY_OF.get(a, "p0") for a in agents},
        obs_dims=dict.fromkeys(agents, 3),
        n_actions=dict.fromkeys(agents, 4),
        env_id="Test-v0",
        flush_every=flush_every,
        meta={"job": "test", "seed": 7},
    )


def batch(policy: str, fragment: int, rows_per_agent: int = 6) -> dict[str, np.ndarray]:
    """A fragment's batch of one policy: rows ordered by agent, as the collector sends them."""
    members = [k for k, a in enumerate(AGENTS) if POLICY_OF[a] == policy]
    n = rows_per_agent * len(members)
    rng = np.random.default_rng(fragment * 10 + len(policy))
    return {
        "observations": rng.standard_normal((n, 3)).astype("<f4"),
        "actions": rng.integers(0, 4, n),
        "rewards": rng.standard_normal(n).astype("<f4"),
        "next_observations": rng.standard_normal((n, 3)).astype("<f4"),
        "terminations": rng.random(n) < 0.2,
        "truncations": np.zeros(n, bool),
        "agent_id": np.repeat(members, rows_per_agent).astype("<i2"),
        "episode_id": np.full(n, fragment, "<i8"),
        "step": np.tile(np.arange(rows_per_agent), len(members)).astype("<i4"),
        "policy_version": np.full(n, fragment, "<i8"),
    }


def agent_rows(batches: list[dict[str, np.ndarray]], k: int) -> dict[str, np.ndarray]:
    keep = [{n: c[b["agent_id"] == k] for n, c in b.items()} for b in batches]
    return {n: np.concatenate([b[n] for b in keep]) for n in keep[0]}


def write_fragments(writer: ReplayLogWriter, fragments: range) -> list[dict[str, np.ndarray]]:
    sent = []
    for f in fragments:
        for policy in ("p0", "p1"):
            b = batch(policy, f)
            writer.append(b)
            sent.append(b)
        writer.end_fragment()
    return sent


def test_round_trip_holds_every_row_of_every_agent_exactly(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    writer = make_writer(path)
    sent = write_fragments(writer, range(5))
    writer.close()
    with h5py.File(path, "r") as f:
        for k, agent in enumerate(AGENTS):
            group, expected = f[f"agents/{agent}"], agent_rows(sent, k)
            assert set(group) == set(expected)
            for name, column in expected.items():
                np.testing.assert_array_equal(group[name][()], column, err_msg=name)
                assert group[name].dtype == column.dtype


def test_layout_is_self_describing_and_portable(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    writer = make_writer(path)
    write_fragments(writer, range(2))
    writer.close()
    with h5py.File(path, "r") as f:
        assert f.attrs["hpcmarl_type"] == "replay_log"
        assert f.attrs["hpcmarl_schema_version"] == 1
        assert json.loads(f.attrs["agents"]) == AGENTS
        assert json.loads(f.attrs["policy_of"]) == POLICY_OF
        assert json.loads(f.attrs["action_spaces"])["b"] == {
            "type": "Discrete", "dtype": "int64", "start": 0, "n": 4
        }  # fmt: skip
        assert json.loads(f.attrs["observation_spaces"])["c"]["shape"] == [3]
        assert f.attrs["env_id"] == "Test-v0"
        assert json.loads(f.attrs["sessions"])[0]["meta"] == {"job": "test", "seed": 7}
        assert f["agents/b"].attrs["policy"] == "p1"
        ds = f["agents/a/observations"]
        assert (ds.compression, ds.shuffle, ds.fletcher32) == ("gzip", True, True)
        assert ds.maxshape == (None, 3) and ds.chunks is not None
        assert f["wallclock/rows"][-1].tolist() == [12, 12, 12]
        assert np.all(np.diff(f["wallclock/time"][()]) >= 0)
        assert f.id.get_access_plist().get_libver_bounds()[0] == h5py.h5f.LIBVER_EARLIEST


@pytest.mark.skipif(not H5DUMP.exists(), reason="h5dump is not installed")
def test_h5dump_reads_the_log(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    writer = make_writer(path)
    sent = write_fragments(writer, range(2))
    writer.close()
    out = subprocess.run(
        [str(H5DUMP), "-d", "/agents/a/episode_id", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "H5T_STD_I64LE" in out.stdout
    n = len(agent_rows(sent, 0)["episode_id"])
    assert f"SIMPLE {{ ( {n} ) / ( H5S_UNLIMITED ) }}" in out.stdout
    assert "(0): 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1" in out.stdout
    header = subprocess.run([str(H5DUMP), "-H", str(path)], capture_output=True, text=True)
    assert header.returncode == 0 and "wallclock" in header.stdout


def test_rows_wait_for_flush_every_fragments(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    writer = make_writer(path, flush_every=2)
    writer.append(batch("p0", 0))
    writer.append(batch("p1", 0))
    writer.end_fragment()
    writer.append(batch("p0", 1))
    writer.append(batch("p1", 1))
    assert rows_on_disk(path) == [0, 0, 0]
    writer.end_fragment()
    assert rows_on_disk(path) == [12, 12, 12]
    writer.close()


def rows_on_disk(path: Path) -> list[int]:
    with h5py.File(path, "r", locking=False) as f:
        groups = [f[f"agents/{a}"] for a in AGENTS]
        return [len(g["rewards"]) if "rewards" in g else 0 for g in groups]


def test_writer_keeps_copies_of_the_rows_it_is_given(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    writer = make_writer(path, flush_every=3, agents=["a"])
    b = {n: c for n, c in batch("p0", 0).items()}
    expected = {n: c.copy() for n, c in b.items()}
    writer.append(b)
    for column in b.values():
        column[...] = 0  # the collector reuses or sends the buffer on
    writer.close()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["agents/a/rewards"][()], expected["rewards"])


def test_misuse_is_refused_with_the_reason(tmp_path: Path) -> None:
    writer = make_writer(tmp_path / "log.h5")
    wrong = batch("p0", 0)
    wrong["agent_id"][:] = 7
    with pytest.raises(ValueError, match="agent ids \\[7\\]"):
        writer.append(wrong)
    short = batch("p0", 0)
    short["rewards"] = short["rewards"][:2]
    with pytest.raises(ValueError, match="rewards"):
        writer.append(short)
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(ValueError, match="after close"):
        writer.append(batch("p0", 0))


KILLED = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from unit.test_replay_log import batch, make_writer
    from pathlib import Path
    writer = make_writer(Path({path!r}), flush_every=2)
    for f in range(5):  # two flushes (fragments 0-3), fragment 4 waits in memory
        writer.append(batch("p0", f))
        writer.append(batch("p1", f))
        writer.end_fragment()
    os._exit(0)  # killed: no close, no atexit, no flush
    """
)


def test_a_writer_killed_without_close_leaves_every_flushed_row_readable(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    tests = str(Path(__file__).resolve().parents[1])
    code = KILLED.format(tests=tests, path=str(path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    sent = [batch(p, f) for f in range(4) for p in ("p0", "p1")]
    with h5py.File(path, "r") as f:
        for k, agent in enumerate(AGENTS):
            got = f[f"agents/{agent}/episode_id"][()]
            np.testing.assert_array_equal(got, agent_rows(sent, k)["episode_id"])
        assert len(f["wallclock/time"]) == 8


def test_a_resumed_run_appends_to_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    first = make_writer(path)
    sent = write_fragments(first, range(2))
    first.close()
    second = make_writer(path)
    sent += write_fragments(second, range(2, 4))
    second.close()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["agents/c/rewards"][()], agent_rows(sent, 2)["rewards"])
        assert len(json.loads(f.attrs["sessions"])) == 2
        assert f["wallclock/rows"][-1].tolist() == [24, 24, 24]


def test_a_log_of_another_job_is_not_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "log.h5"
    make_writer(path, agents=["a"]).close()
    with pytest.raises(StorageError, match="another job"):
        make_writer(path)


def test_a_damaged_log_is_moved_aside_and_a_new_one_started(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "log.h5"
    writer = make_writer(path)
    write_fragments(writer, range(2))
    writer.close()
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 3)
    keep = tmp_path / "copy.h5"
    shutil.copy(path, keep)
    make_writer(path).close()
    assert "moved it to" in capsys.readouterr().err
    aside = [p for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == keep.read_bytes()
    assert rows_on_disk(path) == [0, 0, 0]
