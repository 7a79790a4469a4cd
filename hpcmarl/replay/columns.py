"""The columns of a transition batch (DESIGN.md §3): what collectors build, shards hold and
files store, declared once with their types."""

from __future__ import annotations

import numpy as np

from hpcmarl.items.spec import Column


def transition_columns(
    obs_dim: int, obs: str = "<f4", action_dim: int | None = None
) -> tuple[Column, ...]:
    """One agent's step: what DQN and BC learn from, and what replay logs hold; `obs` is the
    observations' dtype (`GroupSpec.obs_dtype`: uint8 for image spaces), `action_dim` the
    width of float32 action vectors for continuous actions (None: one int64 action index;
    only replay logs of PPO's continuous runs hold them)."""
    action = (
        Column("actions", "<i8") if action_dim is None else Column("actions", "<f4", (action_dim,))
    )
    return (
        Column("observations", obs, (obs_dim,)),
        action,
        Column("rewards", "<f4"),
        Column("next_observations", obs, (obs_dim,)),
        Column("terminations", "|b1"),
        Column("truncations", "|b1"),
        Column("agent_id", "<i2"),
        Column("episode_id", "<i8", per="group"),
        Column("step", "<i4", per="group"),
        Column("policy_version", "<i8"),
    )


def mask_columns(n_actions: int) -> tuple[Column, ...]:
    """The legal actions where the agent acted and at s', for envs that supply masks: the
    masked max of DQN's target needs the second; the first records what the actor chose from."""
    return (
        Column("action_masks", "|b1", (n_actions,)),
        Column("next_action_masks", "|b1", (n_actions,)),
    )


def obs_in(state: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """A table's or a batch's flat state with its observations in `dtype`: a checkpoint of an
    image env written before observations were stored as uint8 holds them as float32 rows of
    the values 0-255, which a resumed table (now fed uint8) takes back exactly as uint8."""
    if np.dtype(dtype) != np.uint8:
        return state
    return {k: v.astype(np.uint8) if _holds_obs(k, v) else v for k, v in state.items()}


def _holds_obs(key: str, value: np.ndarray) -> bool:
    """Observations under any stored name: the columns (`observations`, `next_observations`,
    a compact item's `observations_head`, `final_next_observations`) and a compact transition
    table's side stores of frames."""
    name = key.rsplit("/", 2)
    stored = "observations" in name[-1] or "/".join(name[-2:]) in _FRAME_STORES
    return stored and value.dtype == np.float32


_FRAME_STORES = ("first_stacks/values", "next_frames/values")

BATCH_COLUMNS = tuple(c.name for c in transition_columns(1))
"""Every column of a transition row."""
TRANSITION_COLUMNS = BATCH_COLUMNS[:6]
"""One step of one agent: what a learner trains on."""
BOOKKEEPING_COLUMNS = BATCH_COLUMNS[6:]
"""Where the step came from: the agent, its episode, the step in it, the weights that acted."""
MASK_COLUMNS = tuple(c.name for c in mask_columns(1))
"""Legal-action masks, present only for envs that supply them."""
