"""PPO learns a continuous-control task: gymnasium's Pendulum-v1, trained by
jobs/pendulum_ppo.yaml in this process on a small step budget, then played by the policy
`hpcmarl.load_policy` reads back, against uniformly random torques on the same start states.

Random play scores about -1200 to -1400 an episode; the job's seeds 0-2 pass -400 at 25-33k
env steps (docs/benchmarks.md), and seed 0 at this budget scores -296 here. The floor is far
from both: a policy that learned nothing cannot pass it, and one that learned a little less
still does. The budget is in env steps and the run, in one process, came out the same at
load 18 and 25, so a loaded machine is slower but not worse (23 s at load 18, 73 s at 25).
"""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch

import hpcmarl
from hpcmarl.policy_export import export_policy

JOB = Path(__file__).resolve().parents[2] / "jobs" / "pendulum_ppo.yaml"
BUDGET = ["commander.max_env_steps=36000", "commander.eval_interval_s=3600"]
EPISODES = 10
FLOOR = -700.0
"""Mean return over EPISODES greedy episodes the trained policy must beat."""


def mean_return(act: object, episodes: int = EPISODES) -> float:
    """Mean return of `act(obs) -> action` over Pendulum episodes seeded 1000, 1001, ..."""
    env = gymnasium.make("Pendulum-v1")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=1000 + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))  # type: ignore[operator]
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_ppo_learns_pendulum_far_above_random_play(tmp_path: Path) -> None:
    space = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32, seed=0)
    random = mean_return(lambda obs: space.sample())
    run = hpcmarl.train(JOB, BUDGET, run_dir=tmp_path / "run")
    assert run.final["reason"].startswith("step budget reached"), run.final
    policy = hpcmarl.load_policy(run.run_dir)
    trained = mean_return(policy.act)
    assert trained > FLOOR and trained > random + 500, (trained, random)
    # the exported network's mean, clipped to the bounds, is the greedy action
    assert "greedy action = the mean clipped" in export_policy(
        policy, "torchscript", tmp_path / "pi.pt"
    )
    module = torch.jit.load(str(tmp_path / "pi.pt"))
    obs = np.random.default_rng(0).uniform(-8, 8, (1000, 3)).astype(np.float32)
    with torch.no_grad():
        mean = module(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(np.clip(mean, -2.0, 2.0), policy.act(obs), rtol=1e-5, atol=1e-6)
