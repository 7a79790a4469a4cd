"""The schedules behind the commander's seam: what each grants, for which situation."""

from __future__ import annotations

from hpcmarl.config.loader import load_job
from hpcmarl.schedules import Context, FreeRunning, Lockstep, OnPolicy, Situation


def context(job: list[str], groups: dict[str, tuple[str, ...]]) -> Context:
    cfg = load_job(None, job)
    keys = {g: (f"main/{g}",) for g in groups}
    bindings = {f"agent_{i}": f"main/{g}" for i, g in enumerate(groups)}
    return Context(
        cfg, ("collector0", "collector1"), ("replay0", "replay1"), groups, bindings, keys
    )


def situation(**changes: object) -> Situation:
    base = {
        "now": 1e9,
        "env_steps": 5000,
        "updates": 0,
        "waiting_collectors": ("collector0", "collector1"),
        "waiting_learners": frozenset({"learner0", "learner1"}),
        "running": 0,
        "collector_slots": 2,
        "replay_sizes": {"a": 2000, "b": 2000},
    }
    return Situation(**{**base, **changes})  # type: ignore[arg-type]


def test_a_learner_hosting_two_groups_gets_one_task_for_both() -> None:
    ctx = context([], {"a": ("learner0",), "b": ("learner0",)})
    assert ctx.crews == {("learner0",): ("a", "b")}
    grants = FreeRunning(ctx).grants(situation())
    learners = [g.role for g in grants if g.role.startswith("learner")]
    assert learners == ["learner0"]
    collects = [g.task for g in grants if g.role.startswith("collector")]
    assert len(collects) == 2 and all(t["kind"] == "collect" for t in collects)
    assert collects[0]["bindings"] == {"agent_0": "main/a", "agent_1": "main/b"}
    assert collects[0]["env_steps"] == 5000  # the actors' exploration schedules read it
    not_ready = situation(replay_sizes={"a": 2000, "b": 10})
    assert not [g for g in FreeRunning(ctx).grants(not_ready) if g.role == "learner0"]


def test_data_parallel_learners_start_together_or_not_at_all() -> None:
    ctx = context([], {"a": ("learner0", "learner1")})
    assert [g.role for g in FreeRunning(ctx).learner_grants(situation())] == [
        "learner0",
        "learner1",
    ]
    one = situation(waiting_learners=frozenset({"learner0"}))
    assert FreeRunning(ctx).learner_grants(one) == []


def test_on_policy_collects_within_the_lag_and_assigns_each_learner_its_fragments() -> None:
    job = ["learner.algo=mappo", "learner.ppo.batch_fragments=8", "learner.ppo.max_policy_lag=0"]
    job += ["env.num_envs=4", "collector.fragments_per_task=1"]
    ctx = context(job, {"a": ("learner0", "learner1")})
    schedule = OnPolicy(ctx)
    first = schedule.grants(situation())
    assert [g.role for g in first] == ["collector0", "collector1"]  # 2 x 4 fragments fill B
    assert all(g.task["versions"] == {"main/a": 1} for g in first)
    assert schedule.grants(situation(waiting_collectors=(), running=2)) == []
    for grant, shard in zip(first, ("replay0", "replay1"), strict=True):
        items = {"a": {shard: [[0, 4]]}}
        report = {"task_id": grant.task["task_id"], "collect": {"items": items}}
        schedule.on_task_done(grant.role, "collect", report)
    updates = schedule.grants(situation(waiting_collectors=()))
    assert [g.task["take"] for g in updates] == [
        {"a": {"replay0": [[0, 4]]}},
        {"a": {"replay1": [[0, 4]]}},
    ]
    assert schedule.grants(situation()) == []  # no version 2 yet: lag 0 holds collection
    for grant in updates:
        stats = {"groups": {"a": {"version": 2}}}
        schedule.on_task_done(grant.role, "learn", {"stats": stats})
    again = schedule.grants(situation())
    assert [g.task["versions"] for g in again] == [{"main/a": 2}, {"main/a": 2}]


def test_lockstep_rounds_grant_one_collector_at_a_time_then_the_learners() -> None:
    ctx = context(["commander.deterministic=true"], {"a": ("learner0",)})
    schedule = Lockstep(ctx, on_policy=False)
    assert schedule.at_boundary(situation())
    (grant,) = schedule.grants(situation())
    assert grant.role == "collector0" and grant.task["seed"] == schedule.seed(0)
    assert not schedule.at_boundary(situation(running=1))
    schedule.on_task_done("collector0", "collect", {"collect": {"episode_returns": [1.0]}})
    (second,) = schedule.grants(situation())
    assert second.role == "collector1"
    (learn,) = schedule.grants(situation())
    assert learn.role == "learner0" and learn.task["updates"] == 200
    assert schedule.grants(situation(running=1)) == []
    assert schedule.grants(situation()) == [] and schedule.round == 1
    ((kind, row),) = schedule.records()
    assert kind == "round" and row["round"] == 0 and row["returns"] == 1.0


def test_a_lone_collector_collects_between_evaluations_that_outlast_their_interval() -> None:
    """With evaluations due again as soon as one ended (commander.eval_interval_s shorter than an
    evaluation), a lone collector was granted evaluation after evaluation and the run never
    reached its step budget (found by tests/unit/test_bounds.py at eval_interval_s=0.001)."""
    ctx = context(["commander.eval_interval_s=0.001"], {"a": ("learner0",)})
    schedule = FreeRunning(ctx)
    kinds = []
    for n in range(4):
        lone = situation(now=1e9 + n, updates=10, waiting_collectors=("collector0",))
        (task,) = [g.task for g in schedule.grants(lone) if g.role == "collector0"]
        kinds.append(task["kind"])
        schedule.on_task_done("collector0", task["kind"], {})
    assert kinds == ["eval", "collect", "eval", "collect"]


def test_offline_evaluations_follow_the_clock_with_nothing_to_collect() -> None:
    """Offline no collect task ever comes: waiting for one between evaluations left an offline
    DQN run with the one evaluation at its start (tests/mpi/test_offline.py failed its floor)."""
    ctx = context(["offline.dataset=/nowhere", "commander.eval_interval_s=1"], {"a": ("learner0",)})
    schedule = FreeRunning(ctx)
    kinds = []
    for n in range(3):
        lone = situation(now=1e9 + 10 * n, updates=10, waiting_collectors=("collector0",))
        tasks = [g.task for g in schedule.grants(lone) if g.role == "collector0"]
        kinds += [task["kind"] for task in tasks]
        for task in tasks:
            schedule.on_task_done("collector0", task["kind"], {})
    assert kinds == ["eval", "eval", "eval"]
