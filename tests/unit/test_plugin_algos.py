"""Users' own algorithms (`learner.algo: module:Class`): the REINFORCE of `plugin_algos`, which
lives outside the package, trains CartPole from a job file, checkpoints and resumes; its keys
are validated and explained like the built-in ones; an algorithm that cannot serve is one line,
exit 2. The runs are tiny jobs in this process (a few seconds each).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import hpcmarl
from hpcmarl.__main__ import main as hpcmarl_main
from hpcmarl.algos.actors import build_actor
from hpcmarl.algos.catalog import resolve_algorithm
from hpcmarl.algos.contract import PolicySpec, run_update
from hpcmarl.algos.registry import algorithm_class
from hpcmarl.algos.torsos import TorsoHead
from hpcmarl.config.loader import job_to_dict, load_job
from hpcmarl.launch import run
from hpcmarl.testing.groups import group_of, job_with, random_items

from . import plugin_algos

REINFORCE = "tests.unit.plugin_algos:Reinforce"
JOB = {
    "learner": {"algo": REINFORCE, "lr": 3e-3, "reinforce": {"batch_fragments": 4}},
    "commander": {"stop_value": None, "max_env_steps": 1536},
    "topology": {"collectors": 1, "learners": 1, "replay_shards": 1},
}
"""CartPole, REINFORCE for 1,536 env steps: twelve updates of 4 fragments of 32 steps."""


def test_the_plugin_trains_from_a_job_file_checkpoints_and_resumes(tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB))
    trained = hpcmarl.train(job_file, run_dir=tmp_path / "run")
    assert trained.final["updates"] >= 10
    saved = yaml.safe_load((trained.run_dir / "config.yaml").read_text())
    assert saved["learner"]["reinforce"]["batch_fragments"] == 4  # the plugin's own section

    code = hpcmarl_main(["resume", str(trained.run_dir), "commander.max_env_steps=2048"])
    assert code == 0
    rows = trained.metrics()
    assert max(r.get("env_steps", 0) for r in rows) >= 2048  # continued past the first budget

    policy = hpcmarl.load_policy(trained.run_dir)
    assert isinstance(policy.module, torch.nn.Sequential)  # built by networks.policy_network


def test_its_keys_are_checked_and_travel_with_the_job() -> None:
    job = load_job(JOB, ["learner.reinforce.gae_lambda=0.9"])
    assert job.learner.reinforce == plugin_algos.ReinforceConfig(batch_fragments=4, gae_lambda=0.9)  # type: ignore[attr-defined]
    again = load_job(job_to_dict(job))
    assert again.learner.reinforce == job.learner.reinforce  # type: ignore[attr-defined]
    decl = resolve_algorithm(REINFORCE)
    assert decl.on_policy and decl.items == "fragment" and decl.section == "reinforce"
    assert algorithm_class(REINFORCE) is plugin_algos.Reinforce


def test_a_user_torso_shapes_the_plugins_networks_and_its_actor_matches() -> None:
    job = job_with(hidden_sizes=[8], collector__fragment_length=4)
    job.learner.model.torso = "tests.unit.user_nets:small_torso"
    job.learner.reinforce = plugin_algos.ReinforceConfig()  # type: ignore[attr-defined]
    group = group_of(4, 3)
    algo = plugin_algos.Reinforce(group, job, seed=0)
    assert isinstance(algo.networks["policy"], TorsoHead)
    assert isinstance(algo.networks["baseline"], TorsoHead)  # the same torso, one output
    items = random_items(plugin_algos.Reinforce.item_spec(group, job), 4, 3)
    stats = run_update(algo, items).stats
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["baseline_loss"])
    (spec,) = plugin_algos.Reinforce.policy_specs(group, job).values()
    actor = build_actor(PolicySpec.from_json(spec.to_json()))
    actor.set_weights(algo.publish()[spec.key])
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    with torch.no_grad():
        expected = algo.acting("shared")(torch.as_tensor(obs))
    assert torch.equal(actor.scores(obs), expected)  # type: ignore[attr-defined]


def test_an_entry_point_names_the_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "my_algos-1.0.dist-info"  # what pip writes for a package's entry points
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-algos\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[hpcmarl.algorithms]\nmy_reinforce = {REINFORCE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = load_job(None, ["learner.algo=my_reinforce", "learner.reinforce.entropy_coef=0"])
    assert job.learner.reinforce.entropy_coef == 0  # type: ignore[attr-defined]
    assert algorithm_class("my_reinforce") is plugin_algos.Reinforce


def test_the_plugin_learns_which_action_pays() -> None:
    """A one-step bandit: action 1 pays 1, action 0 nothing; fifty updates on uniformly chosen
    actions move the policy to action 1 (the policy gradient's sign and the baseline at work)."""
    job = job_with(lr=1e-2, hidden_sizes=[16], collector__fragment_length=4)
    job.learner.reinforce = plugin_algos.ReinforceConfig(entropy_coef=0.0)  # type: ignore[attr-defined]
    group = group_of(4, 2)
    algo = plugin_algos.Reinforce(group, job, seed=0)
    spec = plugin_algos.Reinforce.item_spec(group, job)
    for seed in range(50):
        items = random_items(spec, 8, 2, seed=seed)
        items["rewards"] = (items["actions"] == 1).astype(np.float32)
        items["terminations"][:] = True
        run_update(algo, items)
    obs = torch.as_tensor(np.random.default_rng(99).normal(size=(64, 4)), dtype=torch.float32)
    with torch.no_grad():
        chosen = algo.acting("shared")(obs).softmax(-1)[:, 1]
    assert float(chosen.mean()) > 0.9


def test_explain_lists_the_plugins_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert hpcmarl_main(["--explain", REINFORCE]) == 0
    text = capsys.readouterr().out
    assert "learner.reinforce.gae_lambda: float = 1.0  [must be >= 0 and <= 1]" in text
    assert "REINFORCE with a learned baseline" in text
    assert hpcmarl_main(["--explain", f"{HERE}:PatientReinforce"]) == 0
    pair = "learner.reinforce.max_policy_lag <= learner.reinforce.batch_fragments  (a fragment"
    assert pair in capsys.readouterr().out
    assert hpcmarl_main(["--explain"]) == 0
    assert "module:Class  your own algorithm" in capsys.readouterr().out


class FrameReinforce(plugin_algos.Reinforce):
    """A declaration gone wrong: no such item kind."""

    items = "frames"


class LaglessReinforce(plugin_algos.Reinforce):
    """On-policy without the keys the scheduler reads."""

    config = dataclasses.make_dataclass("Keys", [("entropy_coef", float, 0.0)])


class PatientReinforce(plugin_algos.Reinforce):
    """Declares keys of its section that must not exceed another, as built-ins do."""

    ordered = (("max_policy_lag", "batch_fragments", "a fragment lags less than an update"),)


class MisorderedReinforce(plugin_algos.Reinforce):
    """A declaration gone wrong: an ordered pair naming a key its config lacks."""

    ordered = (("lag", "batch_fragments", "no such key"),)


HERE = "tests.unit.test_plugin_algos"
PATIENT = f"learner.algo={HERE}:PatientReinforce"
ERRORS = [
    ([f"learner.algo={HERE}:FrameReinforce"], "items is 'frames', not an item kind"),
    ([f"learner.algo={HERE}:LaglessReinforce"], "lacks ['batch_fragments', 'max_policy_lag']"),
    (["learner.algo=no_such_module:Algo"], "module 'no_such_module' cannot be imported"),
    (["learner.algo=tests.unit.plugin_algos:Missing"], "has no such name"),
    (["learner.algo=tests.unit.plugin_algos:ReinforceConfig"], "does not subclass"),
    (["learner.algo=tests.unit.plugin_algos:gae"], "holds a function"),
    (["learner.algo=dqnn"], "is not an algorithm: must be one of dqn"),
    ([f"learner.algo={REINFORCE}", "learner.reinforce.baseline_coef=-1"], "must be >= 0"),
    ([f"learner.algo={REINFORCE}", "learner.reinforce.clip=0.2"], "is not a known key"),
    ([f"learner.algo={REINFORCE}", "env.id=Pendulum-v1"], "Reinforce needs a Discrete action"),
    ([f"learner.algo={REINFORCE}", "learner.reinforce.gae_lambda=x"], "expected a finite"),
    (
        [PATIENT, "learner.reinforce.max_policy_lag=9"],
        "learner.reinforce.max_policy_lag = 9 is above learner.reinforce.batch_fragments = 8",
    ),
    ([f"learner.algo={HERE}:MisorderedReinforce"], "ordered names ['lag'], not keys of its"),
]


@pytest.mark.parametrize(("overrides", "says"), ERRORS, ids=[e[1] for e in ERRORS])
def test_an_algorithm_that_cannot_serve_is_one_line_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    overrides: list[str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = run.run_job(None, [*overrides, "commander.max_env_steps=200"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hpcmarl: error: ")]
    assert code == 2 and len(lines) == 1, err
    assert says in lines[0] and "; fix: " in lines[0] and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # refused before the run directory
