"""commander.stop_evals: a run stops on the stop value only once that many evaluations in a row
reached it, and a checkpoint carries the count so a resumed run does not start it over."""

from __future__ import annotations

import pytest

from hpcmarl.config.loader import job_from_dict
from hpcmarl.config.schema import JobConfig
from hpcmarl.errors import ConfigError
from hpcmarl.roles.commander import Commander
from hpcmarl.testing.world import OneRank


def commander(tmp_path, stop_evals: int) -> Commander:
    cfg = JobConfig()
    cfg.commander.stop_evals = stop_evals
    cfg.checkpoint.at_end = False  # stop at once: no final checkpoint to run
    cfg.topology.collectors, cfg.topology.learners, cfg.topology.replay_shards = 1, 1, 1
    return OneRank(cfg).commander(tmp_path)


def evaluation(value: float) -> dict:
    return {"return_mean": value, "return_std": 0.0, "length_mean": value, "episodes": 10,
            "agent_returns": {"agent_0": value}}  # fmt: skip


def test_stop_waits_for_evaluations_in_a_row(tmp_path) -> None:
    boss = commander(tmp_path, stop_evals=2)
    for value in (480.0, 300.0, 490.0):  # the drop starts the count over
        boss.on_eval(evaluation(value))
        assert boss.stop_reason == ""
    boss.on_eval(evaluation(500.0))
    assert boss.stop_reason == (
        "stop_value reached (eval return 500.0 >= 475 in 2 evaluations in a row)"
    )


def test_a_resumed_run_keeps_its_count(tmp_path) -> None:
    boss = commander(tmp_path / "a", stop_evals=2)
    boss.checkpoints.taken = ["000001"]
    boss.on_eval(evaluation(480.0))
    resumed = commander(tmp_path / "b", stop_evals=2)
    resumed.load_state(boss.state())
    resumed.on_eval(evaluation(481.0))
    assert resumed.stop_reason.startswith("stop_value reached")


def test_one_evaluation_is_the_default(tmp_path) -> None:
    boss = commander(tmp_path, stop_evals=1)
    boss.on_eval(evaluation(476.0))
    assert boss.stop_reason == "stop_value reached (eval return 476.0 >= 475)"


def test_stop_evals_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="stop_evals"):
        job_from_dict({"commander": {"stop_evals": 0}})
