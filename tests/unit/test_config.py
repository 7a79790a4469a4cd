"""Job config: YAML and overrides in, a validated JobConfig out, and errors a user can act on."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest
import yaml

from hpcmarl.config import (
    JobConfig,
    LearnerConfig,
    apply_overrides,
    explain,
    field_help,
    job_from_dict,
    job_to_dict,
    load_job,
    save_resolved,
)
from hpcmarl.config.docs import all_keys, show, walk
from hpcmarl.config.rules import RULES
from hpcmarl.errors import ConfigError, UserError


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return str(info.value)


# --- defaults and round trips -------------------------------------------------------------------


def test_no_file_gives_the_schema_defaults() -> None:
    assert load_job(None) == JobConfig()
    assert job_from_dict({}) == JobConfig()


def test_empty_file_and_empty_section_mean_defaults(tmp_path: Path) -> None:
    assert load_job(write(tmp_path, "")) == JobConfig()
    assert load_job(write(tmp_path, "learner:\nreplay: {}\n")) == JobConfig()


def test_yaml_file_loads_into_nested_sections(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: spread\nenv:\n  kind: pettingzoo\n  id: mpe2.simple_spread_v3\n"
        "  kwargs: {max_cycles: 25}\nagents:\n  mapping: {agent_0: a, agent_1: b}\n"
        "learner:\n  lr: 5e-4\n  hidden_sizes: [64, 64]\nreplay:\n  table_capacity: 1e5\n"
        "commander:\n  stop_value: null\n",
    )
    cfg = load_job(path)
    assert cfg.name == "spread"
    assert cfg.env.kind == "pettingzoo" and cfg.env.kwargs == {"max_cycles": 25}
    assert cfg.agents.mapping == {"agent_0": "a", "agent_1": "b"}
    assert cfg.learner.lr == 5e-4 and cfg.learner.hidden_sizes == [64, 64]
    assert cfg.replay.table_capacity == 100_000 and isinstance(cfg.replay.table_capacity, int)
    assert cfg.commander.stop_value is None
    assert cfg.learner.gamma == LearnerConfig().gamma


def test_job_to_dict_is_plain_and_round_trips() -> None:
    cfg = load_job(None, ["learner.lr=5e-4", "env.kwargs={max_cycles: 25}", "seed=7"])
    data = job_to_dict(cfg)
    assert yaml.safe_load(yaml.safe_dump(data)) == data
    assert job_from_dict(data) == cfg
    assert set(data) == {f.name for f in dataclasses.fields(JobConfig)}


def test_save_resolved_then_load_gives_an_equal_config(tmp_path: Path) -> None:
    cfg = load_job(None, ["learner.lr=5e-4", "commander.stop_value=null", "replay.eps=1e-8"])
    path = tmp_path / "run" / "job.resolved.yaml"
    save_resolved(cfg, str(path))
    assert load_job(str(path)) == cfg
    save_resolved(JobConfig(), str(path))  # overwrite in place
    assert load_job(str(path)) == JobConfig()
    assert os.listdir(path.parent) == ["job.resolved.yaml"]  # no temp file left behind


# --- overrides ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "section", "key", "expected"),
    [
        ("learner.lr=5e-4", "learner", "lr", 5e-4),
        ("learner.lr=1", "learner", "lr", 1.0),
        ("topology.collectors=4", "topology", "collectors", 4),
        ("topology.collectors=auto", "topology", "collectors", "auto"),
        ("commander.max_env_steps=1e5", "commander", "max_env_steps", 100_000),
        ("commander.stop_value=null", "commander", "stop_value", None),
        ("commander.stop_value=-20", "commander", "stop_value", -20.0),
        ("learner.hidden_sizes=[64,64]", "learner", "hidden_sizes", [64, 64]),
        ("env.kwargs={max_cycles: 25}", "env", "kwargs", {"max_cycles": 25}),
        ("env.kwargs.max_cycles=25", "env", "kwargs", {"max_cycles": 25}),
        ("learner.ppo.value_norm=false", "learner", "ppo", False),
        ("env.id=Acrobot-v1", "env", "id", "Acrobot-v1"),
        ("agents.mapping=independent", "agents", "mapping", "independent"),
        ("agents.mapping.agent_0=p0", "agents", "mapping", {"agent_0": "p0"}),
        ("learner = {lr: 0.5}", "learner", "lr", 0.5),
    ],
)
def test_override_of_each_type(override: str, section: str, key: str, expected: object) -> None:
    cfg = load_job(None, [override])
    value = getattr(getattr(cfg, section), key)
    if key == "ppo":
        value = value.value_norm
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("learner.double_q", "learner.dqn.double_q"),
        ("learner.target_network_update_freq", "learner.dqn.target_network_update_freq"),
        ("collector.eps_decay_steps", "learner.dqn.eps_decay_steps"),
    ],
)
def test_a_key_that_moved_is_refused_with_its_new_name(old: str, new: str) -> None:
    msg = error_of(load_job, None, [f"{old}=1"])
    assert f"{old} is not a known key" in msg and f"fix: it moved: write {new} instead" in msg


def test_the_algorithm_sections_of_learner_are_the_catalogs() -> None:
    """LearnerConfig names no algorithm: each built-in section is a field made from the catalog
    (every job holds them all, as saved config.yaml files do), and keys_of finds a section by
    its dataclass, a plugin's included."""
    from hpcmarl.algos.catalog import CATALOG, keys_of, sections
    from hpcmarl.algos.dqn_config import DQNConfig
    from hpcmarl.algos.ppo_config import PPOConfig
    from tests.unit.plugin_algos import ReinforceConfig

    built_in = {d.section for d in CATALOG.values() if d.section}
    assert list(sections()) == ["dqn", "ppo", "qmix", "r2d2"] and set(sections()) == built_in
    names = [f.name for f in dataclasses.fields(LearnerConfig)]
    assert names[-4:] == list(sections()) and "learner.r2d2.n_step" in all_keys()
    cfg = load_job(None, ["learner.algo=mappo", "learner.ppo.epochs=3"])
    assert set(job_to_dict(cfg)["learner"]) >= built_in
    assert keys_of(cfg.learner, PPOConfig) is cfg.learner.ppo and cfg.learner.ppo.epochs == 3
    assert keys_of(cfg.learner, DQNConfig) is cfg.learner.dqn  # every section, whatever algo
    plugin = load_job(None, ["learner.algo=tests.unit.plugin_algos:Reinforce"])
    assert keys_of(plugin.learner, ReinforceConfig) is plugin.learner.reinforce
    with pytest.raises(LookupError, match="no section of ReinforceConfig"):
        keys_of(cfg.learner, ReinforceConfig)


def test_presets_fix_their_keys_and_refuse_a_contradiction() -> None:
    assert load_job(None, ["learner.algo=mappo"]).learner.ppo.critic == "central"
    assert load_job(None, ["learner.algo=ippo"]).learner.ppo.critic == "local"
    msg = error_of(load_job, None, ["learner.algo=mappo", "learner.ppo.critic=local"])
    assert "learner.algo = 'mappo' fixes learner.ppo.critic = 'central'" in msg
    assert "fix: drop learner.ppo.critic, or use learner.algo=ppo" in msg


def test_groups_must_list_policy_ids() -> None:
    assert "not a valid group mapping" in error_of(job_from_dict, {"agents": {"groups": {"t": []}}})
    cfg = job_from_dict({"agents": {"groups": {"team": ["a", "b"]}}})
    assert cfg.agents.groups == {"team": ["a", "b"]}


def test_override_of_a_top_level_key_and_order_of_overrides() -> None:
    cfg = load_job(None, ["seed=3", "name=a", "name=b"])
    assert (cfg.seed, cfg.name) == (3, "b")


def test_overrides_apply_on_top_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n  lr: 0.1\n  gamma: 0.9\n")
    cfg = load_job(path, ["learner.lr=0.2"])
    assert (cfg.learner.lr, cfg.learner.gamma) == (0.2, 0.9)


def test_apply_overrides_leaves_its_input_alone() -> None:
    data = {"learner": {"lr": 0.1}}
    out = apply_overrides(data, ["learner.lr=0.2", "topology.collectors=4"])
    assert data == {"learner": {"lr": 0.1}}
    assert out == {"learner": {"lr": 0.2}, "topology": {"collectors": 4}}


@pytest.mark.parametrize("override", ["learner.lr", "=5", " =5"])
def test_override_without_key_or_equals_sign_is_refused(override: str) -> None:
    msg = error_of(apply_overrides, {}, [override])
    assert repr(override) in msg and "KEY=VALUE" in msg and "learner.lr=5e-4" in msg


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [("learner.lrr=0.1", "learner.lr"), ("lr=0.1", "learner.lr"), ("lerner.lr=1", "learner.lr")],
)
def test_override_of_an_unknown_key_suggests_the_closest(override: str, suggestion: str) -> None:
    msg = error_of(apply_overrides, {}, [override])
    assert f"override {override}" in msg and f"did you mean {suggestion}" in msg
    assert "python -m hpcmarl --explain" in msg


def test_override_into_a_value_that_is_not_a_mapping_is_refused() -> None:
    msg = error_of(apply_overrides, {"agents": {"mapping": "shared"}}, ["agents.mapping.a=p"])
    assert "agents.mapping holds 'shared'" in msg and "agents.mapping={a: 'p'}" in msg


def test_a_bad_override_value_is_blamed_on_the_override(tmp_path: Path) -> None:
    msg = error_of(load_job, write(tmp_path, "seed: 1\n"), ["learner.lr=-1"])
    assert msg.startswith("override learner.lr=-1: learner.lr = -1.0 is out of range")


# --- unknown keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ("lerner:\n  lr: 0.1\n", "lerner", "learner"),
        ("seeds: 1\n", "seeds", "seed"),
        ("learner:\n  lrr: 0.1\n", "learner.lrr", "learner.lr"),
        ("replay:\n  capacity: 10\n", "replay.capacity", "replay.table_capacity"),
        ("learner:\n  batchsize: 32\n", "learner.batchsize", "learner.batch_size"),
    ],
)
def test_unknown_key_names_the_closest_valid_key(
    tmp_path: Path, text: str, key: str, suggestion: str
) -> None:
    msg = error_of(load_job, write(tmp_path, text))
    assert f"job.yaml: {key} = " in msg and "is not a known key" in msg
    assert f"did you mean {suggestion}" in msg and "python -m hpcmarl --explain" in msg


def test_unknown_key_without_near_match_says_remove_it() -> None:
    msg = error_of(job_from_dict, {"zzzzzz": 1})
    assert "<dict>: zzzzzz = 1 is not a known key; fix: remove it" in msg


# --- types --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"learner": {"batch_size": "64"}}, "learner.batch_size = '64' has the wrong type"),
        ({"learner": {"batch_size": 2.5}}, "expected an integer"),
        ({"learner": {"batch_size": True}}, "learner.batch_size = true has the wrong type"),
        ({"learner": {"lr": "fast"}}, "expected a finite number"),
        ({"learner": {"lr": True}}, "expected a finite number"),
        ({"learner": {"lr": math.nan}}, "expected a finite number"),
        ({"learner": {"dqn": {"double_q": 1}}}, "expected true or false"),
        ({"learner": {"dqn": {"double_q": "true"}}}, "expected true or false"),
        ({"name": 2024}, 'quote it so YAML reads a string: name: "2024"'),
        ({"learner": {"hidden_sizes": [64, "x"]}}, "expected a list of integers"),
        ({"learner": {"hidden_sizes": 64}}, "expected a list of integers"),
        ({"env": {"kwargs": [1, 2]}}, "expected a mapping with string keys"),
        ({"env": {"kwargs": {1: 2}}}, "expected a mapping with string keys"),
        ({"commander": {"stop_value": "high"}}, "expected a finite number or null"),
        ({"learner": 3}, "learner = 3 has the wrong type: expected a mapping of learner keys"),
    ],
)
def test_bad_types_are_refused_with_the_expected_type(data: dict, fragment: str) -> None:
    msg = error_of(job_from_dict, data, "job.yaml")
    assert fragment in msg and "fix: " in msg


def test_yaml_words_yes_and_on_are_not_booleans(tmp_path: Path) -> None:
    msg = error_of(load_job, write(tmp_path, "learner:\n  dqn:\n    double_q: yes\n"))
    assert "learner.dqn.double_q = 'yes' has the wrong type: expected true or false" in msg


def test_top_level_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    msg = error_of(load_job, write(tmp_path, "- learner\n- replay\n"))
    assert "not a mapping of sections" in msg
    assert "not a mapping of sections" in error_of(job_from_dict, [1])  # type: ignore[arg-type]


# --- ranges -------------------------------------------------------------------------------------

BAD_VALUES = {
    "name": "a/b",
    "seed": -1,
    "env.kind": "gym",
    "env.id": "",
    "env.num_envs": 0,
    "agents.mapping": "shard",
    "agents.strategy_spec_id": "",
    "learner.algo": "a2c",
    "learner.lr": 0,
    "learner.gamma": 1.5,
    "learner.batch_size": 0,
    "learner.hidden_sizes": [64, 0],
    "learner.model.torso": "",
    "learner.grad_clip": -1,
    "learner.dqn.huber_delta": 0,
    "learner.dqn.target_network_update_freq": 0,
    "learner.dqn.target_tau": 1.5,
    "learner.dqn.eps_start": 1.5,
    "learner.dqn.eps_end": -0.1,
    "learner.dqn.eps_decay_steps": 0,
    "learner.ppo.critic": "global",
    "learner.ppo.batch_fragments": 0,
    "learner.ppo.epochs": 0,
    "learner.ppo.minibatches": 0,
    "learner.ppo.clip": 0,
    "learner.ppo.value_clip": -0.1,
    "learner.ppo.gae_lambda": 1.5,
    "learner.ppo.entropy_coef": -1,
    "learner.ppo.value_coef": -1,
    "learner.ppo.value_huber_delta": -1,
    "learner.ppo.activation": "gelu",
    "learner.ppo.max_policy_lag": -1,
    "agents.groups": {"team": "p0"},
    "learner.push_interval": 0,
    "learner.updates_per_task": 0,
    "learner.allreduce": "nccl",
    "learner.device": "gpu",
    "replay.table_capacity": 0,
    "replay.learning_starts": -1,
    "replay.alpha": -0.1,
    "replay.beta": 1.1,
    "replay.eps": 0,
    "replay.samples_per_insert": -1,
    "replay.error_buffer": 0,
    "replay.insert_credits": 0,
    "replay.stack_num": 0,
    "collector.fragment_length": 0,
    "collector.fragments_per_task": 0,
    "collector.weight_sync_fragments": 0,
    "commander.max_env_steps": 0,
    "commander.max_wall_time_s": -1,
    "commander.eval_interval_s": 0,
    "commander.eval_episodes": 0,
    "commander.eval_max_episode_steps": 0,
    "runtime.stall_timeout_s": 0,
    "commander.stop_evals": 0,
    "commander.collector_task_space": -1,
    "commander.progress_interval_s": 0,
    "topology.param_servers": 0,
    "topology.replay_shards": 0,
    "topology.learners": 0,
    "topology.collectors": 0,
    "commander.max_updates": -1,
    "commander.eval_every_rounds": 0,
    "replay_log.flush_every_fragments": 0,
    "learner.drift_check_interval": -1,
    "checkpoint.interval_s": -1.0,
    "checkpoint.every_updates": -5,
    "checkpoint.keep": 0,
    "checkpoint.timeout_s": 0.0,
    "runtime.heartbeat_interval_s": 0.0,
    "runtime.heartbeat_timeout_s": -1.0,
    "runtime.torch_threads": 0,
    "runtime.idle_sleep_max_s": -1,
    "runtime.idle_wait_s": -0.5,
    "runtime.shutdown_timeout_s": 0,
    "runtime.loggers": ["tensorboard", "neptune"],
    "psro.iterations": -1,
    "psro.steps_per_iteration": 0,
    "psro.updates_per_iteration": 0,
    "psro.meta_solver": "alpharank",
    "psro.eval_episodes": 1,
    "psro.stop_exploitability": -0.1,
    "learner.dqn.n_step": 0,
    "learner.r2d2.rnn_hidden": 0,
    "learner.r2d2.n_step": 0,
    "learner.r2d2.priority_eta": 1.5,
    "learner.r2d2.target_network_update_freq": 0,
    "learner.r2d2.target_tau": 1.5,
    "learner.r2d2.eps_start": -0.5,
    "learner.r2d2.eps_end": 2.0,
    "learner.r2d2.eps_decay_steps": 0,
    "replay.sequence_length": 1,
    "replay.burn_in": -1,
    "replay.sequence_overlap": -1,
    "learner.qmix.mixer": "sum",
    "learner.qmix.rnn_hidden": 0,
    "learner.qmix.mixing_embed": 0,
    "learner.qmix.hypernet_embed": 0,
    "learner.qmix.td_lambda": 1.5,
    "learner.qmix.target_network_update_freq": 0,
    "learner.qmix.target_tau": 1.5,
    "learner.qmix.episode_limit": 0,
    "learner.qmix.eps_start": 1.5,
    "learner.qmix.eps_end": -0.1,
    "learner.qmix.eps_decay_steps": 0,
}


def nest(path: str, value: object) -> dict:
    *sections, key = path.split(".")
    tree: dict = {key: value}
    for section in reversed(sections):
        tree = {section: tree}
    return tree


def test_every_numeric_key_has_a_range_and_every_range_a_test() -> None:
    numeric = {path for path, _, f in walk() if f.type in ("int", "float", "list[int]")}
    assert numeric <= set(RULES)
    assert set(BAD_VALUES) == set(RULES)


@pytest.mark.parametrize("path", sorted(BAD_VALUES))
def test_each_range_violation_names_key_value_and_fix(path: str) -> None:
    msg = error_of(job_from_dict, nest(path, BAD_VALUES[path]), "job.yaml")
    assert msg.startswith(f"job.yaml: {path} = ")
    assert RULES[path].text in msg and f"fix: set {path} to " in msg


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"agents": {"mapping": {"agent_0": 1}}}, "not a valid agent mapping"),
        ({"agents": {"mapping": {"agent_0": "a/b"}}}, "not a valid agent mapping"),
        ({"learner": {"gamma": 0}}, "must be > 0 and <= 1"),
        ({"seed": 2**32}, "must be >= 0 and <= 4294967295"),
    ],
)
def test_range_edges(data: dict, fragment: str) -> None:
    assert fragment in error_of(job_from_dict, data)


def test_range_boundaries_are_allowed() -> None:
    cfg = job_from_dict(nest("learner.gamma", 1) | nest("replay.learning_starts", 0))
    assert cfg.learner.gamma == 1.0 and cfg.replay.learning_starts == 0
    dqn = {"learner": {"dqn": {"eps_start": 0.1, "eps_end": 0.1}}}
    assert job_from_dict(dqn).learner.dqn.eps_end == 0.1


def test_the_documented_message_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "learner:\n  lr: -1.0\n")
    assert error_of(load_job, "job.yaml") == (
        "job.yaml: learner.lr = -1.0 is out of range: must be > 0; "
        "fix: set learner.lr to a positive number such as 0.001"
    )


@pytest.mark.parametrize(
    ("data", "small", "large"),
    [
        (nest("learner.dqn", {"eps_start": 0.1, "eps_end": 0.2}), "learner.dqn.eps_end", "eps_st"),
        (
            nest("learner.ppo", {"batch_fragments": 2, "minibatches": 4}),
            "learner.ppo.minibatches",
            "batc",
        ),
        ({"replay": {"table_capacity": 100}}, "replay.learning_starts", "table_capacity"),
        ({"replay": {"table_capacity": 32, "learning_starts": 0}}, "learner.batch_size", "capa"),
    ],
)
def test_cross_field_checks(data: dict, small: str, large: str) -> None:
    msg = error_of(job_from_dict, data, "job.yaml")
    assert msg.startswith(f"job.yaml: {small} = ") and large in msg and f"lower {small}" in msg


# --- YAML safety and syntax ---------------------------------------------------------------------


def test_python_object_tag_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, 'name: !!python/object/apply:os.system ["echo pwned"]\n')
    msg = error_of(load_job, path)
    assert "Python object tag" in msg and "only plain YAML is accepted" in msg
    assert "line 1" in msg


def test_python_tag_in_an_override_is_refused() -> None:
    msg = error_of(load_job, None, ["name=!!python/name:os.system"])
    assert "Python object tag" in msg and "only plain YAML is accepted" in msg


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n  lr: 0.1\n  gamma: 0.9: 1\nreplay:\n  alpha: 1\n")
    msg = error_of(load_job, path)
    assert "YAML syntax error at line 3, column 13" in msg


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    msg = error_of(load_job, write(tmp_path, "learner:\n  lr: 0.1\n  lr: 0.2\n"))
    assert "key 'lr' appears twice" in msg and "line 3" in msg


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    msg = error_of(load_job, str(tmp_path / "nope.yaml"))
    assert "nope.yaml does not exist" in msg and "fix: " in msg
    assert "cannot be read" in error_of(load_job, str(tmp_path))
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in error_of(load_job, str(tmp_path / "bin.yaml"))


def test_config_errors_are_user_errors() -> None:
    with pytest.raises(UserError) as info:
        job_from_dict({"seed": -1})
    assert info.value.fix.startswith("set seed to")


# --- documentation ------------------------------------------------------------------------------


def test_field_help_returns_the_attribute_docstring() -> None:
    assert field_help(LearnerConfig, "lr") == "Adam learning rate."
    assert field_help(JobConfig, "seed") == "Base seed; every role derives its own from it."
    from hpcmarl.config import AgentsConfig

    assert field_help(AgentsConfig, "mapping").endswith("or a dict {agent_id: policy_id}.")
    with pytest.raises(KeyError):
        field_help(LearnerConfig, "nope")


def test_every_field_has_help() -> None:
    for path, cls, fld in walk():
        assert field_help(cls, fld.name), path


@pytest.mark.parametrize("value", ["many", 2.5, "10", None])
def test_collectors_take_an_integer_or_auto_and_name_both(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        load_job(None, [f"topology.collectors={show(value)}"])
    msg = str(err.value)
    assert "topology.collectors" in msg and "'auto'" in msg and "integer" in msg, msg
    assert len(msg.splitlines()) == 1


def test_explain_mentions_every_key_with_type_default_and_help() -> None:
    text = explain()
    assert "topology.collectors: int | Literal['auto'] = 'auto'  [must be \"auto\" or >= 1]" in text
    for path in all_keys():
        assert f"{path}:" in text, path
    assert "learner.lr: float = 0.001  [must be > 0]" in text
    assert "Adam learning rate." in text
    assert "learner.dqn.eps_end <= learner.dqn.eps_start" in text
    assert "mappo  PPO with a centralised critic" in text and "keys in learner.ppo" in text
