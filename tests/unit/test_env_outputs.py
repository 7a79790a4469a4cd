"""What an env returns is checked on every step: a non-finite or `None` reward or observation,
an observation of the wrong shape (once broadcast into every input) or of a non-numeric dtype
ends the job with one line naming the env, the agent, the step and the field, instead of being
trained on until the network is NaN."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs import MultiAgentVectorEnv, make_vector_env
from hpcmarl.envs.adapters import ParallelCopy
from hpcmarl.errors import EnvOutputError
from hpcmarl.testing.early_exit import EarlyExit

from ..mpi.conftest import run_local

BROKEN = "hpcmarl.testing.broken:Broken-v0"


def broken_env(fault: str, at_step: int, num_envs: int = 2) -> MultiAgentVectorEnv:
    cfg = EnvConfig(kind="gymnasium", id=BROKEN, kwargs={"fault": fault, "at_step": at_step})
    return make_vector_env(cfg, num_envs, seed=0)


@pytest.mark.parametrize(
    ("fault", "field", "problem"),
    [
        ("nan_reward", "reward", "nan"),
        ("none_reward", "reward", "None"),
        ("nan_obs", "observation", "nan"),
        ("short_obs", "observation", "shape (1,)"),
        ("text_obs", "observation", "dtype <U1"),
    ],
)
def test_a_bad_step_names_the_env_the_agent_the_step_and_the_field(
    fault: str, field: str, problem: str
) -> None:
    env = broken_env(fault, at_step=5)
    env.reset()
    for _ in range(4):
        env.step({"agent_0": np.zeros(2, np.int64)})
    with pytest.raises(EnvOutputError) as caught:
        env.step({"agent_0": np.zeros(2, np.int64)})
    message = str(caught.value)
    assert f"{BROKEN} returned" in message and "agent 'agent_0'" in message
    assert f" {field} " in message and "at step 5 of env copy 0" in message
    assert problem in message


class NanForRunner(EarlyExit):
    """early_exit whose `runner` gets a NaN reward from the 2nd step on."""

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terms, truncs, infos = super().step(actions)
        if self.t >= 2 and "runner" in rewards:
            rewards["runner"] = float("nan")
        return obs, rewards, terms, truncs, infos


def test_a_nan_at_a_reset_inside_the_step_is_named() -> None:
    env = broken_env("nan_reset", at_step=1, num_envs=1)
    env.reset()
    for _ in range(49):  # the episode ends at its 50th step, and the env resets
        env.step({"agent_0": np.zeros(1, np.int64)})
    with pytest.raises(EnvOutputError, match="'agent_0' at its reset of env copy 0"):
        env.step({"agent_0": np.zeros(1, np.int64)})


def test_a_multi_agent_env_names_the_agent_at_fault() -> None:
    env = MultiAgentVectorEnv([ParallelCopy(NanForRunner(), "early_exit")], seed=0)
    env.reset()
    actions = {"quitter": np.zeros(1, np.int64), "runner": np.zeros(1, np.int64)}
    env.step(actions)
    with pytest.raises(EnvOutputError, match="'runner' at step 2 of env copy 0"):
        env.step(actions)


def test_a_well_behaved_env_passes() -> None:
    env = broken_env("none", at_step=1)
    env.reset()
    for _ in range(120):  # over two episode ends (50 steps each)
        step = env.step({"agent_0": np.ones(2, np.int64)})
    assert np.isfinite(step.rewards["agent_0"]).all()


def test_a_nan_reward_ends_a_uniform_replay_job_with_one_line(tmp_path) -> None:
    """It used to train to NaN weights and exit 0 with 'finished: step budget reached'."""
    args = [
        "-m",
        "hpcmarl",
        "env.kind=gymnasium",
        f"env.id={BROKEN}",
        "env.kwargs={fault: nan_reward, at_step: 200}",
        "replay.prioritized=false",
        "replay.learning_starts=50",
        "commander.stop_value=null",
        "commander.max_env_steps=1000",
        "topology.collectors=1",
        "checkpoint.at_end=false",
        f"runtime.run_dir={tmp_path}",
    ]
    result = run_local(args, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.startswith("hpcmarl: failed")]
    assert result.returncode != 0 and len(lines) == 1, result.stdout[-2000:] + result.stderr
    assert "(collector0)" in lines[0] and "EnvOutputError" in lines[0]
    assert "reward of agent 'agent_0' at step 200 of env copy 0" in lines[0]
    assert "finished" not in result.stdout
    err = result.stderr.splitlines()  # the run directory on the line after (issue 34)
    assert err[err.index(lines[0]) + 1] == f"hpcmarl: run directory: {tmp_path}", err
