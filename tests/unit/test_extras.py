"""The core install trains CartPole without the optional packages, and a job that needs one ends
at start-up in one line naming the extra (`hpcmarl/extras.py`).

The packages are installed here (tools/setup.sh installs every extra), so the subprocess cases
make them unimportable with a meta-path finder that also records every attempt to import one,
and the in-process cases uninstall one for the test's length (`uninstalled`).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmarl.analysis.cli import analyze_main
from hpcmarl.config.loader import load_job
from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs.registry import make_env_copy
from hpcmarl.errors import UserError
from hpcmarl.extras import EXTRA_OF, MissingExtraError, missing_extra, require
from hpcmarl.loggers import check_loggers
from hpcmarl.psro.checks import check_scorable

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("pettingzoo", "mpe2", "pyspiel", "open_spiel", "scipy", "matplotlib", "wandb", "mlflow")
"""Every package an extra installs, by the name it is imported as."""


class Unimportable:
    """A meta-path finder before all others that refuses `packages` and every module in them,
    as where they are not installed, and records each import tried in `tried`."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages
        self.tried: list[str] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in self.packages:
            self.tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


WITHOUT_EXTRAS = f"""
import sys
{inspect.getsource(Unimportable)}
blocker = Unimportable({OPTIONAL!r})
sys.meta_path.insert(0, blocker)
import hpcmarl
from hpcmarl.__main__ import main
code = main(sys.argv[1:])
print("tried:", sorted(set(blocker.tried)))
sys.exit(code)
"""
"""`python -c WITHOUT_EXTRAS key=value ...`: `python -m hpcmarl` where no extra is installed."""
QUICK_CARTPOLE = [
    "commander.stop_value=null",
    "commander.max_env_steps=64",
    "topology.collectors=1",
    "checkpoint.at_end=false",
]
KUHN_PSRO = ["env.kind=openspiel", "env.id=kuhn_poker", "psro.enabled=true"]


def uninstalled(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """`package` unimportable for the test's length: its loaded modules are dropped (and put
    back after), so that an import goes through the finders again."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Unimportable((package,)), *sys.meta_path])


def without_extras(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *overrides, f"runtime.run_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cartpole_dqn_trains_without_any_extra(tmp_path: Path) -> None:
    done = without_extras(tmp_path, *QUICK_CARTPOLE)
    assert done.returncode == 0, done.stderr
    assert "finished: step budget reached" in done.stdout
    assert done.stdout.rstrip().endswith("tried: []")  # nothing optional was even looked for


def test_pettingzoo_job_without_marl_extra_is_one_line_exit_2(tmp_path: Path) -> None:
    done = without_extras(tmp_path, "env.kind=pettingzoo", "env.id=mpe2.simple_spread_v3")
    assert done.returncode == UserError.exit_code
    assert done.stderr.splitlines() == [
        "hpcmarl: error: env.kind=pettingzoo needs the marl extra (pettingzoo is not "
        "installed); fix: pip install 'hpcmarl[marl]' (from a checkout: pip install -e "
        "'.[marl]')"
    ]
    assert not (tmp_path / "run").exists()


def test_require_names_the_extra_and_the_alternative(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstalled(monkeypatch, "scipy")
    with pytest.raises(MissingExtraError) as caught:
        require("scipy.optimize", "psro.meta_solver=nash", "set psro.meta_solver: prd")
    assert caught.value.extra == "games"
    assert caught.value.message() == (
        "psro.meta_solver=nash needs the games extra (scipy is not installed); fix: pip install "
        "'hpcmarl[games]' (from a checkout: pip install -e '.[games]'), or set "
        "psro.meta_solver: prd"
    )
    assert require("json", "a test").dumps([]) == "[]"


def test_other_missing_modules_are_not_an_extra() -> None:
    with pytest.raises(ModuleNotFoundError):
        require("not_an_extra_of_hpcmarl", "a test")
    assert missing_extra(ImportError("cannot import name x", name="scipy"), "a test") is None
    typo = ModuleNotFoundError(
        "No module named 'mpe2.simple_sprad_v3'", name="mpe2.simple_sprad_v3"
    )
    assert missing_extra(typo, "env.id=mpe2.simple_sprad_v3") is None


@pytest.mark.parametrize(
    ("package", "kind", "env_id", "line"),
    [
        ("pettingzoo", "pettingzoo", "hpcmarl.testing.early_exit", "env.kind=pettingzoo needs "),
        ("mpe2", "pettingzoo", "mpe2.simple_spread_v3", "env.id=mpe2.simple_spread_v3 needs "),
        ("pyspiel", "openspiel", "kuhn_poker", "env.kind=openspiel needs the games extra"),
    ],
)
def test_env_without_its_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, package: str, kind: str, env_id: str, line: str
) -> None:
    uninstalled(monkeypatch, package)
    with pytest.raises(MissingExtraError, match=f"^{re.escape(line)}"):
        make_env_copy(EnvConfig(kind=kind, id=env_id))


def test_nash_psro_without_scipy_is_refused_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_job(None, KUHN_PSRO)
    uninstalled(monkeypatch, "scipy")
    with pytest.raises(MissingExtraError, match="games extra"):
        check_scorable(cfg)
    check_scorable(load_job(None, [*KUHN_PSRO, "psro.meta_solver=prd"]))


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_a_logger_without_its_extra_is_refused_at_start_up(
    monkeypatch: pytest.MonkeyPatch, logger: str
) -> None:
    cfg = load_job(None, [f"runtime.loggers=[tensorboard,{logger}]"])
    uninstalled(monkeypatch, logger)
    with pytest.raises(MissingExtraError) as caught:
        check_loggers(cfg.runtime.loggers)
    assert caught.value.message() == (
        f"runtime.loggers={logger} needs the {logger} extra ({logger} is not installed); fix: "
        f"pip install 'hpcmarl[{logger}]' (from a checkout: pip install -e '.[{logger}]'), or "
        f"drop {logger} from runtime.loggers"
    )
    check_loggers(["tensorboard"])  # a core dependency, never refused


def test_analyze_without_matplotlib_stops_before_reading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uninstalled(monkeypatch, "matplotlib")
    assert analyze_main([str(tmp_path / "missing.h5")]) == UserError.exit_code
    line = capsys.readouterr().err.strip()
    assert line.startswith("hpcmarl: error: analyze with plots needs the analysis extra")
    assert line.endswith("or pass --no-plots")


def test_extras_of_pyproject_match_the_modules() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(EXTRA_OF.values()) <= set(extras)
    assert extras["all"] == [f"hpcmarl[{','.join(dict.fromkeys(EXTRA_OF.values()))}]"]
    optional = {dep.split(">")[0] for name in set(EXTRA_OF.values()) for dep in extras[name]}
    assert optional == {
        *("pettingzoo", "mpe2", "open-spiel", "scipy", "matplotlib", "wandb", "mlflow-skinny")
    }
    assert not optional & {dep.split(">")[0] for dep in project["dependencies"]}
