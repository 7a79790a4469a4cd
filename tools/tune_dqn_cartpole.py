"""Tune DQN on CartPole-v1 in one process (no MPI): how few updates and env steps reach 475?

The loop mirrors what the distributed job does, serially: a vector env collects with an
epsilon-greedy actor, transitions go to a uniform replay ring, and learner updates are paced
by a samples-per-insert ratio (sampled transitions / inserted transitions ~= spi, the same
formula as the replay rate limiter). A greedy evaluation of `eval_episodes` episodes runs every
`eval_every` env steps; the run stops when its mean return reaches `stop_value`.

    .venv/bin/python tools/tune_dqn_cartpole.py --seeds 0 1 2 --lr 1e-3 --spi 16
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hpcmarl.algos.actors import EpsilonGreedyActor
from hpcmarl.algos.contract import run_update
from hpcmarl.algos.dqn import DQN
from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs import MultiAgentVectorEnv, VectorStep, make_vector_env
from hpcmarl.testing.groups import group_of, job_with

AGENT = "agent_0"


@dataclass
class Settings:
    """One tuning run's knobs; every field is also a command-line flag."""

    lr: float = 1e-3
    """Adam learning rate."""
    batch_size: int = 64
    """Transitions per update."""
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 128])
    """Q-network hidden widths."""
    target_freq: int = 250
    """Updates between hard target copies."""
    gamma: float = 0.99
    """Discount."""
    eps_start: float = 1.0
    """Initial epsilon."""
    eps_end: float = 0.02
    """Final epsilon."""
    eps_decay_steps: int = 10_000
    """Env steps of the linear epsilon decay."""
    learning_starts: int = 1_000
    """Transitions in replay before the first update."""
    spi: float = 8.0
    """Samples per insert: updates * batch_size ~= spi * env steps."""
    num_envs: int = 4
    """Vector env copies."""
    capacity: int = 50_000
    """Replay ring size."""
    eval_every: int = 2_000
    """Env steps between greedy evaluations."""
    eval_episodes: int = 10
    """Episodes per evaluation."""
    stop_value: float = 475.0
    """Mean eval return that ends the run."""
    max_env_steps: int = 100_000
    """Give up after this many env steps."""
    verbose: int = 0
    """1 prints every evaluation."""


class Ring:
    """Uniform replay: a fixed-size numpy ring, oldest overwritten first."""

    def __init__(self, capacity: int, obs_dim: int) -> None:
        self.capacity, self.size, self.next = capacity, 0, 0
        self.cols = {
            "observations": np.zeros((capacity, obs_dim), np.float32),
            "actions": np.zeros(capacity, np.int64),
            "rewards": np.zeros(capacity, np.float32),
            "next_observations": np.zeros((capacity, obs_dim), np.float32),
            "terminations": np.zeros(capacity, bool),
            "truncations": np.zeros(capacity, bool),
        }

    def add(self, rows: dict[str, np.ndarray]) -> None:
        idx = (self.next + np.arange(len(rows["actions"]))) % self.capacity
        for key, col in self.cols.items():
            col[idx] = rows[key]
        self.next = int(idx[-1] + 1) % self.capacity
        self.size = min(self.size + len(idx), self.capacity)

    def sample(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        idx = rng.integers(self.size, size=n)
        return {key: col[idx] for key, col in self.cols.items()}


def evaluate(actor: EpsilonGreedyActor, venv: MultiAgentVectorEnv, episodes: int) -> float:
    """Mean return of the first episode of each of `episodes` copies, acting greedily."""
    obs = venv.reset()[AGENT]
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    while not done.all():
        step = venv.step({AGENT: actor.greedy(obs)})
        returns += step.rewards[AGENT] * ~done
        done |= step.episode_ended
        obs = step.observations[AGENT]
    return float(returns.mean())


def train(s: Settings, seed: int) -> dict[str, float]:
    """One run to the stop value (or the step budget); returns what it took."""
    job = job_with(
        lr=s.lr,
        gamma=s.gamma,
        batch_size=s.batch_size,
        hidden_sizes=s.hidden_sizes,
        dqn__target_network_update_freq=s.target_freq,
        dqn__eps_start=s.eps_start,
        dqn__eps_end=s.eps_end,
        dqn__eps_decay_steps=s.eps_decay_steps,
    )
    group = group_of(4, 2)
    venv = make_vector_env(EnvConfig(), s.num_envs, seed)
    eval_env = make_vector_env(EnvConfig(), s.eval_episodes, seed + 10_000)
    dqn = DQN(group, job, seed)
    (spec,) = DQN.policy_specs(group, job).values()
    actor = EpsilonGreedyActor(spec)
    actor.set_weights(dqn.publish()[spec.key])
    ring, rng = Ring(s.capacity, 4), np.random.default_rng(seed)
    obs, steps, updates, owed, score, start = venv.reset()[AGENT], 0, 0, 0.0, 0.0, time.time()
    next_eval = s.eval_every
    while steps < s.max_env_steps:
        actions = actor.act(obs, rng, env_steps=steps, greedy=False).actions
        step = venv.step({AGENT: actions})
        ring.add(_rows(obs, actions, step))
        obs, steps = step.observations[AGENT], steps + s.num_envs
        if ring.size >= s.learning_starts:
            owed += s.num_envs * s.spi / s.batch_size
            while owed >= 1.0:
                run_update(dqn, ring.sample(rng, s.batch_size))
                owed, updates = owed - 1.0, updates + 1
            actor.set_weights(dqn.publish()[spec.key])
        if steps >= next_eval:
            next_eval += s.eval_every
            score = evaluate(actor, eval_env, s.eval_episodes)
            if s.verbose:
                print(f"  {steps} steps {updates} updates eval {score:.1f}", flush=True)
            if score >= s.stop_value:
                break
    wall = time.time() - start
    return {"seed": seed, "env_steps": steps, "updates": updates, "eval": score, "wall_s": wall}


def _rows(obs: np.ndarray, actions: np.ndarray, step: VectorStep) -> dict[str, np.ndarray]:
    return {
        "observations": obs,
        "actions": actions,
        "rewards": step.rewards[AGENT],
        "next_observations": step.next_observations[AGENT],
        "terminations": step.terminations[AGENT],
        "truncations": step.truncations[AGENT],
    }


def parse() -> tuple[Settings, list[int]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    for f in dataclasses.fields(Settings):
        default = f.default_factory() if callable(f.default_factory) else f.default
        kind = int if f.name == "hidden_sizes" else type(default)
        nargs = "+" if f.name == "hidden_sizes" else None
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=kind, nargs=nargs, default=default
        )
    args = vars(parser.parse_args())
    seeds = args.pop("seeds")
    return Settings(**args), seeds


def main() -> None:
    torch.set_num_threads(1)
    settings, seeds = parse()
    print(settings)
    for seed in seeds:
        r = train(settings, seed)
        print(
            f"seed {r['seed']}: eval {r['eval']:.1f} after {r['env_steps']} env steps, "
            f"{r['updates']} updates, {r['wall_s']:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
