"""A trained policy taken out of a run: `hpcmarl.load_policy(RUN_DIR)`, no MPI, no job.

A run's policies live in its checkpoints as the parameter servers saved them: a flat weight
vector and the `PolicySpec` that says how to build the network it fills. This module is the one
place that turns such an entry back into an acting network (`actor_of`, which `evaluate` uses
too), and wraps it for use outside hpcmarl: `Policy.act` for a notebook or a game loop,
`Policy.module` for torch code and for export (`policy_export.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .algos.actors import build_actor
from .algos.contract import Actor, PolicySpec
from .errors import UserError
from .storage.policies import PolicyEntry, chosen_checkpoint, policy_tables

__all__ = ["Policy", "actor_of", "load_policy"]

LAST_EXPLORATION_STEP = 1 << 62
"""The env-step count sampled actions are taken at: past any decay, so an epsilon-greedy
policy explores at its final epsilon."""


def actor_of(entry: PolicyEntry) -> Actor:
    """The actor a collector would build for this policy, holding its trained weights."""
    actor = build_actor(PolicySpec.from_json(entry.spec_json))
    actor.set_weights(entry.weights)
    return actor


class Policy:
    """One trained policy: `act` on observations, `module` for torch (its parameters frozen).

    Observations are a batch [B, ...] (flattened to the spec's width) or a single observation,
    which gives a single action. A recurrent policy (`recurrent` > 0) takes the state its last
    call returned (None: the start of an episode) and returns `(actions, state)`."""

    def __init__(
        self, entry: PolicyEntry, checkpoint: str, rng: np.random.Generator | None = None
    ) -> None:
        self.actor: Any = actor_of(entry)
        self.spec: PolicySpec = self.actor.spec
        self.key = entry.key
        self.version = entry.version
        """How many times the learners had published this policy when it was saved."""
        self.checkpoint = checkpoint
        self.rng = rng if rng is not None else np.random.default_rng()
        """Draws the sampled actions (`act(..., sample=True)`)."""

    @property
    def module(self) -> Any:
        """The torch network (`torch.nn.Module`): an MLP from the (flattened) observation, with
        the one-hot agent index appended when `spec.agent_ids`, to one score per action
        (Q-values or logits); a recurrent policy's is `algos.networks.RecurrentQNet`."""
        return self.actor.net

    @property
    def recurrent(self) -> int:
        """Width of the recurrent state (0: a feed-forward policy)."""
        return self.spec.recurrent

    def act(
        self,
        observations: Any,
        legal_mask: Any = None,
        state: np.ndarray | None = None,
        *,
        sample: bool = False,
        agent_index: Any = None,
    ) -> Any:
        """Actions (int64, or for a continuous policy float32 [B, action_dim] clipped to its
        bounds) for `observations`: greedy by default (a Gaussian policy's mean); with
        `sample`, drawn as in training (softmax or Gaussian sampling, or epsilon-greedy at the
        final epsilon). `legal_mask`
        (bool [B, n_actions]) rules actions out; `agent_index` ([B]) is needed by a policy
        shared by agents told apart by index (`spec.agent_ids`)."""
        obs, single = self._batch(observations)
        mask = None if legal_mask is None else np.asarray(legal_mask, bool).reshape(len(obs), -1)
        index = None if agent_index is None else np.asarray(agent_index, np.int64).reshape(-1)
        if state is not None:
            state = np.asarray(state, np.float32).reshape(len(obs), self.recurrent)
        result = self.actor.act(
            obs,
            self.rng,
            env_steps=LAST_EXPLORATION_STEP,
            greedy=not sample,
            action_mask=mask,
            recurrent_state=state,
            agent_index=index,
        )
        actions = result.actions
        if self.spec.action_box:  # as the env adapters step a continuous policy's actions
            actions = np.clip(actions, *self.spec.action_box).astype(np.float32)
        actions = actions[0] if single else actions
        if not self.recurrent:
            return actions
        next_state = result.recurrent_state
        return actions, next_state[0] if single else next_state

    def _batch(self, observations: Any) -> tuple[np.ndarray, bool]:
        obs = np.asarray(observations, np.float32)
        single = obs.size == self.spec.obs_dim and obs.ndim <= 1
        obs = obs.reshape(1 if single else len(obs), -1)
        if obs.shape[1] != self.spec.obs_dim:
            raise ValueError(
                f"policy {self.key} takes observations of {self.spec.obs_dim} values, got an "
                f"array of shape {np.shape(observations)}; pass a batch [B, ...] of them"
            )
        return obs, single

    def __repr__(self) -> str:
        return (
            f"Policy({self.key!r}, {self.spec.actor}, obs {self.spec.obs_dim} -> "
            f"{self.spec.n_actions} actions, version {self.version}, checkpoint {self.checkpoint})"
        )


def load_policy(
    run_dir: str | Path, policy_id: str | None = None, checkpoint: str | None = None
) -> Policy:
    """The trained policy `policy_id` of a run, from its newest intact checkpoint (or the one
    named). `policy_id` is a key (`main/shared`) or its policy part (`shared`); None when the
    run has one policy."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} holds no config.yaml: not a run directory", "name a RUN_DIR")
    ckpt = chosen_checkpoint(run_dir, checkpoint)
    tables = policy_tables(ckpt)
    return Policy(tables[_key_of(policy_id, tables, ckpt.id, run_dir)], ckpt.id)


def _key_of(policy_id: str | None, tables: dict[str, PolicyEntry], ckpt: str, run: Path) -> str:
    keys = sorted(tables)
    held = ", ".join(keys) or "none"
    if policy_id is None and len(keys) == 1:
        return keys[0]
    matches = [k for k in keys if policy_id in (k, k.split("/", 1)[1])]
    if policy_id is not None and len(matches) == 1:
        return matches[0]
    if not keys:
        cause = f"checkpoint {ckpt} of {run} holds no published policy"
        fix = "use a later checkpoint, after the learners first published"
    elif policy_id is None:
        cause = f"{run} has {len(keys)} policies ({held})"
        fix = "name one as policy_id"
    else:
        cause = f"checkpoint {ckpt} of {run} holds no policy {policy_id!r} (it holds: {held})"
        fix = "name one of those (a full key where a policy id is in several)"
    raise UserError(cause, fix)
