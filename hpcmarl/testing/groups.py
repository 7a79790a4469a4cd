"""Training groups and jobs for tests of algorithms without an environment or MPI."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hpcmarl.algos.contract import GroupSpec
from hpcmarl.config.schema import JobConfig
from hpcmarl.items.spec import ItemSpec


def group_of(
    obs_dim: int, n_actions: int, agents: int = 1, state_dim: int = 0, shared: bool = True
) -> GroupSpec:
    """A group of `agents` agents `a0, a1, ...` with one shared policy (or one each)."""
    names = tuple(f"a{i}" for i in range(agents))
    policy_of = {a: "shared" if shared else a for a in names}
    policies = sorted(set(policy_of.values()))
    return GroupSpec(
        name="shared" if shared else "team",
        agents=names,
        policy_of=policy_of,
        keys={p: f"main/{p}" for p in policies},
        obs_dims=dict.fromkeys(names, obs_dim),
        n_actions=dict.fromkeys(names, n_actions),
        state_dim=state_dim or obs_dim * agents,
        agent_ids={a: i for i, a in enumerate(names)},
    )


def job_with(**settings: Any) -> JobConfig:
    """The default job with `learner` keys set: `lr=...` sets learner.lr, `dqn__double_q=...`
    sets learner.dqn.double_q (any section of `learner`: an algorithm's, `model`),
    `collector__fragment_length=...` sets that top-level section's key."""
    job = JobConfig()
    in_learner = {f.name for f in dataclasses.fields(job.learner)}
    for name, value in settings.items():
        section, _, key = name.rpartition("__")
        owner: Any = job.learner
        if section:
            owner = getattr(job.learner if section in in_learner else job, section)
        if not hasattr(owner, key):
            raise AttributeError(f"no key {name}")
        setattr(owner, key, value)
    return job


def random_items(
    spec: ItemSpec, items: int, n_actions: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """A batch of `items` items of `spec` for tests of updates: normal floats, actions below
    `n_actions`, flags all set except `terminations` (every step real, no episode ending)."""
    rng = np.random.default_rng(seed)
    batch = {}
    for name, dtype, shape in spec.batch_specs(items):
        if np.dtype(dtype) == np.bool_:
            batch[name] = np.full(shape, name != "terminations")
        elif name == "actions":
            batch[name] = rng.integers(0, n_actions, shape)
        else:
            batch[name] = rng.standard_normal(shape).astype(dtype)
    return batch
