"""A real run writes replay logs; `analyze` recomputes from them the episodes the run reported.

The commander writes one `episode` row per finished training episode to metrics.jsonl (team
return, length, id). The replay logs hold every transition the collectors produced, so each of
those episodes must be found complete in the logs with exactly that return and length.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from .conftest import run_local, run_mpi

SHORT_RUN = [
    "-m",
    "hpcmarl",
    "commander.max_env_steps=3000",
    "commander.stop_value=null",
    "topology.collectors=2",
    "replay_log.enabled=true",
]


def reported_episodes(run_dir: Path) -> dict[tuple[str, int], tuple[float, int]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        (r["collector"], r["episode_id"]): (r["return"], r["length"])
        for r in rows
        if r["kind"] == "episode"
    }


def analyzed_episodes(run_dir: Path) -> tuple[dict, dict]:
    result = run_local(
        ["-m", "hpcmarl.analysis.cli", "analyze", str(run_dir), "--json", "--no-plots"], 120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (run_dir / "analysis" / "episodes.jsonl").read_text().splitlines()
    found = {}
    for row in map(json.loads, lines):
        collector = Path(row["source"]).stem
        found[(collector, row["episode_id"])] = (row["return"], row["length"])
    return found, json.loads(result.stdout)


def check_run(run_dir: Path) -> None:
    logs = sorted(p.name for p in (run_dir / "replay").glob("*.h5"))
    assert logs == ["collector0.h5", "collector1.h5"]
    reported = reported_episodes(run_dir)
    found, summary = analyzed_episodes(run_dir)
    assert len(reported) > 50
    # every reported episode was collected in fragments the logs hold, and closed files hold all
    missing = reported.keys() - found.keys()
    assert not missing, sorted(missing)[:10]
    assert {k: found[k] for k in reported} == reported
    assert summary["totals"]["env_steps"] >= 3000
    assert summary["agents"]["agent_0"]["actions"]["values"] == [0, 1]


def test_analysis_recomputes_the_reported_episodes_of_a_one_process_run(tmp_path: Path) -> None:
    result = run_local([*SHORT_RUN, f"runtime.run_dir={tmp_path}"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_run(tmp_path)


@pytest.mark.mpi
def test_analysis_recomputes_the_reported_episodes_of_an_mpi_run(tmp_path: Path) -> None:
    result = run_mpi(5, [*SHORT_RUN, f"runtime.run_dir={tmp_path}"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_run(tmp_path)


TEAM_RUNS = {
    "qmix-episodes": ["jobs/spread_qmix.yaml", "env.num_envs=2", "learner.batch_size=4"],
    "r2d2-sequences": [
        "jobs/cartpole_novel_r2d2.yaml",
        "env.num_envs=2",
        "learner.batch_size=4",
        "replay.sequence_length=8",
        "replay.burn_in=2",
        "replay.sequence_overlap=4",
    ],
}


@pytest.mark.parametrize("job", list(TEAM_RUNS))
def test_analysis_reads_episode_and_sequence_tables_as_the_steps_they_hold(
    tmp_path: Path, job: str
) -> None:
    """Without replay logs, `analyze` reads the checkpoint's joint items: every episode it
    finds there is one the run reported, with the same return and length (overlapping
    sequences read once), and `export` writes an agent's episodes of them."""
    args = [
        "-m",
        "hpcmarl",
        *TEAM_RUNS[job],
        "commander.max_env_steps=1500",
        "commander.stop_value=null",
        "replay.learning_starts=8",
        "topology.collectors=1",
        "topology.replay_shards=2",
        "replay_log.enabled=false",
        "checkpoint.interval_s=0",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reported = {ids: v for (_, ids), v in reported_episodes(tmp_path).items()}
    found, summary = analyzed_episodes(tmp_path)
    found = {ids: v for (_, ids), v in found.items()}
    assert len(found) > 20 and len(found) >= 0.8 * len(reported)
    for episode, (ret, length) in found.items():  # rewards are stored as float32
        assert (pytest.approx(reported[episode][0], rel=1e-5), reported[episode][1]) == (
            ret,
            length,
        )
    shard = tmp_path / "checkpoints" / "000001" / "replay0.h5"
    out = tmp_path / "exported"
    export = run_local(
        [
            "-m",
            "hpcmarl",
            "export",
            str(shard),
            "--format",
            "minari",
            "--agent",
            "0",
            "--out",
            str(out),
        ],
        120,
    )
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads(export.stdout.splitlines()[-1])["episodes"] > 5
    if job != "qmix-episodes":
        return
    # The team's episodes, every agent's data in one Minari episode per env episode.
    team_out = tmp_path / "team"
    cmd = ["-m", "hpcmarl", "export", str(shard), "--format", "minari", "--team"]
    team = run_local([*cmd, "--out", str(team_out)], 120)
    assert team.returncode == 0, team.stderr[-3000:]
    written = json.loads(team.stdout.splitlines()[-1])
    assert written["episodes"] > 5 and written["steps"] == 25 * written["episodes"]
    with h5py.File(team_out / "data" / "main_data.hdf5") as f:
        episode = f["episode_0"]
        assert sorted(episode["observations"]) == ["#0", "#1", "#2"]  # a checkpoint's labels
        per_agent = sum(episode["infos/rewards"][a][()] for a in episode["infos/rewards"])
        np.testing.assert_allclose(episode["rewards"][()], per_agent, rtol=1e-6)
