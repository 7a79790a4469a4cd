"""Offline datasets: every row reaches exactly one shard, rows follow the job's policy mapping,
and a dataset that cannot train is refused before any work with the cause and the fix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hpcmarl.algos.actors import build_actor
from hpcmarl.algos.bc import BehaviourCloning
from hpcmarl.algos.contract import run_update
from hpcmarl.algos.registry import check_job
from hpcmarl.analysis.synthetic import write_synthetic_log
from hpcmarl.config.loader import load_job
from hpcmarl.errors import ConfigError, UserError
from hpcmarl.launch.build import EnvSpec
from hpcmarl.replay.offline import BATCH_COLUMNS, check_dataset, load_share
from hpcmarl.replay.table import ReplayTable
from hpcmarl.roles.state_tree import nest
from hpcmarl.storage import write_tree_atomic
from hpcmarl.testing.groups import group_of

AGENTS = ["a", "b"]
SHARED = {"a": "shared", "b": "shared"}
INDEPENDENT = {"a": "pa", "b": "pb"}


def spec(policy_of: dict[str, str], obs_dim: int = 3, n_actions: int = 3) -> EnvSpec:
    return EnvSpec(
        AGENTS, dict.fromkeys(AGENTS, obs_dim), dict.fromkeys(AGENTS, n_actions), policy_of
    )


def job(dataset: Path | str, *overrides: str):
    return load_job(
        None,
        [
            "env.id=Synthetic-v0",
            f"offline.dataset={dataset}",
            "commander.max_updates=100",
            *overrides,
        ],
    )


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """A run directory with two collectors' logs of a two-agent env with shared weights."""
    folder = tmp_path / "run" / "replay"
    folder.mkdir(parents=True)
    for k in range(2):
        write_synthetic_log(folder / f"collector{k}.h5", agents=tuple(AGENTS), seed=k)
    return folder.parent


def rows_of(batches: list[dict[str, np.ndarray]]) -> Counter:
    """Each row as (agent, episode, step, first observation value): a multiset to compare."""
    out: Counter = Counter()
    for b in batches:
        keys = zip(b["agent_id"], b["episode_id"], b["step"], b["observations"][:, 0], strict=True)
        out.update((int(a), int(e), int(s), float(o)) for a, e, s, o in keys)
    return out


def whole_dataset(logs: Path) -> list[dict[str, np.ndarray]]:
    return [batch for _, batch in load_share(str(logs), spec(SHARED), 0, 1)]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shares_hold_every_row_once_and_every_shard_some(logs: Path, shards: int) -> None:
    everything = rows_of(whole_dataset(logs))
    assert sum(everything.values()) == 2 * 2 * 20 * 8 * 2  # logs * agents * frags * len * envs
    got: Counter = Counter()
    sizes = []
    for index in range(shards):
        share = [b for p, b in load_share(str(logs), spec(SHARED), index, shards)]
        assert set(share[0]) == set(BATCH_COLUMNS)
        sizes.append(sum(len(b["rewards"]) for b in share))
        got += rows_of(share)
    assert got == everything
    assert max(sizes) - min(sizes) <= 1


def test_rows_follow_the_jobs_mapping_not_the_files(logs: Path) -> None:
    by_policy: dict[str, list] = {"pa": [], "pb": []}
    for policy, batch in load_share(str(logs), spec(INDEPENDENT), 1, 2):
        by_policy[policy].append(batch)
    assert {int(a) for b in by_policy["pa"] for a in b["agent_id"]} == {0}
    assert {int(a) for b in by_policy["pb"] for a in b["agent_id"]} == {1}
    counts = check_dataset(job(logs, "agents.mapping=independent"), spec(INDEPENDENT))
    assert counts == {"pa": 640, "pb": 640}


def checkpoint_file(folder: Path, batches: list[dict[str, np.ndarray]], capacity: int) -> Path:
    """A replay shard's checkpoint file with one shared table that mixes both agents."""
    table = ReplayTable(capacity, prioritized=True)
    for batch in batches:
        table.insert(batch)
    folder.mkdir(parents=True)
    path = folder / "replay0.h5"
    tree = {"tables": {"shared": nest(table.state())}, "samples_served": 0}
    write_tree_atomic(path, tree, "role_state", {"role": "replay0"})
    return path


def test_a_mixed_checkpoint_table_is_split_by_agent_in_order(logs: Path, tmp_path: Path) -> None:
    batches = whole_dataset(logs)
    path = checkpoint_file(tmp_path / "ckpt", batches, capacity=1000)  # the ring cut the oldest
    held = rows_of(batches) - Counter()
    loaded = {p: [] for p in ("pa", "pb")}
    for index in range(2):
        for policy, batch in load_share(str(path), spec(INDEPENDENT), index, 2):
            loaded[policy].append(batch)
    assert sum(len(b["rewards"]) for bs in loaded.values() for b in bs) == 1000
    assert rows_of(loaded["pa"]) + rows_of(loaded["pb"]) <= held
    assert {int(a) for b in loaded["pb"] for a in b["agent_id"]} == {1}
    # the shards' shares are consecutive stretches of each agent's rows in table order
    alone = [b for p, b in load_share(str(path), spec(INDEPENDENT), 0, 1) if p == "pa"]
    in_order = np.concatenate([b["observations"] for b in alone])
    shared_out = np.concatenate([b["observations"] for b in loaded["pa"]])
    np.testing.assert_array_equal(shared_out, in_order)
    counts = check_dataset(job(path, "agents.mapping=independent"), spec(INDEPENDENT))
    assert sum(counts.values()) == 1000


def refusal(dataset: Path | str, policy_of=SHARED, *overrides: str, **spec_kw) -> str:
    with pytest.raises(UserError) as err:
        check_dataset(job(dataset, *overrides), spec(policy_of, **spec_kw))
    return err.value.message()


def test_refusals_name_the_cause_and_the_fix(logs: Path, tmp_path: Path) -> None:
    assert "does not exist; fix: give a replay file" in refusal(tmp_path / "nope")
    msg = refusal(logs, SHARED, "commander.max_updates=0")
    assert "max_env_steps never stops it; fix: set commander.max_updates" in msg
    msg = refusal(logs, SHARED, "replay.table_capacity=500", "replay.learning_starts=10")
    assert "1280 transitions of policy shared: 640 per replay shard, above" in msg
    assert "fix: set replay.table_capacity=640 or topology.replay_shards=3" in msg
    assert "observations of shape [3], agent a of Synthetic-v0 observes 4" in refusal(
        logs, obs_dim=4
    )
    assert "holds actions up to 2, agent a of Synthetic-v0 has 2" in refusal(logs, n_actions=2)
    with pytest.raises(UserError, match="recorded in Synthetic-v0, the job runs CartPole-v1"):
        cartpole = load_job(None, [f"offline.dataset={logs}", "commander.max_updates=9"])
        check_dataset(cartpole, spec(SHARED))
    broken = tmp_path / "broken.h5"
    broken.write_bytes((logs / "replay" / "collector0.h5").read_bytes()[:5000])
    assert "fix:" in refusal(broken)


def test_behaviour_cloning_needs_a_dataset_and_others_refuse_one(tmp_path: Path) -> None:
    cfg = load_job(None, ["learner.algo=bc"])
    with pytest.raises(ConfigError, match="bc imitates a dataset.*fix: set offline.dataset"):
        check_job(cfg, {"shared": ["shared"]})
    ppo = load_job(None, ["learner.algo=mappo", f"offline.dataset={tmp_path}"])
    with pytest.raises(ConfigError, match="learns on-policy.*fix: use learner.algo=dqn or bc"):
        check_job(ppo, {"shared": ["shared"]})
    qmix = load_job(None, ["learner.algo=qmix", f"offline.dataset={tmp_path}"])
    with pytest.raises(ConfigError, match="episodes of a team.*fix: use learner.algo=dqn or bc"):
        check_job(qmix, {"shared": ["shared"]})
    n_step = load_job(None, ["learner.dqn.n_step=3", f"offline.dataset={tmp_path}"])
    with pytest.raises(ConfigError, match="one-step transitions.*fix: drop learner.dqn.n_step"):
        check_job(n_step, {"shared": ["shared"]})


def test_behaviour_cloning_learns_the_datasets_actions() -> None:
    job = load_job(None, ["learner.hidden_sizes=[32]", "learner.lr=0.01"])
    bc = BehaviourCloning(group_of(4, 3), job, seed=0)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((2048, 4)).astype(np.float32)
    actions = np.digitize(obs[:, 0] + obs[:, 1], [-0.5, 0.5]).astype(np.int64)
    for _ in range(400):
        rows = rng.integers(0, len(obs), 64)
        result = run_update(bc, {"observations": obs[rows], "actions": actions[rows]})
        errors = result.priorities
        assert errors is not None and errors.shape == (64,) and (errors >= 0).all()
    assert result.stats["accuracy"] > 0.9
    (policy,) = BehaviourCloning.policy_specs(bc.group, job).values()
    actor = build_actor(policy)
    actor.set_weights(bc.publish()[policy.key])
    greedy = actor.act(obs, rng, env_steps=0, greedy=False).actions  # epsilon 0: BC's actor
    assert (greedy == actions).mean() > 0.9
    restored = BehaviourCloning(group_of(4, 3), job, seed=1)
    restored.load_state_dict(bc.state_dict())
    np.testing.assert_array_equal(restored.group_weights(), bc.group_weights())
    assert restored.updates == 400


def test_an_env_with_masks_needs_them_in_the_dataset(logs: Path, tmp_path: Path) -> None:
    """A masked env's items carry the masks: a dataset without them is refused, one with them
    hands them on."""
    masked = EnvSpec(AGENTS, dict.fromkeys(AGENTS, 3), dict.fromkeys(AGENTS, 3), SHARED)
    masked.action_masks = True
    with pytest.raises(UserError, match="no action_masks, next_action_masks columns"):
        list(load_share(str(logs), masked, 0, 1))
    batches = whole_dataset(logs)
    for batch in batches:
        rows = len(batch["rewards"])
        batch["action_masks"] = np.ones((rows, 3), bool)
        batch["next_action_masks"] = np.arange(rows * 3).reshape(rows, 3) % 2 == 0
    path = checkpoint_file(tmp_path / "ck", batches, capacity=4096)
    share = [b for _, b in load_share(str(path), masked, 0, 1)]
    assert {"action_masks", "next_action_masks"} <= set(share[0])
    assert share[0]["next_action_masks"].dtype == bool
