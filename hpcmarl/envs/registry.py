"""Environment creation by family and id, with errors that name the id and a close match.

`EnvConfig.kind` picks the family: `gymnasium` ids go through `gymnasium.make`; `pettingzoo`
ids are module paths (`mpe2.simple_spread_v3`) whose `parallel_env(**kwargs)` builds the env
(or, for AEC-only modules such as the classic games, `env(**kwargs)`, played turn by turn);
`openspiel` ids are game names (`kuhn_poker`), played turn by turn (`envs.openspiel`).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium

from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs.adapters import EnvCopy, GymnasiumCopy, ParallelCopy
from hpcmarl.envs.aec import AECCopy
from hpcmarl.envs.cycle import fast_parallel
from hpcmarl.envs.frames import ParallelFrameStack
from hpcmarl.envs.openspiel import make_openspiel
from hpcmarl.errors import EnvError
from hpcmarl.extras import missing_extra, require

PETTINGZOO_EXAMPLE = "mpe2.simple_spread_v3"
AEC_EXAMPLE = "pettingzoo.classic.tictactoe_v3"


def make_env_copy(env_cfg: EnvConfig, frame_stack: int = 1) -> EnvCopy:
    """One environment copy of the configured family; with `frame_stack` k > 1 (gymnasium and
    PettingZoo parallel envs) its observations are its last k frames, newest last, the first
    frame of an episode standing in for those before it."""
    if env_cfg.kind not in ENV_KINDS:
        raise EnvError(
            f"env.kind is {env_cfg.kind!r}, which is not an environment family",
            f"use one of {sorted(ENV_KINDS)}",
        )
    if frame_stack == 1:
        return ENV_KINDS[env_cfg.kind](env_cfg.id, dict(env_cfg.kwargs))
    if env_cfg.kind == "gymnasium":
        return make_gymnasium(env_cfg.id, dict(env_cfg.kwargs), frame_stack)
    if env_cfg.kind == "pettingzoo":
        return make_pettingzoo(env_cfg.id, dict(env_cfg.kwargs), frame_stack)
    raise EnvError(
        f"replay.stack_num {frame_stack} stacks frames of gymnasium and PettingZoo parallel envs; "
        f"{env_cfg.id} is a {env_cfg.kind} env",
        "give the env stacked observations itself and set replay.save_only_last_obs=true, or "
        "set replay.stack_num=1",
    )


def make_gymnasium(env_id: str, kwargs: dict[str, Any], frame_stack: int = 1) -> EnvCopy:
    """A gymnasium env; an unknown id gets the closest registered ids as suggestions."""
    if env_id not in gymnasium.registry and ":" not in env_id:
        raise EnvError(f"unknown gymnasium id {env_id!r}", _suggest_gymnasium(env_id))
    if ":" in env_id:  # gymnasium imports the module, but lets its own errors through
        try:
            importlib.import_module(env_id.split(":", 1)[0])
        except ModuleNotFoundError:
            pass  # named below, with close ids
        except Exception as exc:  # noqa: BLE001 - the user's module: any error is theirs
            raise _module_error(env_id.split(":", 1)[0], exc) from exc
    try:
        env = gymnasium.make(env_id, **kwargs)
    except (gymnasium.error.Error, ModuleNotFoundError) as exc:
        raise EnvError(
            f"gymnasium cannot make {env_id!r}: {exc}", _suggest_gymnasium(env_id)
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the env's constructor refused its kwargs
        raise _kwargs_error(env_id, kwargs, exc) from exc
    if frame_stack > 1:
        env = gymnasium.wrappers.FrameStackObservation(env, frame_stack, padding_type="reset")
    return GymnasiumCopy(env, env_id)


def make_pettingzoo(env_id: str, kwargs: dict[str, Any], frame_stack: int = 1) -> EnvCopy:
    """A PettingZoo env from a module path: its `parallel_env()` (`mpe2.simple_spread_v3`), or
    for a module with only the AEC API, its `env()`, played turn by turn
    (`pettingzoo.classic.tictactoe_v3`); a parallel env observes stacks of `frame_stack`
    frames when that is more than 1 (`envs.frames`)."""
    require("pettingzoo", "env.kind=pettingzoo")
    module = _import_env_module(env_id)
    api = "parallel_env" if hasattr(module, "parallel_env") else "env"
    if not hasattr(module, api):
        raise EnvError(
            f"module {env_id!r} has neither parallel_env() nor env()",
            f"give a PettingZoo env module, e.g. {PETTINGZOO_EXAMPLE} or {AEC_EXAMPLE}",
        )
    try:
        env = getattr(module, api)(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the env's constructor refused its kwargs
        raise _kwargs_error(f"{env_id}.{api}", kwargs, exc) from exc
    if api != "parallel_env":
        if frame_stack > 1:
            raise EnvError(
                f"replay.stack_num {frame_stack} stacks frames of parallel envs, and {env_id} "
                "is played turn by turn (AEC)",
                "set replay.stack_num=1",
            )
        return AECCopy(env, env_id)
    env = fast_parallel(env)
    if frame_stack > 1:
        env = ParallelFrameStack(env, frame_stack, env_id)
    return ParallelCopy(env, env_id)


ENV_KINDS: dict[str, Callable[[str, dict[str, Any]], EnvCopy]] = {
    "gymnasium": make_gymnasium,
    "pettingzoo": make_pettingzoo,
    "openspiel": make_openspiel,
}
"""Environment families by `env.kind`."""


def _suggest_gymnasium(env_id: str) -> str:
    ids = list(gymnasium.registry)
    by_lower = {i.lower(): i for i in ids}
    close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=3, cutoff=0.5)
    if close:
        return f"did you mean {' or '.join(repr(by_lower[c]) for c in close)}?"
    return "set env.id to a registered gymnasium id, e.g. 'CartPole-v1'"


def _import_env_module(env_id: str) -> Any:
    try:
        return importlib.import_module(env_id)
    except ImportError as exc:
        raise missing_extra(exc, f"env.id={env_id}") or EnvError(
            f"could not import PettingZoo env module {env_id!r} ({exc})",
            _suggest_module(env_id),
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module: any error is theirs
        raise _module_error(env_id, exc) from exc


def _module_error(module: str, exc: Exception) -> EnvError:
    """A user's env module that does not import: where it broke, not our traceback."""
    if isinstance(exc, SyntaxError):
        return EnvError(
            f"env module {module!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}",
            f"fix line {exc.lineno} of {exc.filename}",
        )
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return EnvError(
        f"importing env module {module!r} raised {type(exc).__name__}: {exc}{where}",
        f"fix the module (`python -c 'import {module}'` shows the whole traceback)",
    )


def _kwargs_error(maker: str, kwargs: dict[str, Any], exc: Exception) -> EnvError:
    """The env's constructor raised: most often a keyword or value it does not take."""
    return EnvError(
        f"{maker} rejects env.kwargs {kwargs}: {type(exc).__name__}: {exc}",
        "fix or remove env.kwargs (the env's constructor names what it takes)",
    )


def _suggest_module(env_id: str) -> str:
    """Close sibling module names when the parent package imports, else an example id."""
    parent, _, name = env_id.rpartition(".")
    example = f"env.id must be an importable module with parallel_env(), e.g. {PETTINGZOO_EXAMPLE}"
    try:
        package = importlib.import_module(parent) if parent else None
    except ImportError:
        package = None
    if package is None or not hasattr(package, "__path__"):
        return example
    siblings = [m.name for m in pkgutil.iter_modules(package.__path__)]
    close = difflib.get_close_matches(name, siblings, n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(repr(f'{parent}.{c}') for c in close)}?"
    return example
