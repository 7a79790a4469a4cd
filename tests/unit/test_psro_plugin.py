"""PSRO asks the algorithm catalog whether `learner.algo` can be its best-response oracle
(`psro_oracle`), so a plugin algorithm that declares it trains PSRO's new policies, and one that
does not is refused in one line.

The oracle is `plugin_algos`' REINFORCE (a categorical actor, on-policy fragments) with the
flag set, one PSRO iteration on Kuhn poker in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import hpcmarl
from hpcmarl.launch import run
from hpcmarl.psro.checks import oracles

from .plugin_algos import Reinforce

pytest.importorskip("pyspiel")

ROOT = Path(__file__).resolve().parents[2]


class OracleReinforce(Reinforce):
    """REINFORCE that declares it can be PSRO's oracle: its categorical actor, frozen, plays
    the distribution it learned."""

    psro_oracle = True


def psro_job(algo: str) -> dict[str, Any]:
    """jobs/kuhn_psro_ppo.yaml with `algo` as the oracle: one iteration of two updates on
    32 fragments each (one collect task: 4 fragments x 8 env copies), in one process."""
    job = yaml.safe_load((ROOT / "jobs" / "kuhn_psro_ppo.yaml").read_text())
    del job["learner"]["ppo"]
    job["learner"] |= {"algo": algo, "reinforce": {"batch_fragments": 32, "gae_lambda": 1.0}}
    job["psro"] |= {"iterations": 1, "updates_per_iteration": 2, "eval_episodes": 20}
    job["topology"] = {"param_servers": 1, "replay_shards": 1, "learners": 1, "collectors": 1}
    return job


def test_a_plugin_that_declares_it_is_psro_s_oracle(tmp_path: Path) -> None:
    trained = hpcmarl.train(psro_job(f"{__name__}:OracleReinforce"), run_dir=tmp_path / "run")
    rows = [row for row in trained.metrics() if row.get("kind") == "psro"]
    assert [row["iteration"] for row in rows] == [0, 1]
    last = rows[-1]  # each player's best response, trained by the plugin, joined its population
    assert last["population"] == [2, 2] and last["env_steps"] > 0 and last["episodes"] > 0
    assert 0 <= last["exploitability"] < 2  # Kuhn's payoffs are within [-2, 2]


def test_a_plugin_that_does_not_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(psro_job("tests.unit.plugin_algos:Reinforce")))
    assert run.run_job(str(job), []) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("hpcmarl: error: ")]
    assert "tests.unit.plugin_algos:Reinforce cannot be PSRO's best-response oracle" in line
    assert f"fix: set learner.algo to one of {oracles()}, or to your own" in line
    assert oracles() == ["dqn", "ppo", "mappo", "ippo"] and "Traceback" not in err
