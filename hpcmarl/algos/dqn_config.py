"""The keys of DQN (`learner.dqn`) and their checks, beside its code (dqn.py).

`algos.catalog` reads IMPL, SECTION, ON_POLICY, ITEMS, CONFIG, RULES and ORDERED (a plugin class
declares the same as attributes). Torch-free, so that reading a job (the schema, validation,
`--explain`) imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmarl.limits import Rule, above, at_least, within

IMPL = "hpcmarl.algos.dqn:DQN"
"""The implementation, imported when a role needs it."""
SECTION = "dqn"
"""Its keys are `learner.dqn.*`."""
ON_POLICY = False
ITEMS = "transition"
PSRO_ORACLE = True
"""It can be PSRO's best-response oracle: its greedy policy, frozen, is what it learned."""


@dataclass
class DQNConfig:
    """DQN's own keys (`learner.algo: dqn`): double-Q targets, Huber loss, a hard-copied target
    network, and epsilon-greedy exploration owned by its actor."""

    double_q: bool = True
    """Use double Q-learning targets (online net picks the action, target net scores it)."""
    huber_delta: float = 1.0
    """Huber loss threshold on the TD error."""
    target_network_update_freq: int = 100
    """Learner updates between hard copies of the online network into the target network."""
    target_tau: float = 0.0
    """Soft target updates: after every update the target moves this fraction of the way to
    the online network (Polyak averaging; 0.005 is usual); 0 keeps the hard copies."""
    eps_start: float = 1.0
    """Initial epsilon of the actor's epsilon-greedy schedule."""
    eps_end: float = 0.04
    """Final epsilon."""
    eps_decay_steps: int = 8_000
    """Global env steps over which epsilon decays linearly from eps_start to eps_end."""
    n_step: int = 1
    """Steps of reward each transition sums before it bootstraps (n-step returns, truncated
    at the episode's end); collectors build them, replay files keep one-step rows."""


RULES: dict[str, Rule] = {
    "huber_delta": above(0),
    "target_network_update_freq": at_least(1),
    "target_tau": within(0, 1),
    "eps_start": within(0, 1),
    "eps_end": within(0, 1),
    "eps_decay_steps": at_least(1),
    "n_step": at_least(1),
}
"""The allowed values of the keys that have limits, by key (validation and `--explain`)."""

ORDERED: tuple[tuple[str, str, str], ...] = (
    ("eps_end", "eps_start", "epsilon decays from eps_start to eps_end"),
)
"""(smaller, larger, why): keys of this section where the first must not exceed the second
(validation and `--explain`)."""

CONFIG = DQNConfig
