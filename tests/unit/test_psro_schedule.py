"""The PSRO schedule behind the commander's seam, driven by hand through whole iterations:
which tasks it grants in each phase, what it adds to the population, when it stops, and that
a checkpoint of its state taken mid-iteration resumes the same iteration."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from hpcmarl.algos.contract import PolicySpec
from hpcmarl.config.loader import load_job
from hpcmarl.schedules import PSRO, Context, Grant, Situation

COLLECTORS = ("collector0", "collector1")
LEARNERS = ("learner0", "learner1")


def context(*overrides: str) -> Context:
    cfg = load_job(
        "jobs/kuhn_psro.yaml",
        [
            "psro.steps_per_iteration=1000",
            "psro.updates_per_iteration=150",
            "learner.updates_per_task=100",
            "psro.eval_episodes=10",
            *overrides,
        ],
    )
    return context_of(cfg, "epsilon_greedy")


def context_of(cfg: Any, actor: str) -> Context:
    groups = {"player_0": ("learner0",), "player_1": ("learner1",)}
    keys = {g: (f"main/{g}",) for g in groups}
    bindings = {g: f"main/{g}" for g in groups}
    spec = PolicySpec("main/player_0", actor, 11, 2, (64,))
    specs = {k: replace(spec, key=k) for k in bindings.values()}
    return Context(cfg, COLLECTORS, ("replay0",), groups, bindings, keys, specs)


def situation(collectors: tuple[str, ...] = COLLECTORS, learners=LEARNERS) -> Situation:
    return Situation(
        now=0.0,
        env_steps=0,
        updates=0,
        waiting_collectors=collectors,
        waiting_learners=frozenset(learners),
        running=0,
        collector_slots=len(collectors),
        replay_sizes={},
    )


def finish(schedule: PSRO, grant: Grant, **report: Any) -> None:
    """Report a granted task as done, with what its role would say."""
    task = grant.task
    kind = task.get("kind", "learn")
    if kind == "collect":
        report = {"collect": {"env_steps": 512}}
    elif kind == "learn":
        report = {"stats": {"groups": report.get("groups", {})}}
    elif kind == "matchup":
        n = task["episodes"]
        report = {"matchup": {"n": n, "sums": [n * 0.5, -n * 0.5], "sq": [n * 1.0, n * 1.0]}}
    elif kind == "exploitability":
        report = {"exploitability": {"exploitability": 0.25, "nash_conv": 0.5}}
    schedule.on_task_done(grant.role, kind, {"task_id": task["task_id"], **report})


def run_phase(schedule: PSRO, phase: str) -> list[Grant]:
    """Grant and finish tasks until the schedule leaves `phase`; every grant made."""
    made: list[Grant] = []
    for _ in range(200):
        if schedule.phase != phase:
            return made
        grants = schedule.grants(situation())
        assert grants, f"nothing granted in phase {phase}"
        made += grants
        for grant in grants:
            version = {"version": 3} if grant.role.startswith("learner") else {}
            group = "player_0" if grant.role == "learner0" else "player_1"
            finish(schedule, grant, groups={group: version} if version else {})
    raise AssertionError(f"phase {phase} never ended")


def test_iteration_zero_evaluates_and_scores_the_first_policies() -> None:
    schedule = PSRO(context())
    grants = run_phase(schedule, "evaluate")
    assert [g.task["kind"] for g in grants] == ["matchup"]
    assert grants[0].task["bindings"] == {"player_0": "main/player_0", "player_1": "main/player_1"}
    assert grants[0].task["versions"] == {"main/player_0": 1, "main/player_1": 1}
    grants = run_phase(schedule, "score")
    assert [g.task["kind"] for g in grants] == ["exploitability"]
    assert grants[0].task["populations"] == [["main/player_0"], ["main/player_1"]]
    assert schedule.phase == "between"
    ((kind, row),) = schedule.records()
    assert kind == "psro" and row["iteration"] == 0 and row["exploitability"] == 0.25
    assert row["population"] == [1, 1] and row["payoffs"] == [[0.5]]
    assert "psro iteration 0: exploitability 0.2500" in schedule.lines()[0]


def test_an_iteration_adds_policies_retargets_trains_and_fills_the_new_entries() -> None:
    schedule = PSRO(context())
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    grants = schedule.grants(situation())
    added = schedule.additions()
    assert [(s.key, g) for s, g in added] == [
        ("main/player_0-1", "player_0"),
        ("main/player_1-1", "player_1"),
    ]
    assert [g.task["updates"] for g in grants] == [0, 0]
    assert grants[0].task["train"] == {
        "player_0": {"keys": {"player_0": "main/player_0-1"}, "generation": 1}
    }
    for grant in grants:
        finish(schedule, grant, groups={})
    assert schedule.phase == "train"

    grants = run_phase(schedule, "train")
    collects = [g.task for g in grants if g.task.get("kind") == "collect"]
    learns = [g.task for g in grants if g.task.get("kind") != "collect"]
    # The players take turns learning; the other plays its (only) old policy greedily.
    assert collects[0]["record"] == ["player_0"] and collects[1]["record"] == ["player_1"]
    assert collects[0]["bindings"] == {"player_0": "main/player_0-1", "player_1": "main/player_1"}
    assert collects[0]["greedy"] == ["main/player_1"] and collects[0]["fresh"]
    assert all(t["generation"] == 1 for t in collects)
    assert sum(t["env_steps"] for t in collects) == 0 or collects[-1]["env_steps"] > 0
    # Each crew gets updates_per_iteration updates in all, in tasks of updates_per_task.
    assert sorted(t["updates"] for t in learns) == [50, 50, 100, 100]

    grants = run_phase(schedule, "evaluate")
    entries = sorted(tuple(schedule_entry(g)) for g in grants)
    assert entries == [(0, 1), (1, 0), (1, 1)]  # the new row and column only
    assert all(g.task["versions"].get("main/player_0-1", 3) == 3 for g in grants)
    run_phase(schedule, "score")
    rows = schedule.records()
    assert rows[-1][1]["iteration"] == 1 and rows[-1][1]["population"] == [2, 2]


def test_a_crew_learns_only_once_data_of_the_iteration_is_bound_for_its_tables() -> None:
    """A learner task granted before any collect task of its player finished would wait on
    an empty table; if a checkpoint quiesced the run then (no new collect tasks), it could
    never finish, and the checkpoint would wait for it until the time limit (Slurm PSRO)."""
    schedule = PSRO(context())
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    for grant in schedule.grants(situation()):
        finish(schedule, grant, groups={})
    first = schedule.grants(situation())
    assert [g.role for g in first] == list(COLLECTORS)  # both collect; no learner yet
    player_0 = next(g for g in first if g.task["record"] == ["player_0"])
    finish(schedule, player_0)
    assert [g.role for g in schedule.grants(situation(collectors=()))] == ["learner0"]
    finish(schedule, next(g for g in first if g.task["record"] == ["player_1"]))
    busy_learner0 = situation(collectors=(), learners=("learner1",))
    assert [g.role for g in schedule.grants(busy_learner0)] == ["learner1"]


def test_a_crew_is_granted_updates_as_its_players_data_comes_in() -> None:
    """Its quota in proportion to its player's share of the iteration's steps (2,048 of 4,096
    here, 512 per collect task): a learner faster than its collectors spreads its updates over
    the iteration's data instead of spending them on its first, most exploratory steps."""
    schedule = PSRO(context("psro.steps_per_iteration=4096", "psro.updates_per_iteration=400"))
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    for grant in schedule.grants(situation()):
        finish(schedule, grant, groups={})
    learner0_only = situation(collectors=(), learners=("learner0",))
    for collected in (512, 1024):
        collect = next(
            g for g in schedule.grants(situation(learners=())) if g.task["record"] == ["player_0"]
        )
        finish(schedule, collect)
        assert schedule.steps[0] == collected
        (learn,) = schedule.grants(learner0_only)  # 400 x collected / 2048 = 100 more
        assert learn.role == "learner0" and learn.task["updates"] == 100
        finish(schedule, learn, groups={"player_0": {"version": 2}})
        assert schedule.grants(learner0_only) == []  # the next 100 wait for the next 512 steps


def test_a_task_wrapped_up_early_leaves_its_unapplied_updates_in_the_quota() -> None:
    """A checkpoint ends a learner task after the update in flight (`wrap_up`): the updates
    it never applied are granted again, so the iteration still trains its whole quota."""
    schedule = PSRO(context("psro.steps_per_iteration=1024", "psro.updates_per_iteration=100"))
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    for grant in schedule.grants(situation()):
        finish(schedule, grant, groups={})
    learner0_only = situation(collectors=(), learners=("learner0",))
    collect = next(
        g for g in schedule.grants(situation(learners=())) if g.task["record"] == ["player_0"]
    )
    finish(schedule, collect)
    (learn,) = schedule.grants(learner0_only)
    assert learn.task["updates"] == 100
    finish(schedule, learn, groups={"player_0": {"version": 2, "unfinished": 70}})
    (again,) = schedule.grants(learner0_only)
    assert again.task["updates"] == 70


def run_iteration(schedule: PSRO) -> None:
    """From between iterations to the end of the next one."""
    assert schedule.phase == "between"
    run_phase(schedule, "between")
    for phase in ("retarget", "train", "evaluate", "score"):
        run_phase(schedule, phase)
    assert schedule.phase == "between"


def schedule_entry(grant: Grant) -> list[int]:
    bindings = grant.task["bindings"]
    return [0 if bindings[p] == f"main/{p}" else 1 for p in ("player_0", "player_1")]


def test_the_run_stops_between_iterations_on_its_limits() -> None:
    schedule = PSRO(context("psro.iterations=1"))
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    assert schedule.stop_reason() is None  # iteration 0 of 1
    run_iteration(schedule)
    assert schedule.stop_reason() == "psro.iterations reached (1 iterations)"

    target = PSRO(context("psro.stop_exploitability=0.3"))
    run_phase(target, "evaluate")
    run_phase(target, "score")
    assert target.stop_reason() == "psro.stop_exploitability reached (0.2500 <= 0.3)"


def test_a_checkpoint_mid_iteration_resumes_the_same_iteration() -> None:
    schedule = PSRO(context())
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    for grant in schedule.grants(situation()):
        finish(schedule, grant, groups={})
    schedule.additions()
    first = schedule.grants(situation(learners=()))  # two collect tasks, then a cut
    for grant in first:
        finish(schedule, grant)
    saved = schedule.state()

    resumed = PSRO(context())
    resumed.load_state(saved)
    assert (resumed.phase, resumed.iteration, resumed.steps) == ("train", 1, [512, 512])
    assert resumed.populations == schedule.populations
    np.testing.assert_array_equal(resumed.payoffs.mean(), schedule.payoffs.mean())
    # The same opponent draws and turns follow from the restored generator.
    a = [g.task for g in schedule.grants(situation(learners=()))]
    b = [g.task for g in resumed.grants(situation(learners=()))]
    strip = [{k: v for k, v in t.items() if k != "task_id"} for t in a]
    assert strip == [{k: v for k, v in t.items() if k != "task_id"} for t in b]


def test_the_meta_strategy_comes_from_the_payoffs() -> None:
    """Matching pennies in the payoff table: nash mixes 50/50."""
    schedule = PSRO(context())
    schedule.payoffs.add_policy(0)
    schedule.payoffs.add_policy(1)
    for entry, value in {(0, 0): 1.0, (0, 1): -1.0, (1, 0): -1.0, (1, 1): 1.0}.items():
        schedule.payoffs.record_moments(entry, 4, [4 * value, -4 * value], [4.0, 4.0])
    schedule.solve()
    assert schedule.phase == "score"
    for strategy in schedule.meta:
        np.testing.assert_allclose(strategy, [0.5, 0.5], atol=1e-9)


@pytest.mark.parametrize("solver", ["uniform", "prd"])
def test_other_meta_solvers_plug_in(solver: str) -> None:
    schedule = PSRO(context(f"psro.meta_solver={solver}", "psro.exploitability=false"))
    run_phase(schedule, "evaluate")
    assert schedule.phase == "between"  # no exploitability task
    ((_, row),) = schedule.records()
    assert "exploitability" not in row and row["meta_strategy"] == [[1.0], [1.0]]


def ppo_context() -> Context:
    """PPO as the oracle: two updates per player and iteration, each on 32 fragments, which
    one collect task yields (4 fragments x 8 env copies)."""
    overrides = ["psro.updates_per_iteration=2", "psro.eval_episodes=10"]
    cfg = load_job("jobs/kuhn_psro_ppo.yaml", overrides)
    assert cfg.learner.ppo.batch_fragments == 32 and cfg.learner.ppo.max_policy_lag == 1
    assert cfg.collector.fragments_per_task * cfg.env.num_envs == 32
    return context_of(cfg, "categorical")


class Shard:
    """What replay0 acknowledges: consecutive insert ids per group, 32 per collect task."""

    def __init__(self) -> None:
        self.inserted = {"player_0": 0, "player_1": 0}

    def finish(self, schedule: PSRO, grant: Grant, version: int = 0) -> None:
        task = grant.task
        if task.get("kind") == "collect":
            (group,) = task["record"]
            first, self.inserted[group] = self.inserted[group], self.inserted[group] + 32
            collect = {"env_steps": 512, "items": {group: {"replay0": [[first, 32]]}}}
            report: dict[str, Any] = {"collect": collect}
        else:
            (group,) = task.get("take") or task.get("train")
            report = {"stats": {"groups": {group: {"version": version}} if version else {}}}
        kind = task.get("kind", "learn")
        schedule.on_task_done(grant.role, kind, {"task_id": task["task_id"], **report})


def test_a_ppo_oracle_trains_each_batch_of_fresh_fragments_once() -> None:
    schedule = PSRO(ppo_context())
    grants = run_phase(schedule, "evaluate")
    assert grants[0].task["greedy"] == []  # frozen PPO policies sample in matchups
    run_phase(schedule, "score")
    for grant in schedule.grants(situation()):  # retarget: fresh networks at version 1
        finish(schedule, grant, groups={})
    assert schedule.phase == "train"

    shard, versions = Shard(), {"player_0": 1, "player_1": 1}
    collects, takes = [], []
    for _ in range(50):
        if schedule.phase != "train":
            break
        grants = schedule.grants(situation())
        assert grants, "nothing granted while training"
        for grant in grants:
            if grant.task.get("kind") == "collect":
                collects.append(grant.task)
                shard.finish(schedule, grant)
            else:
                ((group, take),) = grant.task["take"].items()
                takes.append((group, take))
                versions[group] += 1
                shard.finish(schedule, grant, versions[group])
    assert schedule.phase == "evaluate"
    # Exactly the data the updates need, each fragment trained once, oldest first.
    assert sorted(t["record"][0] for t in collects) == ["player_0"] * 2 + ["player_1"] * 2
    for group in ("player_0", "player_1"):
        assert [t for g, t in takes if g == group] == [
            {"replay0": [[0, 32]]},
            {"replay0": [[32, 32]]},
        ]
    first = next(t for t in collects if t["record"] == ["player_0"])
    assert first["greedy"] == [] and first["fresh"] and first["generation"] == 1
    assert first["bindings"] == {"player_0": "main/player_0-1", "player_1": "main/player_1"}
    assert first["versions"] == {"main/player_1": 1, "main/player_0-1": 1}
    # The next iteration's matchups name the final versions of the new policies.
    matchups = run_phase(schedule, "evaluate")
    assert all(g.task["versions"].get("main/player_0-1", 3) == 3 for g in matchups)


def test_a_ppo_oracles_books_survive_a_checkpoint_mid_iteration() -> None:
    schedule = PSRO(ppo_context())
    run_phase(schedule, "evaluate")
    run_phase(schedule, "score")
    for grant in schedule.grants(situation()):
        finish(schedule, grant, groups={})
    shard = Shard()
    for grant in schedule.grants(situation(learners=())):  # one collect task per player
        shard.finish(schedule, grant)
    saved = schedule.state()

    resumed = PSRO(ppo_context())
    resumed.load_state(saved)
    assert schedule.ledger is not None and resumed.ledger is not None
    assert resumed.ledger.state() == schedule.ledger.state()
    a = schedule.grants(situation(collectors=()))
    b = resumed.grants(situation(collectors=()))
    assert [g.task["take"] for g in a] == [g.task["take"] for g in b]
    assert [g.task["take"] for g in a] == [
        {"player_0": {"replay0": [[0, 32]]}},
        {"player_1": {"replay0": [[0, 32]]}},
    ]
