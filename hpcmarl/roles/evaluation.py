"""Greedy evaluation, stepped a little at a time so that the collector hosting it never blocks.
(A PSRO matchup may name the keys that play greedily; the others sample their policies, as a
policy-gradient oracle's frozen members do.)

One env copy per episode; each copy counts only its first episode, cut (and counted as
truncated) after `max_steps` steps, so that an env that never ends an episode (no time limit)
cannot hold up the run, its checkpoints and its end. The return of a
multi-agent episode is the team return (the sum over agents); per-agent returns are kept too,
with every reward an agent gets, also those that arrive while it is not the one acting (a
turn-based game's payoff after the opponent's last move).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from .acting import Memory, act_all


class Evaluation:
    """Plays one greedy episode in each copy of `env`, one vector step per call of `step()`."""

    def __init__(
        self,
        env: Any,
        actors: dict,
        bindings: dict[str, str],
        greedy: bool | AbstractSet[str] = True,
        max_steps: int = 10_000,
    ) -> None:
        self.env, self.actors, self.bindings = env, actors, bindings
        self.max_steps = max_steps
        self.truncated = np.zeros(env.num_envs, bool)
        """Episodes cut at `max_steps`."""
        self.greedy = greedy
        self.obs = env.reset()
        self.masks = env.action_masks
        self.rng = np.random.default_rng(0)
        self.running = np.ones(env.num_envs, bool)
        self.agent_returns = {a: np.zeros(env.num_envs) for a in env.agents}
        self.lengths = np.zeros(env.num_envs, np.int64)
        self.memory = Memory()

    def step(self) -> bool:
        """Advance every unfinished episode by one step; True once all have ended."""
        actions, _ = act_all(
            self.actors,
            self.bindings,
            self.obs,
            self.rng,
            0,
            greedy=self.greedy,
            masks=self.masks,
            memory=self.memory,
        )
        step = self.env.step(actions)
        for agent, rewards in step.rewards.items():
            self.agent_returns[agent] += np.where(self.running, rewards, 0.0)
        self.lengths += self.running
        self.running &= ~step.episode_ended
        cut = self.running & (self.lengths >= self.max_steps)
        self.truncated |= cut
        self.running &= ~cut
        self.memory.reset(step.episode_ended)
        self.obs, self.masks = step.observations, step.action_masks
        return not self.running.any()

    def summary(self) -> dict:
        team = sum(self.agent_returns.values())
        return {
            "return_mean": float(np.mean(team)),
            "return_std": float(np.std(team)),
            "length_mean": float(np.mean(self.lengths)),
            "agent_returns": {a: float(np.mean(r)) for a, r in self.agent_returns.items()},
            "episodes": int(self.env.num_envs),
            "truncated": int(self.truncated.sum()),
        }

    def moments(self, players: list[list[str]]) -> dict[str, Any]:
        """Each player's (its agents' summed) returns as episode count, sums and sums of
        squares: what a payoff-table entry adds up over tasks."""
        returns = [sum(self.agent_returns[a] for a in agents) for agents in players]
        return {
            "n": int(self.env.num_envs),
            "sums": [float(np.sum(r)) for r in returns],
            "sq": [float(np.sum(np.square(r))) for r in returns],
        }
