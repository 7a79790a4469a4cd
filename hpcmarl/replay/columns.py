"""The columns of a batch (DESIGN.md §3): what collectors build, shards hold and files store."""

from __future__ import annotations

TRANSITION_COLUMNS = (
    "observations",
    "actions",
    "rewards",
    "next_observations",
    "terminations",
    "truncations",
)
"""One step of one agent: what a learner trains on."""
BOOKKEEPING_COLUMNS = ("agent_id", "episode_id", "step", "policy_version")
"""Where the step came from: the agent, its episode, the step in it, the weights that acted."""
BATCH_COLUMNS = TRANSITION_COLUMNS + BOOKKEEPING_COLUMNS
