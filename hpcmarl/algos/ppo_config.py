"""The keys of PPO and its presets mappo and ippo (`learner.ppo`) and their checks, beside its
code (ppo.py).

`algos.catalog` reads IMPL, SECTION, ON_POLICY, ITEMS, CONFIG, RULES and ORDERED (a plugin class
declares the same as attributes). Torch-free, so that reading a job (the schema, validation,
`--explain`) imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmarl.limits import Rule, above, at_least, one_of, within

IMPL = "hpcmarl.algos.ppo:PPO"
"""The implementation, imported when a role needs it."""
SECTION = "ppo"
"""Its keys are `learner.ppo.*`."""
ON_POLICY = True
ITEMS = "fragment"
PSRO_ORACLE = True
"""It can be PSRO's best-response oracle: its action distribution, frozen, is what it learned."""
CONTINUOUS_ACTIONS = True
"""It acts in Box action spaces too, with a diagonal Gaussian actor (`actors.GaussianActor`)."""


@dataclass
class PPOConfig:
    """PPO's own keys (`learner.algo: ppo`, or the presets `mappo` and `ippo`): clipped
    surrogate, GAE(lambda), value normalisation, epochs x minibatches per batch, an entropy
    bonus; on-policy fragments served once from FIFO queues."""

    critic: str = "central"
    """`central`: the critic sees the environment's global state (MAPPO); `local`: each agent's
    critic sees only its own observation (IPPO)."""
    actor_agent_id: bool = False
    """Append a one-hot agent index (its place among the agents sharing its policy) to each
    actor's input, so agents that share parameters can still act differently."""
    critic_agent_id: bool = True
    """Append a one-hot agent index to the critic's input, so a shared critic can tell agents
    with different rewards apart."""
    critic_heads: bool = False
    """With the central critic: one pass per env step on the global state, with a value head
    per agent, in place of one pass per agent with its one-hot index (`critic_agent_id`). The
    same inputs, so the same values can be learned, at 1/agents of the critic's compute."""
    batch_fragments: int = 32
    """Fragments (collector.fragment_length steps of one env copy, every agent of the group)
    per update, over all learners of the group; env steps per update = this x fragment_length."""
    epochs: int = 10
    """Passes over each batch."""
    minibatches: int = 1
    """Minibatches per epoch (each one optimizer step)."""
    clip: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    value_clip: float = 0.2
    """Clip range of the value change in the value loss; 0 disables value clipping."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte Carlo."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    value_coef: float = 1.0
    """Weight of the value loss."""
    value_huber_delta: float = 10.0
    """Huber threshold of the value loss (on normalised returns); 0 means squared error."""
    value_norm: bool = True
    """Train the critic on normalised returns (running mean and variance of the targets)."""
    normalize_advantages: bool = True
    """Standardise advantages over each batch."""
    activation: str = "tanh"
    """Hidden activation of actor and critic: `tanh` or `relu`."""
    max_policy_lag: int = 1
    """Versions a fragment may be older than the policy it trains: collectors run ahead of the
    learners by at most this many updates, and older fragments are dropped (and counted)."""


RULES: dict[str, Rule] = {
    "critic": one_of("central", "local"),
    "batch_fragments": at_least(1),
    "epochs": at_least(1),
    "minibatches": at_least(1),
    "clip": above(0),
    "value_clip": at_least(0),
    "gae_lambda": within(0, 1),
    "entropy_coef": at_least(0),
    "value_coef": at_least(0),
    "value_huber_delta": at_least(0),
    "activation": one_of("tanh", "relu"),
    "max_policy_lag": at_least(0),
}
"""The allowed values of the keys that have limits, by key (validation and `--explain`)."""

ORDERED: tuple[tuple[str, str, str], ...] = (
    ("minibatches", "batch_fragments", "each minibatch needs at least one fragment"),
)
"""(smaller, larger, why): keys of this section where the first must not exceed the second
(validation and `--explain`)."""

CONFIG = PPOConfig
