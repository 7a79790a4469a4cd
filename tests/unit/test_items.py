"""Item specs: JSON and packing round trips, and the writers that cut steps into items."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.algos.dqn import DQN
from hpcmarl.algos.ppo import PPO
from hpcmarl.comm.packing import pack, views
from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.items.spec import Column, ItemSpec, ReplaySpec
from hpcmarl.items.writers import FragmentWriter, StepRecord, TransitionWriter, fill_runs
from hpcmarl.testing.groups import group_of, job_with

EARLY_EXIT = EnvConfig(kind="pettingzoo", id="hpcmarl.testing.early_exit")


def fragment_spec() -> ItemSpec:
    columns = (
        Column("observations", "<f4", (3,)),
        Column("actions", "<i8"),
        Column("state", "<f4", (6,), per="group"),
        Column("active", "|b1"),
    )
    return ItemSpec("fragment", columns, agents=2, length=4, replay=ReplaySpec("fifo", 2))


def test_json_round_trip_keeps_every_field() -> None:
    spec = fragment_spec()
    assert ItemSpec.from_json(spec.to_json()) == spec
    job = job_with(collector__fragment_length=7)
    for algo in (DQN, PPO):
        declared = algo.item_spec(group_of(3, 4, agents=2), job)
        assert ItemSpec.from_json(declared.to_json()) == declared


def test_packing_round_trip_is_one_buffer_with_the_declared_shapes() -> None:
    spec = fragment_spec()
    rng = np.random.default_rng(0)
    batch = {
        name: (rng.random(shape) * 10).astype(dtype) for name, dtype, shape in spec.batch_specs(5)
    }
    assert batch["observations"].shape == (5, 4, 2, 3) and batch["state"].shape == (5, 4, 6)
    assert spec.check(batch) == 5
    packed = pack(batch)
    back = views(packed.buffer.copy(), packed.layout)
    for name in spec.names:
        np.testing.assert_array_equal(back[name], batch[name])
    wrong = dict(batch, state=batch["state"][:, :, :5])
    with pytest.raises(
        ValueError, match="'state' is float32\\[5, 4, 5\\].*wants float32\\[5, 4, 6\\]"
    ):
        spec.check(wrong)


def records(
    steps: int, num_envs: int = 2, seed: int = 0, versions: dict[str, int] | None = None
) -> list[StepRecord]:
    """Real steps of the early-exit env: `quitter` finishes after 3 steps, `runner` after 8;
    every agent acts with weight version 3 unless `versions` says otherwise."""
    env = make_vector_env(EARLY_EXIT, num_envs, seed, with_state=True)
    obs, out = env.reset(), []
    ids, lengths = np.arange(num_envs, dtype=np.int64), np.zeros(num_envs, np.int32)
    for _ in range(steps):
        state = env.states
        actions = {a: np.ones(num_envs, np.int64) for a in env.agents}
        step = env.step(actions)
        log_probs = {a: {"log_probs": np.full(num_envs, -0.5, np.float32)} for a in env.agents}
        acted = versions or dict.fromkeys(env.agents, 3)
        out.append(
            StepRecord(obs, actions, step, ids.copy(), lengths.copy(), acted, state, log_probs)
        )
        lengths = np.where(step.episode_ended, 0, lengths + 1).astype(np.int32)
        obs = step.observations
    return out


def test_transition_writer_drops_the_padding_of_a_finished_agent() -> None:
    group = group_of(3, 2, agents=2)
    spec = DQN.item_spec(group, job_with())
    agent_ids = {"quitter": 0, "runner": 1}
    writer = TransitionWriter(spec, ["quitter", "runner"], agent_ids, num_envs=2, length=8)
    for record in records(8):
        writer.add(record)
        writer.advance()
    batch = writer.batch()
    assert spec.check(batch) == 2 * (3 + 8)  # 2 copies x (3 quitter steps + 8 runner steps)
    assert (batch["observations"][:, 0] == 1.0).all()  # no zero padding rows left
    assert (np.bincount(batch["agent_id"]) == [6, 16]).all()
    assert batch["terminations"][batch["agent_id"] == 0].sum() == 2


def test_fragment_writer_keeps_every_step_and_marks_who_was_active() -> None:
    spec = fragment_spec()
    spec = ItemSpec(
        "fragment",
        (
            *spec.columns,
            Column("log_probs", "<f4"),
            Column("next_state", "<f4", (6,), per="group"),
            Column("policy_version", "<i8", per="group"),
        ),
        agents=2,
        length=8,
    )
    writer = FragmentWriter(spec, ["quitter", "runner"], {"quitter": 0, "runner": 1}, 2, 8)
    steps = records(8)
    for record in steps:
        writer.add(record)
        writer.advance()
    batch = writer.batch()
    assert spec.check(batch) == 2
    assert batch["active"][:, :, 0].sum(axis=1).tolist() == [3, 3]  # the quitter acts 3 steps
    assert batch["active"][:, :, 1].all()
    np.testing.assert_array_equal(batch["state"][:, 0], steps[0].state)
    np.testing.assert_array_equal(batch["next_state"][:, 7], steps[7].step.next_states)
    assert (batch["policy_version"] == 3).all() and (batch["log_probs"] == -0.5).all()


def test_a_groups_fragments_carry_its_own_version_not_a_frozen_opponents() -> None:
    # PSRO: the learning player's group at version 5 shares the env with a frozen opponent
    # whose policy stays at version 1. Each group's fragments carry its own agents' version;
    # the minimum over the env made every fragment of the learner look 4 versions stale.
    spec = ItemSpec(
        "fragment",
        (Column("actions", "<i8"), Column("policy_version", "<i8", per="group")),
        agents=1,
        length=4,
    )
    agent_ids = {"quitter": 0, "runner": 1}
    learning = FragmentWriter(spec, ["quitter"], agent_ids, num_envs=2, length=4)
    frozen = FragmentWriter(spec, ["runner"], agent_ids, num_envs=2, length=4)
    for record in records(4, versions={"quitter": 5, "runner": 1}):
        for writer in (learning, frozen):
            writer.add(record)
            writer.advance()
    assert learning.batch()["policy_version"].tolist() == [[5] * 4] * 2
    assert frozen.batch()["policy_version"].tolist() == [[1] * 4] * 2


def two_agent_writer(kind: str) -> TransitionWriter | FragmentWriter:
    """A writer of the early-exit env's two agents, 2 env copies, 8 steps a fragment: DQN's
    transitions, or fragments with a group's weight version."""
    agents, agent_ids = ["quitter", "runner"], {"quitter": 0, "runner": 1}
    if kind == "transition":
        spec = DQN.item_spec(group_of(3, 2, agents=2), job_with())
        return TransitionWriter(spec, agents, agent_ids, 2, 8)
    spec = ItemSpec(
        "fragment",
        (*fragment_spec().columns, Column("policy_version", "<i8", per="group")),
        agents=2,
        length=8,
    )
    return FragmentWriter(spec, agents, agent_ids, 2, 8)


@pytest.mark.parametrize("kind", ["transition", "fragment"])
def test_a_batch_keeps_its_values_while_the_writer_fills_the_next(kind: str) -> None:
    # The writers keep one stage for their life and copy it into each fragment's own buffer:
    # a batch in flight must not see the next fragment's steps.
    agents = ["quitter", "runner"]
    writer = two_agent_writer(kind)
    batches, kept = [], []
    for fragment, version in enumerate((3, 4)):
        for record in records(8, seed=fragment, versions=dict.fromkeys(agents, version)):
            writer.add(record)
            writer.advance()
        batches.append(writer.batch())
        kept.append({name: column.copy() for name, column in batches[-1].items()})
        writer.reset()
    for batch, copy in zip(batches, kept, strict=True):
        assert batch.keys() == copy.keys()
        for name in copy:
            np.testing.assert_array_equal(batch[name], copy[name])
    assert (kept[0]["policy_version"] == 3).all() and (kept[1]["policy_version"] == 4).all()


def test_fill_runs_writes_each_step_its_own_value_across_every_env_copy() -> None:
    target = np.zeros((2, 8), np.int64)  # [copy, step]
    fill_runs(target, 2, [3, 3, 4, 4, 4])
    assert target.tolist() == [[0, 0, 3, 3, 4, 4, 4, 0]] * 2


@pytest.mark.parametrize("kind", ["transition", "fragment"])
def test_versions_that_change_within_a_fragment_land_on_their_steps(kind: str) -> None:
    # Versions are kept per step as Python ints and written a run of steps at a time
    # (RUN_COLUMNS): new weights arrive at step 3, and a fragment cut short keeps its steps.
    agents = ["quitter", "runner"]
    writer = two_agent_writer(kind)
    steps, versions = records(8), [3] * 3 + [4] * 5
    for t, record in enumerate(steps):
        record.versions = dict.fromkeys(agents, versions[t])
        writer.add(record)
        writer.advance()
    batch = writer.batch()
    if kind == "fragment":
        assert batch["policy_version"].tolist() == [versions] * 2
        return
    kept = [
        versions[t]
        for agent in agents
        for c in range(2)
        for t in range(8)
        if steps[t].step.active[agent][c]
    ]
    assert batch["policy_version"].tolist() == kept
