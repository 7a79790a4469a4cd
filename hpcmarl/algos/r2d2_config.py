"""The keys of R2D2 (`learner.r2d2`) and their checks, beside its code (r2d2.py).

`algos.catalog` reads IMPL, SECTION, ON_POLICY, ITEMS, CONFIG, RULES and ORDERED (a plugin class
declares the same as attributes). Torch-free, so that reading a job (the schema, validation,
`--explain`) imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmarl.limits import Rule, at_least, within

IMPL = "hpcmarl.algos.r2d2:R2D2"
"""The implementation, imported when a role needs it."""
SECTION = "r2d2"
"""Its keys are `learner.r2d2.*`."""
ON_POLICY = False
ITEMS = "sequence"


@dataclass
class R2D2Config:
    """Recurrent DQN's own keys (`learner.algo: r2d2`; Kapturowski et al. 2019): a GRU
    Q-network trained on sequences from prioritized replay (`replay.sequence_length`,
    `replay.burn_in`, `replay.sequence_overlap`, `replay.zero_init_states`), n-step double-Q
    targets under value rescaling, priorities per sequence."""

    rnn_hidden: int = 64
    """Width of the GRU (and of the layer before it)."""
    n_step: int = 3
    """Steps of reward each target sums before it bootstraps (cut at the sequence's and the
    episode's end)."""
    priority_eta: float = 0.9
    """A sequence's priority: eta max_t |delta_t| + (1 - eta) mean_t |delta_t|."""
    value_rescaling: bool = True
    """Learn h(Q) with h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, which keeps targets of long
    episodes in a small range."""
    double_q: bool = True
    """The online network picks the next action, the target network scores it."""
    target_network_update_freq: int = 200
    """Updates between hard copies of the online network into the target network."""
    target_tau: float = 0.0
    """Soft target updates: after every update the target moves this fraction of the way to
    the online network (Polyak averaging; 0.005 is usual); 0 keeps the hard copies."""
    eps_start: float = 1.0
    """Initial epsilon of the actor's epsilon-greedy schedule."""
    eps_end: float = 0.02
    """Final epsilon."""
    eps_decay_steps: int = 20_000
    """Global env steps over which epsilon decays linearly from eps_start to eps_end."""


RULES: dict[str, Rule] = {
    "rnn_hidden": at_least(1),
    "n_step": at_least(1),
    "priority_eta": within(0, 1),
    "target_network_update_freq": at_least(1),
    "target_tau": within(0, 1),
    "eps_start": within(0, 1),
    "eps_end": within(0, 1),
    "eps_decay_steps": at_least(1),
}
"""The allowed values of the keys that have limits, by key (validation and `--explain`)."""

ORDERED: tuple[tuple[str, str, str], ...] = (
    ("eps_end", "eps_start", "epsilon decays from eps_start to eps_end"),
)
"""(smaller, larger, why): keys of this section where the first must not exceed the second
(validation and `--explain`)."""

CONFIG = R2D2Config
