"""Optional dependencies: which extra of `pyproject.toml` installs which module, and the one
import path for them.

The core install trains gymnasium envs (DQN on CartPole); multi-agent envs, OpenSpiel games,
PSRO's nash solver, plots and the W&B and MLflow loggers need packages only their users need.
Each is imported through `require` where it is used, so that `import hpcmarl` and a CartPole
run never load them, and a missing one ends the job at start-up in one line naming the extra
that installs it rather than in a traceback from deep inside a role.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hpcmarl.errors import UserError

EXTRA_OF: dict[str, str] = {
    "pettingzoo": "marl",
    "mpe2": "marl",
    "pyspiel": "games",
    "open_spiel": "games",
    "scipy": "games",
    "matplotlib": "analysis",
    "wandb": "wandb",
    "mlflow": "mlflow",
}
"""Top-level module -> the extra that installs it; `pyproject.toml` lists the same packages
under `[project.optional-dependencies]` (a test keeps the two in step)."""


class MissingExtraError(UserError):
    """A feature asked for whose optional dependency is not installed."""

    def __init__(self, needed_by: str, module: str, alternative: str = "") -> None:
        extra = EXTRA_OF[module]
        fix = f"pip install 'hpcmarl[{extra}]' (from a checkout: pip install -e '.[{extra}]')"
        super().__init__(
            f"{needed_by} needs the {extra} extra ({module} is not installed)",
            f"{fix}{f', or {alternative}' if alternative else ''}",
        )
        self.extra = extra


def require(module: str, needed_by: str, alternative: str = "") -> ModuleType:
    """`module` imported; `needed_by` names the setting or command that wants it (the line's
    subject, e.g. `env.kind=pettingzoo`), `alternative` a way to do without it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, needed_by, alternative)
        if error is None:
            raise
        raise error from exc


def missing_extra(
    exc: ImportError, needed_by: str, alternative: str = ""
) -> MissingExtraError | None:
    """The extra to install when `exc` says an optional package is not there (also when a
    user's module, such as an env module, imports it); None for any other import failure,
    which is not ours to explain: a module missing from an installed package (a typo such as
    `mpe2.simple_sprad_v3`) names that module, not the package."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name not in EXTRA_OF:
        return None
    return MissingExtraError(needed_by, exc.name, alternative)
