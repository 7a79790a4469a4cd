"""Advantages and return targets for on-policy learning: GAE(lambda) and a value normaliser.

`gae` follows Schulman et al. (2016) over fragments that may span episode boundaries:

    delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - ended_t) * A_{t+1},   A_T = 0

where s'_t is the true next state (the final observation when the episode ended at t), so a
*truncated* episode still bootstraps from V(s'_t) and only a *terminated* one does not; `ended_t`
(terminated or truncated) stops the sum at an episode boundary inside the fragment. The
fragment's last step bootstraps from V(s'_{T-1}), the state the next fragment starts from.

Where an agent does not act at every step (a turn-based game: one player moves per step; an
agent that finished before the others), `active` says when it decides, and each of its decisions
is one step of its own: its reward is everything it received from that step up to its next
decision, and it bootstraps from V at that next decision (or from V(s') where the episode or
the fragment ends first). Without this, a player's advantage would chain through its opponent's
turns, on values the critic never trains on (it learns only where the agent acts).

`ValueNorm` is MAPPO's normaliser of value targets: debiased exponential moving averages of the
targets' mean and mean square, so the critic regresses on targets of unit scale whatever the
reward scale.
"""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    ended: np.ndarray,
    gamma: float,
    lam: float,
    active: np.ndarray | None = None,
) -> np.ndarray:
    """Advantages for arrays whose axis 1 is time ([items, T, ...]); float32 like the inputs.
    With `active` (same shape, bool), inactive steps get 0 and carry rewards to the decision
    before them (see the module's docstring)."""
    if active is not None and not active.all():
        return decision_gae(rewards, values, next_values, terminated, ended, gamma, lam, active)
    alive = 1.0 - terminated.astype(np.float32)
    carry = 1.0 - ended.astype(np.float32)
    deltas = rewards + gamma * alive * next_values - values
    advantages = np.zeros_like(deltas, dtype=np.float32)
    running = np.zeros_like(deltas[:, 0], dtype=np.float32)
    for t in range(deltas.shape[1] - 1, -1, -1):
        running = deltas[:, t] + gamma * lam * carry[:, t] * running
        advantages[:, t] = running
    return advantages


def decision_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    ended: np.ndarray,
    gamma: float,
    lam: float,
    active: np.ndarray,
) -> np.ndarray:
    """GAE over each agent's own decisions: one backward pass that carries, per agent, the
    transition still open from a later decision (its rewards so far, the value it bootstraps
    from and whether the episode terminated on the way) to the decision that opens it."""
    shape = rewards[:, 0].shape
    reward_sum = np.zeros(shape, np.float32)
    """Rewards from the step being visited up to the agent's next decision."""
    bootstrap = next_values[:, -1].astype(np.float32)
    """V where the open transition ends: the next decision, or s' at an episode's or the
    fragment's end."""
    alive = np.ones(shape, np.float32)
    following = np.zeros(shape, np.float32)
    """A at the agent's next decision in the same episode (0 past an episode's end)."""
    advantages = np.zeros(rewards.shape, np.float32)
    for t in range(rewards.shape[1] - 1, -1, -1):
        end = ended[:, t]
        reward_sum = np.where(end, 0.0, reward_sum) + rewards[:, t]
        bootstrap = np.where(end, next_values[:, t], bootstrap)
        alive = np.where(end, 1.0 - terminated[:, t].astype(np.float32), alive)
        following = np.where(end, 0.0, following)
        acts = active[:, t]
        delta = reward_sum + gamma * alive * bootstrap - values[:, t]
        advantage = (delta + gamma * lam * following).astype(np.float32)
        advantages[:, t] = np.where(acts, advantage, 0.0)
        following = np.where(acts, advantage, following)
        bootstrap = np.where(acts, values[:, t], bootstrap)
        alive = np.where(acts, 1.0, alive)
        reward_sum = np.where(acts, 0.0, reward_sum)
    return advantages


class ValueNorm:
    """Running mean and variance of value targets (debiased EMAs with weight `beta` per update).

    normalize(x) = (x - mean) / sqrt(var),  var = E[x^2] - E[x]^2 (at least `min_var`).
    """

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5, min_var: float = 1e-2):
        self.beta, self.epsilon, self.min_var = beta, epsilon, min_var
        self.mean_ema = 0.0
        self.mean_sq_ema = 0.0
        self.debias = 0.0

    def moments(self, targets: np.ndarray) -> np.ndarray:
        """[mean, mean square, 1] of a batch of targets ([0, 0, 0] for none): what a group
        averages (float32, so means rather than sums) before every member calls `update_from`
        with the same numbers. Members' batches are equal in size, so the averaged means are
        the whole batch's."""
        if targets.size == 0:
            return np.zeros(3, np.float32)
        x = targets.astype(np.float64)
        return np.array([x.mean(), (x * x).mean(), 1.0], dtype=np.float32)

    def update_from(self, moments: np.ndarray) -> None:
        mean, mean_sq, weight = (float(m) for m in moments)
        if weight <= 0:
            return
        b = self.beta
        self.mean_ema = b * self.mean_ema + (1 - b) * mean / weight
        self.mean_sq_ema = b * self.mean_sq_ema + (1 - b) * mean_sq / weight
        self.debias = b * self.debias + (1 - b)

    def stats(self) -> tuple[float, float]:
        """(mean, std); (0, 1) before the first update."""
        if self.debias <= 0:
            return 0.0, 1.0
        d = max(self.debias, self.epsilon)
        mean = self.mean_ema / d
        var = max(self.mean_sq_ema / d - mean * mean, self.min_var)
        return mean, float(np.sqrt(var))

    def normalize(self, x: np.ndarray) -> np.ndarray:
        mean, std = self.stats()
        return ((x - mean) / std).astype(np.float32)

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        mean, std = self.stats()
        return (x * std + mean).astype(np.float32)

    def state(self) -> np.ndarray:
        return np.array([self.mean_ema, self.mean_sq_ema, self.debias], dtype=np.float64)

    def load_state(self, state: np.ndarray) -> None:
        self.mean_ema, self.mean_sq_ema, self.debias = (float(v) for v in state)
