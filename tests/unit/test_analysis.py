"""Offline analysis and export: exact numbers on known episodes, any chunking, clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcmarl.analysis import analyze
from hpcmarl.analysis.cli import analyze_main, export_main
from hpcmarl.analysis.stats import FloatHistogram, IntCounts
from hpcmarl.analysis.synthetic import Truth, write_synthetic_log
from hpcmarl.storage import write_tree_atomic

MULTI = {"agents": ("a", "b", "c"), "policy_of": {"a": "p0", "b": "p1", "c": "p1"}}


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    path = tmp_path_factory.mktemp("single") / "collector0.h5"
    truth, _ = write_synthetic_log(path, fragments=30, num_envs=3)
    return path, truth


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    path = tmp_path_factory.mktemp("multi") / "collector1.h5"
    truth, _ = write_synthetic_log(path, fragments=30, early_finish=True, **MULTI)
    return path, truth


def episodes_of(paths: list[Path], chunk_rows: int = 1 << 16) -> tuple[dict, dict]:
    found: dict[int, tuple[int, list[float]]] = {}

    def sink(source, rec) -> None:
        for i, length, returns in zip(rec.ids, rec.lengths, rec.returns, strict=True):
            assert int(i) not in found
            found[int(i)] = (int(length), returns.tolist())

    return found, analyze(paths, chunk_rows, sink)


def test_known_episodes_give_exactly_their_returns_lengths_and_actions(single) -> None:
    path, truth = single
    found, summary = episodes_of([path])
    assert found == truth.episodes
    returns = [r[0] for _, r in truth.episodes.values()]
    lengths = [n for n, _ in truth.episodes.values()]
    e = summary["episodes"]
    assert e["complete"] == len(truth.episodes) and e["incomplete"] == 3  # one running per copy
    assert (e["return"]["sum"], e["return"]["min"], e["return"]["max"]) == (
        sum(returns), min(returns), max(returns)
    )  # fmt: skip
    assert (e["length"]["sum"], e["length"]["max"]) == (sum(lengths), max(lengths))
    agent = summary["agents"]["agent_0"]
    assert agent["actions"]["counts"] == truth.actions["agent_0"].tolist()
    assert agent["reward"]["sum"] == truth.rewards["agent_0"]
    assert agent["items"] == truth.rows == summary["totals"]["env_steps"]
    assert summary["policies"]["shared"]["version"] == {"min": 0, "max": 29, "distinct": 30}


def test_multi_agent_team_and_per_agent_returns_are_exact(multi) -> None:
    path, truth = multi
    found, summary = episodes_of([path])
    assert found == truth.episodes
    assert summary["totals"]["agents"] == 3 and summary["totals"]["policies"] == 2
    for k, agent in enumerate(MULTI["agents"]):
        expected = sum(r[k] for _, r in truth.episodes.values())
        assert summary["agents"][agent]["return"]["sum"] == expected
        assert summary["agents"][agent]["actions"]["counts"] == truth.actions[agent].tolist()
    team = sum(sum(r) for _, r in truth.episodes.values())
    assert summary["episodes"]["return"]["sum"] == team
    assert summary["policies"]["p1"]["agents"] == ["b", "c"]
    assert summary["policies"]["p1"]["items"] == 2 * truth.rows


@pytest.mark.parametrize("chunk_rows", [1, 5, 97])
def test_chunked_reading_gives_the_same_result_as_one_chunk(multi, chunk_rows: int) -> None:
    path, _ = multi
    whole_episodes, whole = episodes_of([path])
    chunked_episodes, chunked = episodes_of([path], chunk_rows)
    assert chunked_episodes == whole_episodes
    assert json.dumps(chunked, sort_keys=True) == json.dumps(whole, sort_keys=True)


def fragments_of(path: Path, policy_of: dict[str, str], rows: int) -> list[tuple[str, dict]]:
    """The per-policy batches the collector sent, rebuilt from the log (`rows` per agent each)."""
    with h5py.File(path, "r") as f:
        cols = {a: {n: ds[()] for n, ds in f[f"agents/{a}"].items()} for a in policy_of}
    total = len(next(iter(cols.values()))["rewards"])
    out = []
    for start in range(0, total, rows):
        for policy in sorted(set(policy_of.values())):
            members = [a for a in policy_of if policy_of[a] == policy]
            part = {n: [cols[a][n][start : start + rows] for a in members] for n in cols["a"]}
            out.append((policy, {n: np.concatenate(c) for n, c in part.items()}))
    return out


def write_checkpoint(folder: Path, batches: list[tuple[str, dict]], keep: int | None) -> None:
    """Replay shard files as checkpoints hold them: fragments round robin over two shards,
    each table oldest first, with priorities; `keep` rows per table when the ring has cut it."""
    folder.mkdir(parents=True)
    for shard in range(2):
        tables = {}
        mine = [(p, b) for i, (p, b) in enumerate(batches) if i // 2 % 2 == shard]
        for policy in sorted({p for p, _ in mine}):
            cols = {n: np.concatenate([b[n] for p, b in mine if p == policy]) for n in mine[0][1]}
            cols = {n: c[-keep:] if keep else c for n, c in cols.items()}
            n = len(cols["rewards"])
            prio = np.linspace(0.5, 4.0, n)
            tables[policy] = {"column": cols, "insert_ids": np.arange(n), "priorities": prio}
        tree = {"tables": tables, "samples_served": 0}
        write_tree_atomic(folder / f"replay{shard}.h5", tree, "role_state", {"role": "replay0"})


def test_checkpoint_replay_tables_reassemble_episodes_across_shards(multi, tmp_path: Path) -> None:
    path, truth = multi
    folder = tmp_path / "000001"
    write_checkpoint(folder, fragments_of(path, MULTI["policy_of"], 16), keep=None)
    found, summary = episodes_of([folder])
    assert {k: (n, r) for k, (n, r) in found.items()} == truth.episodes
    assert summary["files"][0]["kind"] == "checkpoint"
    assert sorted(summary["agents"]) == ["#0", "#1", "#2"]
    prio = summary["policies"]["p1"]["priority"]
    assert prio["count"] == 2 * truth.rows and (prio["min"], prio["max"]) == (0.5, 4.0)
    assert summary["insertion"] is None


def test_a_ring_buffer_cut_leaves_only_wholly_held_episodes(multi, tmp_path: Path) -> None:
    path, truth = multi
    folder = tmp_path / "000002"
    write_checkpoint(folder, fragments_of(path, MULTI["policy_of"], 16), keep=100)
    found, summary = episodes_of([folder])
    held: dict[int, int] = {}
    with h5py.File(folder / "replay0.h5") as f0, h5py.File(folder / "replay1.h5") as f1:
        for f in (f0, f1):
            for policy in f["tables"]:
                ids, counts = np.unique(
                    f[f"tables/{policy}/column/episode_id"][()], return_counts=True
                )
                for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
                    held[i] = held.get(i, 0) + c
    whole = {i for i, (n, _) in truth.episodes.items() if held.get(i) == 3 * n}
    assert set(found) == whole and all(found[i] == truth.episodes[i] for i in found)
    assert summary["episodes"]["incomplete"] > 0


def export(args: list[str]) -> int:
    return export_main([str(a) for a in args])


def test_d4rl_export_holds_exactly_the_stored_transitions(multi, tmp_path: Path) -> None:
    path, _ = multi
    out = tmp_path / "b.hdf5"
    assert export([path, "--format", "d4rl", "--agent", "b", "--out", out]) == 0
    with h5py.File(path) as src, h5py.File(out) as d4rl:
        g = src["agents/b"]
        for ours, theirs in [("observations", "observations"), ("actions", "actions"),
                             ("rewards", "rewards"), ("next_observations", "next_observations"),
                             ("terminations", "terminals"), ("truncations", "timeouts"),
                             ("episode_id", "infos/episode_id")]:  # fmt: skip
            np.testing.assert_array_equal(d4rl[theirs][()], g[ours][()], err_msg=theirs)


def test_minari_export_holds_each_complete_episode(single, tmp_path: Path) -> None:
    path, truth = single
    out = tmp_path / "minari"
    assert export([path, "--format", "minari", "--out", out]) == 0
    meta = json.loads((out / "data" / "metadata.json").read_text())
    assert meta["total_episodes"] == len(truth.episodes)
    assert meta["total_steps"] == sum(n for n, _ in truth.episodes.values())
    assert json.loads(meta["action_space"])["n"] == 3
    with h5py.File(path) as src, h5py.File(out / "data" / "main_data.hdf5") as f:
        g = {n: ds[()] for n, ds in src["agents/agent_0"].items()}
        assert sorted(f, key=lambda k: int(k.split("_")[1])) == [
            f"episode_{i}" for i in range(len(truth.episodes))
        ]
        for name in f:
            ep = f[name]
            rows = g["episode_id"] == ep.attrs["hpcmarl_episode_id"]
            t = int(rows.sum())
            assert ep.attrs["total_steps"] == t == truth.episodes[ep.attrs["hpcmarl_episode_id"]][0]
            obs = np.concatenate([g["observations"][rows], g["next_observations"][rows][-1:]])
            np.testing.assert_array_equal(ep["observations"][()], obs)
            for column in ("actions", "rewards", "terminations", "truncations"):
                np.testing.assert_array_equal(ep[column][()], g[column][rows])


def test_minari_loads_the_export_and_its_episodes_are_the_replay_files(
    single, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real `minari` package reads the folder: `load_dataset` by its id under
    MINARI_DATASETS_PATH, every episode iterated and compared with the replay file's rows."""
    import minari

    path, truth = single
    exported = tmp_path / "exported"
    assert export([path, "--format", "minari", "--out", exported]) == 0
    dataset_id = json.loads((exported / "data" / "metadata.json").read_text())["dataset_id"]
    root = tmp_path / "datasets"
    (root / dataset_id).parent.mkdir(parents=True)
    exported.rename(root / dataset_id)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    dataset = minari.load_dataset(dataset_id)
    assert dataset.total_episodes == len(truth.episodes)
    assert dataset.total_steps == sum(n for n, _ in truth.episodes.values())
    assert dataset.action_space.n == 3 and dataset.observation_space.shape == (3,)
    with h5py.File(path) as src, h5py.File(root / dataset_id / "data" / "main_data.hdf5") as f:
        rows_of = {n: ds[()] for n, ds in src["agents/agent_0"].items()}
        hpcmarl_id = {int(k.split("_")[1]): int(f[k].attrs["hpcmarl_episode_id"]) for k in f}
    seen = 0
    for episode in dataset.iterate_episodes():
        rows = rows_of["episode_id"] == hpcmarl_id[episode.id]
        obs = np.concatenate(
            [rows_of["observations"][rows], rows_of["next_observations"][rows][-1:]]
        )
        np.testing.assert_array_equal(episode.observations, obs)
        for column in ("actions", "rewards", "terminations", "truncations"):
            np.testing.assert_array_equal(getattr(episode, column), rows_of[column][rows])
        seen += 1
    assert seen == len(truth.episodes)


def test_minari_export_ends_an_agent_episode_at_its_first_done(multi, tmp_path: Path) -> None:
    """Agent c may finish before its team: its episode is complete at its own first done, and
    the padding rows after it are not transitions."""
    path, _ = multi
    out = tmp_path / "minari-c"
    assert export([path, "--format", "minari", "--agent", "c", "--out", out]) == 0
    with h5py.File(path) as src:
        g = {n: src[f"agents/c/{n}"][()] for n in ("episode_id", "terminations", "rewards")}
    done_ids = set(g["episode_id"][g["terminations"]].tolist())
    with h5py.File(out / "data" / "main_data.hdf5") as f:
        assert {int(ep.attrs["hpcmarl_episode_id"]) for ep in f.values()} == done_ids
        for ep in f.values():
            done = ep["terminations"][()] | ep["truncations"][()]
            assert done[-1] and not done[:-1].any()
            assert ep["observations"].shape[0] == ep["rewards"].shape[0] + 1
            rows = g["episode_id"] == ep.attrs["hpcmarl_episode_id"]
            t = int(ep.attrs["total_steps"])
            np.testing.assert_array_equal(ep["rewards"][()], g["rewards"][rows][:t])
            assert not g["rewards"][rows][t:].any()  # the padding left out


def test_minari_export_reassembles_episodes_split_over_checkpoint_shards(
    multi, tmp_path: Path
) -> None:
    path, truth = multi
    folder = tmp_path / "000003"
    write_checkpoint(folder, fragments_of(path, MULTI["policy_of"], 16), keep=None)
    out = tmp_path / "minari-shards"
    assert export([folder, "--format", "minari", "--agent", "0", "--out", out]) == 0
    with h5py.File(path) as src, h5py.File(out / "data" / "main_data.hdf5") as f:
        g = {n: src[f"agents/a/{n}"][()] for n in ("episode_id", "rewards", "actions")}
        assert len(f) == len(truth.episodes)
        for ep in f.values():
            rows = g["episode_id"] == ep.attrs["hpcmarl_episode_id"]
            np.testing.assert_array_equal(ep["rewards"][()], g["rewards"][rows])
            np.testing.assert_array_equal(ep["actions"][()], g["actions"][rows])


def test_minari_team_export_holds_every_agents_data_per_env_episode(
    multi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--team`: one Minari episode per env episode, every agent's data in Dict fields, read
    back by the real `minari` package. Agent c may finish first: its steps after its done are
    padding, marked inactive, worth 0."""
    import minari

    path, truth = multi
    exported = tmp_path / "team"
    assert export([path, "--format", "minari", "--team", "--out", exported]) == 0
    meta = json.loads((exported / "data" / "metadata.json").read_text())
    assert meta["total_episodes"] == len(truth.episodes)
    assert meta["total_steps"] == sum(n for n, _ in truth.episodes.values())
    root = tmp_path / "datasets"
    (root / meta["dataset_id"]).parent.mkdir(parents=True)
    exported.rename(root / meta["dataset_id"])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    dataset = minari.load_dataset(meta["dataset_id"])
    assert set(dataset.observation_space.spaces) == {"a", "b", "c"}
    with (
        h5py.File(path) as src,
        h5py.File(root / meta["dataset_id"] / "data" / "main_data.hdf5") as f,
    ):
        stored = {a: {n: ds[()] for n, ds in src[f"agents/{a}"].items()} for a in "abc"}
        hpcmarl_id = {int(k.split("_")[1]): int(f[k].attrs["hpcmarl_episode_id"]) for k in f}
        active = {int(k.split("_")[1]): {a: f[k]["infos/active"][a][()] for a in "abc"} for k in f}
    seen = 0
    for episode in dataset.iterate_episodes():
        length, returns = truth.episodes[hpcmarl_id[episode.id]]
        assert len(episode.rewards) == length
        team = np.zeros(length)
        for k, agent in enumerate("abc"):
            g = stored[agent]
            rows = np.flatnonzero(g["episode_id"] == hpcmarl_id[episode.id])
            done = g["terminations"][rows] | g["truncations"][rows]
            mine = rows[: int(np.argmax(done)) + 1]  # up to the agent's first done
            t = len(mine)
            assert active[episode.id][agent].tolist() == [True] * t + [False] * (length - t)
            obs = np.concatenate([g["observations"][mine], g["next_observations"][mine][-1:]])
            np.testing.assert_array_equal(episode.observations[agent][: t + 1], obs)
            assert (episode.observations[agent][t + 1 :] == obs[-1]).all()
            np.testing.assert_array_equal(episode.actions[agent][:t], g["actions"][mine])
            own = episode.infos["rewards"][agent]
            np.testing.assert_array_equal(own[:t], g["rewards"][mine])
            assert not own[t:].any()
            assert own.sum() == pytest.approx(returns[k], rel=1e-5)
            team += own
        np.testing.assert_allclose(episode.rewards, team, rtol=1e-6)
        ended = episode.terminations | episode.truncations
        assert ended[-1] and not ended[:-1].any()
        seen += 1
    assert seen == len(truth.episodes)


def test_team_export_is_minari_only_and_for_every_agent(multi, tmp_path: Path) -> None:
    path, _ = multi
    result = run_cli("export", path, "--format", "d4rl", "--team", "--out", tmp_path / "x.h5")
    assert_clear_error(result, "--team", "--format minari")
    result = run_cli("export", path, "--format", "minari", "--team", "--agent", "a")
    assert_clear_error(result, "--team", "without --agent")


def run_cli(*args: object) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hpcmarl.analysis.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def assert_clear_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcmarl: error: "), result.stderr
    assert "; fix: " in lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def test_multi_agent_export_needs_an_agent_and_names_them(multi, tmp_path: Path) -> None:
    path, _ = multi
    result = run_cli("export", path, "--format", "d4rl", "--out", tmp_path / "x.hdf5")
    assert_clear_error(result, "3 agents: a, b, c", "--agent")
    result = run_cli("export", path, "--format", "minari", "--agent", "zz")
    assert_clear_error(result, "no agent 'zz'", "['a', 'b', 'c']")


def damaged_files(single_path: Path, folder: Path) -> dict[str, Path]:
    truncated = folder / "truncated.h5"
    data = single_path.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    noise = folder / "noise.h5"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    foreign = folder / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.arange(3)
    missing = folder / "missing.h5"
    shutil.copy(single_path, missing)
    with h5py.File(missing, "r+") as f:
        del f["agents/agent_0/step"]
    flipped = folder / "flipped.h5"
    with h5py.File(single_path) as f:
        offset = f["agents/agent_0/episode_id"].id.get_chunk_info(0).byte_offset
    corrupt = bytearray(data)
    corrupt[offset + 16 : offset + 48] = bytes(32)
    flipped.write_bytes(bytes(corrupt))
    return {
        "truncated": truncated,
        "not an HDF5": noise,
        "not written by hpcmarl": foreign,
        "no step column": missing,
        "fletcher32": flipped,
        "does not exist": folder / "absent.h5",
    }


def test_bad_files_end_with_one_clear_error_and_exit_code_2(single, tmp_path: Path) -> None:
    path, _ = single
    for cause, bad in damaged_files(path, tmp_path).items():
        assert_clear_error(run_cli("analyze", bad, "--out", tmp_path / "out"), cause)


def test_bad_files_in_process_too(single, tmp_path: Path, capsys) -> None:
    path, _ = single
    files = damaged_files(path, tmp_path)
    assert analyze_main([str(files["truncated"]), "--out", str(tmp_path / "o")]) == 2
    assert export_main([str(files["no step column"]), "--format", "d4rl"]) == 2
    assert capsys.readouterr().err.count("hpcmarl: error:") == 2


def test_analyze_writes_report_plots_and_json(multi, tmp_path: Path) -> None:
    path, truth = multi
    result = run_cli("analyze", path, "--out", tmp_path / "report", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["totals"]["episodes_complete"] == len(truth.episodes)
    out = tmp_path / "report"
    report = (out / "report.md").read_text()
    assert "## Per-agent and team returns" in report and "![actions.png]" in report
    assert (out / "returns_over_training.png").read_bytes()[:4] == b"\x89PNG"
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == len(truth.episodes)
    assert summary["insertion"]["transitions_per_s"]


def test_analysis_imports_no_mpi_torch_or_roles() -> None:
    code = (
        "import sys, hpcmarl.analysis.cli, hpcmarl.analysis.export, hpcmarl.analysis.plots;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'mpi4py')"
        " or m.startswith('hpcmarl.roles')]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_float_histogram_bins_hold_their_values() -> None:
    values = np.array([-7.5, -1.0, 0.0, 0.3, 1.0, 1.0, 250.0], np.float32)
    h = FloatHistogram()
    h.add(values)
    lo, hi, counts = h.bins()
    assert counts.sum() == len(values) and np.all(lo[1:] >= hi[:-1])
    for v in values:
        assert np.any((lo <= v) & (v <= hi))
    assert h.quantiles((0.5,))[0] == pytest.approx(0.3, rel=0.1)


def test_int_counts_grow_both_ways() -> None:
    c = IntCounts()
    c.add(np.array([5, 7, 7]))
    c.add(np.array([-2, 9]))
    values, counts = c.values()
    assert values.tolist() == [-2, 5, 7, 9] and counts.tolist() == [1, 1, 2, 1]
