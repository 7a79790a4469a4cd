"""Checkpoint and resume end to end: counters continue, state comes back bit for bit, a signal
checkpoints and exits 75, a killed job resumes from its newest complete checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from hpcmarl.storage.checkpoint import latest_checkpoint, latest_pointer
from hpcmarl.storage.hdf5 import read_tree
from hpcmarl.testing.ranks import rank_pids

from ..mpi.conftest import BackgroundJob, progress_rows, run_local

SMALL = [
    "commander.stop_value=null",
    "topology.collectors=3",
    "replay.learning_starts=200",
    "checkpoint.interval_s=0",
]


def last_line(output: str) -> str:
    return [x for x in output.splitlines() if x.startswith("hpcmarl: finished")][-1]


def manifest(run_dir: Path, ckpt: str) -> dict:
    return json.loads((run_dir / "checkpoints" / ckpt / "manifest.json").read_text())


def leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}/"))
        elif isinstance(value, np.ndarray):
            out[prefix + key] = value
    return out


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short run in one process that ended on its step budget with checkpoint 000001,
    made once for the module: each test continues its own copy (`copy_of`), so the same
    first run is not trained again for every resume checked here."""
    run_dir = tmp_path_factory.mktemp("small_run")
    args = ["-m", "hpcmarl", *SMALL, "commander.max_env_steps=3000", f"runtime.run_dir={run_dir}"]
    first = run_local(args, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "checkpoint 000001" in last_line(first.stdout)
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a run directory to resume on its own (resume takes the run directory from
    its command line, not from the copied config.yaml)."""
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def test_resume_continues_counters_and_appends_metrics(small_run: Path, tmp_path: Path) -> None:
    run_dir = copy_of(small_run, tmp_path)
    second = run_local(
        ["-m", "hpcmarl", "resume", str(run_dir), "commander.max_env_steps=6000"], timeout=300
    )
    assert second.returncode == 0, second.stderr[-3000:]
    saved = manifest(run_dir, "000001")["info"]["counters"]["env_steps"]
    assert f"hpcmarl: resumed from checkpoint 000001 at {saved} env steps" in second.stdout
    assert "checkpoint 000002" in last_line(second.stdout)
    counters = manifest(run_dir, "000002")["info"]["counters"]
    assert counters["env_steps"] >= 6000
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert sum(json.loads(r)["kind"] == "finished" for r in rows) == 2


def test_resumed_state_is_bitwise_the_checkpoint(small_run: Path, tmp_path: Path) -> None:
    run_dir = copy_of(small_run, tmp_path)
    # Resuming at the step budget stops at once and checkpoints again, before any new work.
    again = run_local(["-m", "hpcmarl", "resume", str(run_dir)], timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    one, two = run_dir / "checkpoints" / "000001", run_dir / "checkpoints" / "000002"
    for role in ("replay0", "replay1", "learner0"):
        before, after = leaves(read_tree(one / f"{role}.h5")), leaves(read_tree(two / f"{role}.h5"))
        assert before.keys() == after.keys()
        for key in before:
            assert np.array_equal(before[key], after[key]), f"{role}: {key} changed"
    ps_before = leaves(read_tree(one / "ps0.h5"))
    ps_after = leaves(read_tree(two / "ps0.h5"))
    weights = [k for k in ps_before if k.endswith("weights")]
    assert weights and all(np.array_equal(ps_before[k], ps_after[k]) for k in weights)


def test_a_foreign_run_directory_is_refused(small_run: Path, tmp_path: Path) -> None:
    run_dir = copy_of(small_run, tmp_path)
    args = ["-m", "hpcmarl", *SMALL, "commander.max_env_steps=3000", f"runtime.run_dir={run_dir}"]
    other = run_local([*args, "learner.lr=0.01"], timeout=120)
    assert other.returncode == 2
    assert "holds checkpoints of another job" in other.stderr and "Traceback" not in other.stderr


@pytest.mark.mpi
def test_sigusr1_checkpoints_and_exits_75_then_resume_finishes(tmp_path: Path) -> None:
    job = BackgroundJob(
        4, [*SMALL, "commander.max_env_steps=200000", f"runtime.run_dir={tmp_path}"]
    )
    job.wait_for(progress_rows(tmp_path, 2), 120, "two progress rows")
    job.signal(signal.SIGUSR1)
    out, err = job.finish(120, "it did not stop after SIGUSR1")
    assert job.returncode == 75, err[-3000:]
    assert "checkpointed at the time limit" in last_line(out)
    done = run_local(
        ["-m", "hpcmarl", "resume", str(tmp_path), "commander.max_env_steps=1"], timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from checkpoint" in done.stdout


@pytest.mark.mpi
def test_kill_9_of_a_replay_rank_ends_the_job_and_resume_restores_replay(tmp_path: Path) -> None:
    args = [*SMALL, "checkpoint.every_updates=400", "commander.max_env_steps=200000"]
    job = BackgroundJob(16, [*args, f"runtime.run_dir={tmp_path}"])
    latest = tmp_path / "checkpoints" / "latest"
    job.wait_for(latest.exists, 180, "a checkpoint")
    replay_rank = 2  # the default 16-rank layout: commander, ps0, replay0 on rank 2
    os.kill(rank_pids(tmp_path)[replay_rank], signal.SIGKILL)
    killed = time.monotonic()
    job.finish(60, "after a rank was killed")
    print(f"job ended {time.monotonic() - killed:.1f} s after kill -9 of rank {replay_rank}")
    assert job.returncode != 0
    # The newest complete checkpoint, which the kill may have left without the pointer moved.
    newest_complete, _ = latest_checkpoint(tmp_path)
    assert newest_complete is not None
    saved = newest_complete.id
    budget = manifest(tmp_path, saved)["info"]["counters"]["env_steps"]
    # Resuming at the step budget checkpoints again at once: the replay must be what was saved.
    again = run_local(
        ["-m", "hpcmarl", "resume", str(tmp_path), f"commander.max_env_steps={budget}"], timeout=300
    )
    assert again.returncode == 0, again.stderr[-3000:]
    newest = latest_pointer(tmp_path)
    assert newest != saved
    for role in ("replay0", "replay1"):
        before = leaves(read_tree(tmp_path / "checkpoints" / saved / f"{role}.h5"))
        after = leaves(read_tree(tmp_path / "checkpoints" / newest / f"{role}.h5"))
        assert before.keys() == after.keys()
        assert all(np.array_equal(before[k], after[k]) for k in before), role


def replay_rows(run_dir: Path, ckpt: str) -> list[tuple]:
    """Every stored transition of a checkpoint as (episode_id, step, agent_id), sorted."""
    rows = []
    for path in sorted((run_dir / "checkpoints" / ckpt).glob("replay*.h5")):
        columns = read_tree(path)["tables"]["shared"]["column"]
        rows += list(
            zip(
                columns["episode_id"].tolist(),
                columns["step"].tolist(),
                columns["agent_id"].tolist(),
                strict=True,
            )
        )
    return sorted(rows)


def resume_over_shards(run_dir: Path, shards: int, budget: int) -> None:
    """Resume at the step budget: it checkpoints again at once, the tables dealt over
    `shards` new shards."""
    args = ["resume", str(run_dir), f"topology.replay_shards={shards}"]
    again = run_local(["-m", "hpcmarl", *args, f"commander.max_env_steps={budget}"], timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.parametrize("shards", [1, 3])
def test_resume_with_another_shard_count_keeps_every_transition(
    small_run: Path, tmp_path: Path, shards: int
) -> None:
    run_dir = copy_of(small_run, tmp_path)
    budget = manifest(run_dir, "000001")["info"]["counters"]["env_steps"]
    resume_over_shards(run_dir, shards, budget)
    files = sorted((run_dir / "checkpoints" / "000002").glob("replay*.h5"))
    assert len(files) == shards
    assert replay_rows(run_dir, "000002") == replay_rows(run_dir, "000001")


def episodes_in(path: Path) -> list[tuple]:
    """A replay file's stored episode items as (episode_id, first step, filled steps)."""
    columns = read_tree(path)["tables"]["shared"].get("column", {})
    if not columns:
        return []  # a table that never received an item has no columns
    return [
        (int(ids[0]), int(steps[0]), int(filled.sum()))
        for ids, steps, filled in zip(
            columns["episode_id"], columns["step"], columns["filled"], strict=True
        )
    ]


def stored_episodes(run_dir: Path, ckpt: str) -> list[list[tuple]]:
    """Each replay file's episode items of a checkpoint, in shard order."""
    return [episodes_in(p) for p in sorted((run_dir / "checkpoints" / ckpt).glob("replay*.h5"))]


def test_resume_with_another_shard_count_keeps_every_episode(tmp_path: Path) -> None:
    """A team's episode tables, dealt from 2 shards to 3: one of the saved shards holds an
    empty table (its collector never reached it), which used to stop the resume."""
    job = [
        "jobs/spread_qmix.yaml",
        *SMALL,
        "topology.collectors=1",
        "topology.replay_shards=2",
        "replay.insert_credits=1",
        "env.num_envs=2",
        "replay.learning_starts=8",
        "learner.batch_size=4",
        "collector.fragments_per_task=1",
        "commander.max_env_steps=50",
    ]
    args = ["-m", "hpcmarl", *job, f"runtime.run_dir={tmp_path}"]
    first = run_local(args, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = stored_episodes(tmp_path, "000001")
    assert [] in saved and any(saved), saved  # one shard full, one empty
    assert all(n == 25 for shard in saved for _, _, n in shard)
    budget = manifest(tmp_path, "000001")["info"]["counters"]["env_steps"]
    resume_over_shards(tmp_path, 3, budget)
    dealt = stored_episodes(tmp_path, "000002")
    assert len(dealt) == 3
    assert sorted(sum(dealt, [])) == sorted(sum(saved, []))
