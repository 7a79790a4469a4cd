"""End-to-end training runs: CartPole to its stop value, simple_spread improving, the run files.

Each run has a hard timeout; a hang fails the test, never the suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_local, run_mpi

STEP_BUDGET = "commander.max_env_steps=150000"


def finished_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("hpcmarl: finished")]
    assert lines, output[-4000:]
    return lines[-1]


def check_run_dir(run_dir: Path) -> list[dict]:
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "progress.csv").read_text().startswith("time_s,env_steps")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "finished"
    return rows


@pytest.mark.slow
def test_cartpole_solves_in_one_process(tmp_path: Path) -> None:
    """The default job with every role in one process, on deterministic mode's schedule: a
    free-running run in one process is not the same step for step (its solve step ranged over
    8k-36k env steps, 15-100 s of CI), this one solves at the same step every time."""
    args = ["-m", "hpcmarl", "commander.deterministic=true", STEP_BUDGET]
    result = run_local([*args, f"runtime.run_dir={tmp_path}"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "stop_value reached" in finished_line(result.stdout)
    rows = check_run_dir(tmp_path)
    assert max(r["return_mean"] for r in rows if r["kind"] == "eval") >= 475


@pytest.mark.mpi
@pytest.mark.slow
def test_the_default_job_trains_at_make_runs_16_ranks(tmp_path: Path) -> None:
    """`make run`'s world: every role on its own ranks, 16 in all, through a whole run and its
    final checkpoint. Solving is the one-process test's above and the fast job's below at -n 4
    (the same DQN; solving at -n 16 cost 3 minutes of CI on 2 cores for nothing more)."""
    args = ["-m", "hpcmarl", "commander.max_env_steps=4000", "commander.stop_value=null"]
    result = run_mpi(16, [*args, f"runtime.run_dir={tmp_path}"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step budget reached" in finished_line(result.stdout)
    assert "topology for 16 rank(s)" in result.stdout
    rows = check_run_dir(tmp_path)
    assert max(row["updates"] for row in rows if row["kind"] == "progress") > 0
    assert (tmp_path / "checkpoints" / "latest").exists()


@pytest.mark.mpi
@pytest.mark.slow
def test_the_fast_cartpole_job_solves_and_holds_it_under_mpirun(tmp_path: Path) -> None:
    """jobs/cartpole_fast.yaml, the job bench_e2e races against SB3, as the bench runs it: two
    evaluations in a row at 475 or more (its seeds solved in 15k-37k env steps)."""
    args = ["-m", "hpcmarl", "jobs/cartpole_fast.yaml", "commander.stop_evals=2", STEP_BUDGET]
    result = run_mpi(4, [*args, f"runtime.run_dir={tmp_path}"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "in 2 evaluations in a row" in finished_line(result.stdout)
    evals = [r["return_mean"] for r in check_run_dir(tmp_path) if r["kind"] == "eval"]
    assert min(evals[-2:]) >= 475


@pytest.mark.mpi
@pytest.mark.slow
def test_independent_dqn_on_simple_spread_improves(tmp_path: Path) -> None:
    """Three policies, three groups of transitions (jobs/spread_shared.yaml is the same data
    path with one policy; VDN and QMIX cover a shared policy on simple_spread)."""
    job = "jobs/spread_independent.yaml"
    result = run_mpi(6, ["-m", "hpcmarl", job, f"runtime.run_dir={tmp_path}"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step budget reached" in finished_line(result.stdout)
    rows = check_run_dir(tmp_path)
    assert len([r for r in rows if r["kind"] == "eval"]) >= 2
    train = [r["train_return"] for r in rows if r["kind"] == "progress" and r["train_return"]]
    assert train[-1] > train[0] + 5.0, train


@pytest.mark.mpi
def test_the_default_layout_runs_over_tcp_only(tmp_path: Path) -> None:
    """Ranks on different nodes share no memory: the transport must work over TCP alone."""
    result = run_mpi(
        16,
        [
            "-m",
            "hpcmarl",
            "commander.max_env_steps=4000",
            "commander.stop_value=null",
            f"runtime.run_dir={tmp_path}",
        ],
        timeout=300,
        env={"OMPI_MCA_btl": "tcp,self"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step budget reached" in finished_line(result.stdout)
    rows = check_run_dir(tmp_path)
    assert any(r["kind"] == "progress" and r["updates"] > 0 for r in rows)
