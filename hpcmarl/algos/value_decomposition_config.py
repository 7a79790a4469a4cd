"""The keys of value decomposition, qmix and its preset vdn (`learner.qmix`), and their checks,
beside its code (value_decomposition.py).

`algos.catalog` reads IMPL, SECTION, ON_POLICY, ITEMS, CONFIG, RULES and ORDERED (a plugin class
declares the same as attributes). Torch-free, so that reading a job (the schema, validation,
`--explain`) imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmarl.limits import Rule, at_least, one_of, within

IMPL = "hpcmarl.algos.value_decomposition:ValueDecomposition"
"""The implementation, imported when a role needs it."""
SECTION = "qmix"
"""Its keys are `learner.qmix.*`."""
ON_POLICY = False
ITEMS = "episode"


@dataclass
class QMIXConfig:
    """Value decomposition's own keys (`learner.algo: qmix`, or the preset `vdn`): a team of
    recurrent agents with shared parameters trained through a mixer of their Q-values, on whole
    episodes from replay (Rashid et al. 2018; Sunehag et al. 2018; EPyMARL's defaults)."""

    mixer: str = "qmix"
    """`qmix`: a monotonic hypernetwork over the global state mixes the agents' Q-values;
    `vdn`: their sum."""
    rnn_hidden: int = 64
    """Width of each agent network's GRU (and of the layer before it)."""
    agent_id: bool = True
    """Append a one-hot agent index to each agent's observation, so agents that share
    parameters can still act differently."""
    mixing_embed: int = 32
    """QMIX: width of the mixing network's hidden layer."""
    hypernet_embed: int = 64
    """QMIX: width of the hidden layer of the hypernetworks that make the mixing weights."""
    double_q: bool = True
    """The online agents pick the next actions, the target agents score them."""
    standardize_rewards: bool = True
    """Train on the team reward less its running mean, over its running standard deviation
    (EPyMARL's default): Q-values stay near 0 and of unit scale whatever the env's reward
    units, which is where the mixing network's ELU and its initial weights work as designed.
    Centring also changes what ending an episode early is worth; set false where episodes end
    by termination and that matters."""
    td_lambda: float = 0.0
    """TD(lambda) targets over the episode (0: one-step targets)."""
    bootstrap_truncated: bool = True
    """A truncated episode's last step bootstraps from the state after it, as a time limit the
    agents cannot see should; false ends the team's return there, as EPyMARL does (its runner
    treats a time limit as the episode's end): a finite horizon, which keeps QMIX's mixer from
    compounding its own overestimates through the bootstrap on tasks that only ever end by a
    time limit (measured on simple_spread: with the bootstrap, Q_tot climbed to 80 against
    true values near 6 and the team return fell back)."""
    target_network_update_freq: int = 200
    """Updates between hard copies of the agents and the mixer into their targets."""
    target_tau: float = 0.0
    """Soft target updates: after every update the target moves this fraction of the way to
    the online network (Polyak averaging; 0.005 is usual); 0 keeps the hard copies."""
    episode_limit: int = 25
    """Steps per episode item (T_max): shorter episodes are padded (the `filled` mask marks
    their steps), a longer one goes on in the next item."""
    eps_start: float = 1.0
    """Initial epsilon of the agents' epsilon-greedy schedule."""
    eps_end: float = 0.05
    """Final epsilon."""
    eps_decay_steps: int = 50_000
    """Global env steps over which epsilon decays linearly from eps_start to eps_end."""


RULES: dict[str, Rule] = {
    "mixer": one_of("qmix", "vdn"),
    "rnn_hidden": at_least(1),
    "mixing_embed": at_least(1),
    "hypernet_embed": at_least(1),
    "td_lambda": within(0, 1),
    "target_network_update_freq": at_least(1),
    "target_tau": within(0, 1),
    "episode_limit": at_least(1),
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

CONFIG = QMIXConfig
