"""Every start-up failure a user causes ends in one `hpcmarl: error: ...; fix: ...` line, exit 2.

Each case runs the start-up (`run_job`, what `python -m hpcmarl` calls) in an empty working
directory and checks the line, the code, and that nothing was written there: no run directory,
no `runs/`. A few cases also go through a real `python -m hpcmarl` process, for the exit code a
shell sees. World sizes are tested under `mpirun` in `tests/faults/test_failures.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcmarl.algos.networks import num_params
from hpcmarl.algos.ppo import PPO
from hpcmarl.config.loader import load_job
from hpcmarl.errors import EnvError, UserError
from hpcmarl.items.spec import ItemSpec
from hpcmarl.launch import memory, run
from hpcmarl.launch.build import item_specs, probe_env
from hpcmarl.launch.memory import (
    available_bytes,
    check_memory,
    mlp_params,
    node_needs,
    table_bytes,
)
from hpcmarl.launch.topology import build_topology
from hpcmarl.replay.table import ReplayTable

from . import user_nets

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["commander.stop_value=null", "commander.max_env_steps=200", "topology.collectors=1"]
"""A job that ends at once should a case ever not be refused."""
OFFLINE = ["commander.max_updates=10"]
R2D2 = ["learner.algo=r2d2", "env.id=hpcmarl.envs.partial:CartPoleNoVelocity-v1"]
KUHN_QMIX = ["learner.algo=qmix", "env.kind=openspiel", "env.id=kuhn_poker"]
SPREAD = ["env.kind=pettingzoo", "env.id=mpe2.simple_spread_v3"]
KUHN = ["env.kind=openspiel", "env.id=kuhn_poker"]
TICTACTOE = ["env.kind=pettingzoo", "env.id=pettingzoo.classic.tictactoe_v3"]
LAST_OF_3 = ["replay.stack_num=3", "replay.save_only_last_obs=true"]
NO_NEXT = ["replay.ignore_obs_next=true"]


def write_h5(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)


SETUPS = {
    "valid": ("job.yaml", "name: quick\n"),
    "yaml syntax": ("job.yaml", "learner:\n  lr: 0.1\n  gamma: 0.9: 1\n"),
    "unknown key": ("job.yaml", "learner:\n  lrr: 0.1\n"),
    "bad type": ("job.yaml", "learner:\n  lr: fast\n"),
    "a file": ("afile", "x\n"),
    "garbage": ("bad.h5", "not hdf5\n"),
}

CASES = [
    # (case, job file, overrides, what the line must say, files the case creates)
    ("yaml syntax", "job.yaml", [], "YAML syntax error at line 3", "yaml syntax"),
    ("unknown key in the file", "job.yaml", [], "did you mean learner.lr", "unknown key"),
    ("bad value type", "job.yaml", [], "has the wrong type", "bad type"),
    ("override without =", "job.yaml", ["learner.lr"], "is not KEY=VALUE", "valid"),
    ("bare key as the job", "learner.lr", [], "neither a job file nor KEY=VALUE", None),
    ("unknown override key", None, ["learner.lrr=1"], "did you mean learner.lr", None),
    ("unknown env id", None, ["env.id=CartPol-v1"], "did you mean 'CartPole-v1'", None),
    ("unknown env kind", None, ["env.kind=gym"], "must be one of gymnasium", None),
    ("missing job file", "nope.yaml", [], "job file nope.yaml does not exist", None),
    ("missing dataset", None, ["offline.dataset=nope.h5", *OFFLINE], "does not exist", None),
    ("corrupt dataset", None, ["offline.dataset=bad.h5", *OFFLINE], "not an HDF5", "garbage"),
    ("foreign hdf5", None, ["offline.dataset=foreign.h5", *OFFLINE], "not written by", "h5"),
    ("run dir under a file", None, ["runtime.run_dir=afile/run"], "is a file", "a file"),
    ("run dir is a file", None, ["runtime.run_dir=afile"], "cannot be created", "a file"),
    ("tables too large", None, ["replay.table_capacity=1e12"], "replay tables", None),
    ("networks too large", None, ["learner.hidden_sizes=[300000,300000]"], "networks", None),
    ("burn-in past the overlap", None, R2D2 + ["replay.burn_in=30"], "never be trained", None),
    ("qmix on a turn-based game", None, KUHN_QMIX, "is turn-based", None),
    ("qmix offline", None, ["learner.algo=qmix", "offline.dataset=x.h5"], "episodes of", None),
    ("compact fragments", None, [*SPREAD, "learner.algo=mappo", *NO_NEXT], "from a queue", None),
    ("stacks of a game", None, [*KUHN, "replay.stack_num=2"], "PettingZoo parallel envs", None),
    ("stacks of turns", None, [*TICTACTOE, "replay.stack_num=2"], "played turn by turn", None),
    ("env stacks no frames", None, [*LAST_OF_3, "topology.replay_shards=1"], "not 3", None),
    ("last frame of no stack", None, ["replay.save_only_last_obs=true"], "stack_num is 1", None),
    ("no s' with n-step", None, [*NO_NEXT, "learner.dqn.n_step=3"], "n_step=1", None),
    ("compact offline", None, [*NO_NEXT, "offline.dataset=x.h5", *OFFLINE], "offline", None),
    ("compact on 2 shards", None, [*NO_NEXT, "topology.replay_shards=2"], "outnumber", None),
    ("cuda without a gpu", None, ["learner.device=cuda"], "learner.device is cuda", None),
]


def refused(capsys: pytest.CaptureFixture[str], job: str | None, overrides: list[str]) -> str:
    """The one error line of a start-up that must be refused with exit code 2."""
    code = run.run_job(job, [*overrides, *QUICK])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hpcmarl: error: ")]
    assert code == 2, err
    assert len(lines) == 1 and "; fix: " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("case", "job", "overrides", "says", "setup"), CASES, ids=[c[0] for c in CASES]
)
def test_each_startup_failure_is_one_line_and_exit_2_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
    job: str | None,
    overrides: list[str],
    says: str,
    setup: str | None,
) -> None:
    if case == "cuda without a gpu" and torch.cuda.is_available():
        pytest.skip("this node has a GPU: learner.device=cuda is granted here")
    monkeypatch.chdir(tmp_path)
    if setup == "h5":
        write_h5(tmp_path / "foreign.h5")
    elif setup is not None:
        name, text = SETUPS[setup]
        (tmp_path / name).write_text(text)
    before = sorted(os.listdir(tmp_path))
    line = refused(capsys, job, overrides)
    assert says in line, (case, line)
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_run_dir_that_exists_but_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Permission bits do not stop root; /proc/self refuses new files to every user.
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, None, ["runtime.run_dir=/proc/self"])
    assert "'/proc/self' cannot be written: no file can be created in it" in line
    assert "choose another runtime.run_dir" in line
    assert os.listdir(tmp_path) == []


def test_a_run_dir_that_fails_deep_down_leaves_no_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x\n")
    refused(capsys, None, ["runtime.run_dir=afile/a/b"])
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    if os.geteuid() != 0:  # root writes anyway: only an unprivileged user sees this one
        line = refused(capsys, None, [f"runtime.run_dir={read_only}/a/b"])
        assert "Permission denied" in line and f"permissions of {read_only}" in line
    assert sorted(os.listdir(tmp_path)) == ["afile", "ro"] and not os.listdir(read_only)


def test_the_refused_jobs_exit_2_from_a_real_process(tmp_path: Path) -> None:
    """The shell's view: exit code 2 and one line, quickly, for memory and run-dir refusals."""
    (tmp_path / "afile").write_text("x\n")
    for override in ("replay.table_capacity=1000000000000", "runtime.run_dir=afile/run"):
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "hpcmarl", override, *QUICK],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("hpcmarl: error: ") == 1 and "; fix: " in result.stderr
        assert "Traceback" not in result.stderr
        assert time.monotonic() - started < 30
    assert os.listdir(tmp_path) == ["afile"]


# --- the memory estimate ------------------------------------------------------------------------


def test_the_memory_line_names_the_figure_and_the_key() -> None:
    cfg = load_job(None, ["replay.table_capacity=1e12"])
    spec = probe_env(cfg)
    topology = build_topology(4, cfg.topology, spec.training_groups())
    nodes = [("nodeA", 8 << 30)] * 4
    with pytest.raises(UserError) as info:
        check_memory(cfg, spec, topology, nodes)
    msg = info.value.message()
    assert "on this node (replay tables " in msg and "which has 8.0 GiB available" in msg
    assert "fix: lower replay.table_capacity (now 1,000,000,000,000; about " in msg


def test_only_the_node_hosting_the_shards_counts_their_tables() -> None:
    cfg = load_job(None, ["replay.table_capacity=100000000"])
    spec = probe_env(cfg)
    topology = build_topology(16, cfg.topology, spec.training_groups())
    shard_ranks = {topology.rank_of[name] for name in topology.names("replay_shard")}
    nodes = [("shards" if r in shard_ranks else "others", 64 << 30) for r in range(16)]
    needs = {need.host: need for need in node_needs(cfg, spec, topology, nodes)}
    assert needs["others"].tables == 0 and needs["shards"].tables > 1 << 30
    nodes = [(host, 1 << 30) for host, _ in nodes]
    with pytest.raises(UserError) as info:
        check_memory(cfg, spec, topology, nodes)
    assert f"node shards (ranks {sorted(shard_ranks)})" in info.value.message()


def test_the_jobs_shipped_in_jobs_fit_a_small_node() -> None:
    for path in [None, *sorted(str(p) for p in (ROOT / "jobs").glob("*.yaml"))]:
        cfg = load_job(path, OFFLINE if path and "offline" in path else [])
        spec = probe_env(cfg)
        for world in (1, 16):
            topology = build_topology(world, cfg.topology, spec.training_groups())
            check_memory(cfg, spec, topology, [("node", 1 << 30)] * world)


@pytest.mark.parametrize("prioritized", [False, True])
def test_the_table_estimate_matches_what_a_table_allocates(prioritized: bool) -> None:
    cfg = load_job(None, [f"replay.prioritized={str(prioritized).lower()}"])
    (item,) = item_specs(cfg, probe_env(cfg)).values()
    capacity = 20_000
    estimate, _ = table_bytes(item, capacity)
    tracemalloc.start()
    table = ReplayTable(capacity, prioritized=prioritized)
    table.insert(batch_of(item, 4))
    allocated = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert 0.95 * allocated <= estimate <= 1.05 * allocated + 4096, (estimate, allocated)


def batch_of(item: ItemSpec, n: int) -> dict[str, np.ndarray]:
    return {name: np.zeros(shape, dtype) for name, dtype, shape in item.batch_specs(n)}


def test_mlp_params_and_available_memory() -> None:
    assert mlp_params(4, [256, 256], 2) == 5 * 256 + 257 * 256 + 257 * 2
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total = int(meminfo.read_text().split("MemTotal:")[1].split()[0]) * 1024
        assert 0 < available_bytes() <= total


def test_a_cgroup_limit_lowers_the_available_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "memory.max").write_text(f"{1 << 30}\n")
    (tmp_path / "memory.current").write_text(f"{512 << 20}\n")
    (tmp_path / "memory.stat").write_text(f"anon 1\ninactive_file {256 << 20}\n")
    monkeypatch.setattr(memory, "_CGROUP_ROOT", tmp_path)
    assert memory._cgroup_headroom() == 768 << 20
    assert available_bytes() <= 768 << 20


# --- checks that would otherwise fail on another rank ------------------------------------------


def test_horovod_that_cannot_run_is_refused_on_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPCMARL_NO_HOROVOD", "1")
    nodes = [("node", 64 << 30)] * 4  # two learners of one group on ranks of their own
    outcome = run.plan_on_rank0(None, ["learner.allreduce=horovod"], nodes)
    assert outcome[0] == "error" and "learner.allreduce=horovod but horovod is hidden" in outcome[1]
    assert "fix: run `bash tools/install_horovod.sh`" in outcome[1]
    assert os.listdir(tmp_path) == []


def test_a_user_error_while_a_rank_builds_its_roles_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_job(None, [f"runtime.run_dir={tmp_path}"])
    spec = probe_env(cfg)
    plan = run.Plan(
        cfg, spec, build_topology(1, cfg.topology, spec.training_groups()), str(tmp_path)
    )

    def build_roles(*args: object) -> list:
        raise EnvError("the environment needs a display", "set env.kwargs.render_mode=null")

    monkeypatch.setattr(run, "build_roles", build_roles)
    monkeypatch.setattr(run, "configure_process", lambda cfg, rank: None)
    assert run.run_rank(plan, None, 0) == 2
    err = capsys.readouterr().err
    assert err == (
        "hpcmarl: error: rank 0: the environment needs a display; "
        "fix: set env.kwargs.render_mode=null\n"
    )


# --- env modules the user wrote ------------------------------------------------------------------

OLD_GYM = """
import gymnasium, numpy as np

class Old(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return (np.zeros(4, np.float32), {{}}) if {new_reset} else np.zeros(4, np.float32)

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, {{}}

gymnasium.register("{name}-v0", entry_point=Old, max_episode_steps=50)
"""
ENV_MODULES = [
    # (case, module text, env.kind, env.id suffix, overrides, what the line must say)
    ("pettingzoo syntax", "def parallel_env(:\n    pass\n", "pettingzoo", "", [], "syntax error"),
    ("pettingzoo raises", "raise RuntimeError('no licence')\n", "pettingzoo", "", [], "no licence"),
    ("gymnasium syntax", "class Env(\n", "gymnasium", ":Env-v0", [], "syntax error"),
    ("gymnasium raises", "raise ValueError('no table')\n", "gymnasium", ":Env-v0", [], "no table"),
    ("reset gives obs only", OLD_GYM, "gymnasium", ":{name}-v0", [], "old gym API"),
    ("step gives 4 values", OLD_GYM, "gymnasium", ":{name}-v0", [], "old gym API"),
    (
        "constructor rejects a kwarg value",
        "",
        "gymnasium",
        "hpcmarl.testing.broken:Broken-v0",
        ["env.kwargs.fault=x"],
        "rejects env.kwargs",
    ),
]


@pytest.mark.parametrize(
    ("case", "text", "kind", "suffix", "overrides", "says"),
    ENV_MODULES,
    ids=[c[0] for c in ENV_MODULES],
)
def test_a_broken_env_module_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
    text: str,
    kind: str,
    suffix: str,
    overrides: list[str],
    says: str,
) -> None:
    name = f"usermod_{abs(hash((case, str(tmp_path)))):x}"  # a module not imported before
    env_id = suffix.format(name=name) if not text else f"{name}{suffix.format(name=name)}"
    if text:
        (tmp_path / "mods").mkdir()
        new_reset = case != "reset gives obs only"
        (tmp_path / "mods" / f"{name}.py").write_text(text.format(name=name, new_reset=new_reset))
        monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    env = [f"env.kind={kind}", f"env.id={env_id}", f"runtime.run_dir={tmp_path / 'run'}"]
    line = refused(capsys, None, [*env, *overrides])
    assert says in line, (case, line)
    assert os.listdir(cwd) == [] and not (tmp_path / "run").exists()


WIDE_TORSO = ["learner.model.torso=tests.unit.user_nets:small_torso"]
"""A user's torso: `Linear(4, width)` and tanh on CartPole, a head of 2 Q-values on top."""


def test_a_torso_is_counted_as_the_network_it_builds_and_refused_when_it_cannot_fit() -> None:
    width = 1_000_000
    cfg = load_job(None, [*WIDE_TORSO, f"learner.model.kwargs={{width: {width}}}"])
    spec = probe_env(cfg)
    assert memory.policy_params(cfg, spec) == {"shared": 5 * width + (width + 1) * 2}
    topology = build_topology(1, cfg.topology, spec.training_groups())
    node = [("node", 150 << 20)]  # the mlp's 4-64-64-2 fits; 7M parameters x 6 copies do not
    check_memory(load_job(None, []), probe_env(load_job(None, [])), topology, node)
    with pytest.raises(UserError) as info:
        check_memory(cfg, spec, topology, node)
    (need,) = node_needs(cfg, spec, topology, node)
    assert need.networks >= 4 * memory.LEARNER_COPIES * 7 * width  # the learner's copies alone
    msg = info.value.message()
    assert f"networks {need.networks / memory.GIB:.1f} GiB" in msg
    assert "fix: shrink the torso tests.unit.user_nets:small_torso (learner.model.kwargs" in msg


def test_an_on_policy_estimate_bounds_the_networks_the_algorithm_builds() -> None:
    image = f"env.id=tests.unit.user_nets:{user_nets.IMAGE_ENV}"
    cnn = "{channels: [4, 8], kernels: [3, 3], strides: [2, 1], features: 16}"
    for critic in ("central", "local"):
        overrides = [
            image,
            "learner.algo=ppo",
            "learner.model.torso=cnn",
            f"learner.ppo.critic={critic}",
        ]
        cfg = load_job(None, [*overrides, f"learner.model.kwargs={cnn}"])
        spec = probe_env(cfg)
        ppo = PPO(spec.group_spec("shared", cfg.agents.strategy_spec_id), cfg, seed=0)
        built = sum(num_params(net) for net in ppo.networks.values())
        (estimate,) = memory.policy_params(cfg, spec).values()
        state_mlp = mlp_params(spec.state_dim + 1, cfg.learner.hidden_sizes, 1)
        assert built <= estimate <= built + state_mlp, critic  # an upper bound, not far above
