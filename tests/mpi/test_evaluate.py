"""`python -m hpcmarl evaluate RUN_DIR` plays a finished run's checkpointed policies offline.

Its figures must be those of the policies the run published: a single-agent run's returns are
recomputed here by a plain gymnasium loop over the checkpoint's weights; a team run's returns
come per agent and sum to the team's; the random baseline plays the same start states; every
wrong input ends in one `hpcmarl: error: ...; fix: ...` line with exit code 2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from hpcmarl.algos.actors import build_actor
from hpcmarl.algos.contract import PolicySpec
from hpcmarl.storage.checkpoint import latest_checkpoint

from .conftest import ROOT, run_local


def train(run_dir: Path, *args: str) -> None:
    result = run_local(
        [
            "-m",
            "hpcmarl",
            *args,
            "commander.stop_value=null",
            "topology.collectors=1",
            "checkpoint.interval_s=0",
            f"runtime.run_dir={run_dir}",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def evaluate(*args: str) -> tuple[int, str, str]:
    result = run_local(["-m", "hpcmarl", "evaluate", *args], timeout=300)
    return result.returncode, result.stdout, result.stderr


def test_a_runs_final_policy_plays_as_a_plain_gymnasium_loop_says(tmp_path: Path) -> None:
    train(tmp_path, "commander.max_env_steps=3000")
    code, out, err = evaluate(str(tmp_path), "--episodes", "5", "--seed", "40", "--json")
    assert code == 0, err
    result = json.loads(out)
    ckpt, _ = latest_checkpoint(tmp_path)
    assert ckpt is not None and result["checkpoint"] == ckpt.id
    assert result["env_steps"] >= 3000 and result["episodes"] == 5
    (entry,) = ckpt.read_role("ps0")["tables"]["main"].values()
    actor = build_actor(PolicySpec.from_json(entry["spec"]))
    actor.set_weights(np.asarray(entry["weights"], np.float32))
    returns = []
    for episode in range(5):  # copy i of the evaluation's vector env is seeded seed + i
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=40 + episode)
        total, done = 0.0, False
        while not done:
            action = actor.greedy(np.asarray(obs, np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    assert result["return_mean"] == pytest.approx(np.mean(returns))
    assert result["length_mean"] == pytest.approx(np.mean(returns))  # CartPole pays 1 a step


def test_a_teams_returns_come_per_agent_beside_random_play_on_the_same_starts(
    tmp_path: Path,
) -> None:
    """A recurrent VDN team on simple_spread: the agents' returns sum to the team's, and the
    same seed gives the same figures."""
    train(
        tmp_path,
        "jobs/spread_vdn.yaml",
        "env.num_envs=2",
        "learner.batch_size=4",
        "replay.learning_starts=8",
        "commander.max_env_steps=1500",
    )
    code, out, err = evaluate(str(tmp_path), "--episodes", "120", "--random", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["episodes"] == 120 and result["length_mean"] == 25
    assert sorted(result["agent_returns"]) == ["agent_0", "agent_1", "agent_2"]
    assert sum(result["agent_returns"].values()) == pytest.approx(result["return_mean"])
    uniform = result["random"]
    assert uniform["episodes"] == 120 and -95 < uniform["return_mean"] < -65  # -82.4 +- 23.2
    again = json.loads(evaluate(str(tmp_path), "--episodes", "120", "--random", "--json")[1])
    assert again == result
    code, out, _ = evaluate(str(tmp_path), "--episodes", "20")
    assert code == 0 and "over 20 episodes" in out and "per agent: agent_0" in out


def test_wrong_inputs_end_in_one_line_with_the_fix(tmp_path: Path) -> None:
    code, _, err = evaluate(str(tmp_path / "nowhere"))
    assert code == 2 and "holds no config.yaml" in err and "fix:" in err
    train(tmp_path / "run", "commander.max_env_steps=500")
    code, _, err = evaluate(str(tmp_path / "run"), "--checkpoint", "000042")
    assert code == 2 and "has no checkpoint '000042' (it has: 000001)" in err
    code, _, err = evaluate(str(tmp_path / "run"), "--episodes", "0")
    assert code == 2 and "plays nothing" in err
    h5 = tmp_path / "run" / "checkpoints" / "000001" / "ps0.h5"
    h5.write_bytes(h5.read_bytes()[:100])  # truncated
    code, _, err = evaluate(str(tmp_path / "run"), "--checkpoint", "000001")
    assert code == 2 and "ps0.h5" in err and "truncated" in err and "Traceback" not in err
    code, _, err = evaluate(str(tmp_path / "run"))
    assert code == 2 and "holds no intact checkpoint" in err
    psro = tmp_path / "psro"
    psro.mkdir()
    shutil.copy(ROOT / "jobs" / "kuhn_psro.yaml", psro / "config.yaml")
    code, _, err = evaluate(str(psro))
    assert code == 2 and "PSRO run" in err and "exploitability" in err
