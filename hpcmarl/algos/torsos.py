"""Torsos: the part of a policy's network that turns a batch of observations into features.

`learner.model.torso` chooses it: `mlp` (the default: `learner.hidden_sizes` with the
algorithm's activation, the network hpcmarl always built), `cnn` (Nature-CNN-style, for image
observations), or `module:function`, a user's factory called as
`function(observation_space, **learner.model.kwargs)` that returns a `torch.nn.Module` mapping a
batch of observations `[B, *observation_space.shape]` (float32) to features `[B, F]`. The
algorithms add their heads on top (Q-values, logits, values, a recurrent core).

Collectors and replay store each observation as one flat row (float32, or uint8 for a uint8
Box: `GroupSpec.obs_dtype`; learners cast it to float32 on their device, `base.on_device`), so
a torso network (`Torso`) reshapes the rows to the space's shape before the torso and appends a
one-hot agent index, where the policy has one, to the features. The factory's name, its
keyword arguments and the observation space travel in the policy's spec (`contract.TorsoSpec`),
so every rank, checkpoint reader and evaluator rebuilds the same network
(`networks.policy_network`).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from hpcmarl.algos.contract import GroupSpec, TorsoSpec
from hpcmarl.errors import ConfigError

_KEY = "learner.model.torso"


def space_json(space: gymnasium.Space, width: int) -> dict[str, Any]:
    """The observation space a torso is built for, as JSON: a Box as it is (bounds as one
    number where they are uniform), any other space as the flat Box of its `width` values the
    collectors store."""
    if not isinstance(space, gymnasium.spaces.Box) or math.prod(space.shape) != width:
        return {"shape": [width], "dtype": "float32", "low": "-inf", "high": "inf"}
    return {
        "shape": list(space.shape),
        "dtype": np.dtype(space.dtype).name,
        "low": _bound(space.low),
        "high": _bound(space.high),
    }


def space_of(plain: Mapping[str, Any]) -> gymnasium.spaces.Box:
    """The Box `space_json` described."""
    shape, dtype = tuple(plain["shape"]), np.dtype(plain["dtype"])
    low, high = (_array(plain[k], shape, dtype) for k in ("low", "high"))
    return gymnasium.spaces.Box(low, high, shape, dtype)  # type: ignore[arg-type]


def _array(bound: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    values = np.asarray(bound, np.float64)
    values = np.broadcast_to(values, shape) if values.ndim == 0 else values.reshape(shape)
    return values.astype(dtype)


def _bound(values: np.ndarray) -> Any:
    flat = np.asarray(values, np.float64).reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return _number(flat[0])
    return [_number(v) for v in flat.tolist()]


def _number(value: float) -> Any:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return int(value) if float(value).is_integer() else float(value)


def torso_spec(job: Any, group: GroupSpec, policy: str) -> TorsoSpec:
    """The torso the job's `learner.model` gives `policy` of `group`."""
    model = job.learner.model
    if model.torso == "mlp":
        return TorsoSpec()
    agent = group.agents_of(policy)[0]
    width = group.obs_dims[agent]
    space = group.obs_spaces.get(agent) or space_json(_flat_box(width), width)
    return TorsoSpec(model.torso, dict(model.kwargs), dict(space))


def _flat_box(width: int) -> gymnasium.spaces.Box:
    return gymnasium.spaces.Box(-np.inf, np.inf, (width,), np.float32)


class Torso(nn.Module):
    """Flat observation rows `[..., width (+ agent ids)]` to features `[..., width_out]`: each
    row reshaped to the observation space's shape, through the torso, with the row's one-hot
    agent index (its last `agent_ids` values) appended to the features."""

    def __init__(self, net: nn.Module, shape: Sequence[int], features: int, agent_ids: int) -> None:
        super().__init__()
        self.net = net
        self.shape = tuple(shape)
        self.obs_width = math.prod(self.shape)
        self.agent_ids = agent_ids
        self.width = features + agent_ids
        """Width of the features the heads read."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        lead = rows.shape[:-1]
        obs = rows[..., : self.obs_width].reshape(-1, *self.shape)
        features = self.net(obs).reshape(*lead, -1)
        if not self.agent_ids:
            return features
        return torch.cat([features, rows[..., self.obs_width :]], dim=-1)


class TorsoHead(nn.Module):
    """A torso and one linear head: Q-values, logits or values of a feed-forward network."""

    def __init__(self, torso: Torso, out_dim: int) -> None:
        super().__init__()
        self.torso = torso
        self.head = nn.Linear(torso.width, out_dim)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(rows))


def make_torso(spec: TorsoSpec, agent_ids: int = 0) -> Torso:
    """The torso `spec` names, built on its observation space and checked on a batch of two
    sample observations: a `ConfigError` in one line for a factory that cannot be imported,
    is not callable, refuses its arguments, returns no `nn.Module`, or whose module does not
    map the batch to float features [2, F]."""
    factory = torso_factory(spec.name)
    space = space_of(spec.space)
    try:
        net = factory(space, **dict(spec.kwargs))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a user's factory may raise anything
        raise ConfigError(
            f"{_KEY} {spec.name} failed when called on {space}: {_reason(err)}",
            "make the factory accept (observation_space, **learner.model.kwargs) and return "
            "a torch.nn.Module; check learner.model.kwargs",
        ) from None
    if not isinstance(net, nn.Module):
        raise ConfigError(
            f"{_KEY} {spec.name} returned {type(net).__name__}, not a torch.nn.Module",
            "return an nn.Module instance (e.g. nn.Sequential(...)) from the factory",
        )
    return Torso(net, space.shape, _feature_width(spec.name, net, space), agent_ids)


def _feature_width(name: str, net: nn.Module, space: gymnasium.spaces.Box) -> int:
    """Features per observation, by running the torso on two sample observations (outside
    torch's global generator, which a resumable rank must leave alone)."""
    space.seed(0)
    batch = torch.as_tensor(np.stack([space.sample(), space.sample()]), dtype=torch.float32)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = net(batch)
    except Exception as err:  # noqa: BLE001 - a user's module may raise anything
        raise ConfigError(
            f"{_KEY} {name} failed on a batch of observations {tuple(batch.shape)}: {_reason(err)}",
            "the torso's forward must take a float32 batch [B, *observation_space.shape]",
        ) from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or not out.is_floating_point():
        got = f"a {out.dim()}-D {out.dtype} tensor" if isinstance(out, torch.Tensor) else "a "
        got += "" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"{_KEY} {name} maps a batch of 2 observations to {got}, not float features "
            "[batch, features]",
            "end the torso with a layer giving [B, F] floats (e.g. nn.Flatten, nn.Linear)",
        )
    if out.shape[0] != 2 or out.shape[1] < 1:
        raise ConfigError(
            f"{_KEY} {name} maps a batch of 2 observations to shape {tuple(out.shape)}",
            "keep the batch as the first axis and return at least one feature per row",
        )
    return int(out.shape[1])


def torso_factory(name: str) -> Callable[..., Any]:
    """The factory `learner.model.torso` names: a built-in, or `module:function` imported."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{_KEY} is {name!r}, neither a built-in torso nor module:function",
            f"use one of {', '.join(['mlp', *BUILT_IN])} or name your factory as "
            "my_package.nets:make_torso",
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - an import can fail in any way
        raise ConfigError(
            f"{_KEY} {name}: module {module_name} cannot be imported ({_reason(err)})",
            "put the module on PYTHONPATH (or in the directory the job starts from) on every "
            "node, or fix its import error",
        ) from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ConfigError(
            f"{_KEY} {name}: module {module_name} has no {attr}",
            f"name a function defined in {module_name}",
        )
    if not callable(factory):
        raise ConfigError(
            f"{_KEY} {name} is not callable (it holds {type(factory).__name__} {factory!r})",
            "name a function (observation_space, **kwargs) -> torch.nn.Module",
        )
    return factory  # type: ignore[no-any-return]


def check_torso(
    model: Any, spaces: Mapping[str, gymnasium.Space], widths: Mapping[str, int]
) -> None:
    """Refuse at start-up a `learner.model` no policy could be built with (see `make_torso`),
    by building the torso on each distinct observation space of the env's agents."""
    if model.torso == "mlp":
        if model.kwargs:
            raise ConfigError(
                f"learner.model.kwargs is {dict(model.kwargs)}, and the mlp torso takes none",
                "set the mlp's widths with learner.hidden_sizes, or drop learner.model.kwargs",
            )
        return
    seen: set[str] = set()
    for agent, space in spaces.items():
        plain = space_json(space, widths[agent])
        if str(plain) not in seen:
            seen.add(str(plain))
            with torch.random.fork_rng(devices=[]):
                make_torso(TorsoSpec(model.torso, dict(model.kwargs), plain))


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


# -- built-in torsos ----------------------------------------------------------------------------


class NatureCNN(nn.Module):
    """Convolutions with ReLU, then a linear layer to `features` (Mnih et al. 2015: 32 8x8/4,
    64 4x4/2, 64 3x3/1, 512). Images arrive [B, H, W, C] or [B, C, H, W] (a stack of frames,
    [B, k, ...], folds into channels); uint8 pixels are scaled to [0, 1]."""

    def __init__(
        self,
        shape: tuple[int, ...],
        channels_last: bool,
        scale: float,
        channels: Sequence[int],
        kernels: Sequence[int],
        strides: Sequence[int],
        features: int,
    ) -> None:
        super().__init__()
        self.shape, self.channels_last, self.scale = shape, channels_last, scale
        n = 1 + len(shape)  # [B, ..., H, W, C] -> [B, ..., C, H, W], in non-negative axes (ONNX)
        self.to_channels_first = [*range(n - 3), n - 1, n - 3, n - 2]
        layers: list[nn.Module] = []
        width = self.image_shape()[0]
        for out, kernel, stride in zip(channels, kernels, strides, strict=True):
            layers += [nn.Conv2d(width, out, kernel, stride), nn.ReLU()]
            width = out
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *self.image_shape())).shape[1]
        self.out = nn.Sequential(nn.Linear(flat, features), nn.ReLU())

    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image, stacked frames folded into C."""
        *stack, a, b, c = self.shape
        frames = math.prod(stack)
        return (frames * c, a, b) if self.channels_last else (frames * a, b, c)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            obs = obs.permute(self.to_channels_first)
        x = obs.reshape(obs.shape[0], *self.image_shape()) * self.scale
        return self.out(self.convs(x))


def cnn(
    space: gymnasium.spaces.Box,
    channels: Sequence[int] = (32, 64, 64),
    kernels: Sequence[int] = (8, 4, 3),
    strides: Sequence[int] = (4, 2, 1),
    features: int = 512,
    channels_last: bool | None = None,
) -> nn.Module:
    """The built-in `cnn` torso for image observations (H, W, C) or (C, H, W), uint8 or float;
    `channels_last` None guesses the layout (channels are the short axis, at most 4)."""
    shape = tuple(space.shape)
    if len(shape) not in (3, 4):
        raise ConfigError(
            f"{_KEY} cnn needs image observations (H, W, C) or (C, H, W); they are {shape}",
            "use learner.model.torso=mlp for vector observations",
        )
    if channels_last is None:
        channels_last = shape[-1] <= 4 or shape[-3] > 4
    scale = 1.0 / 255.0 if np.dtype(space.dtype) == np.uint8 else 1.0
    try:
        return NatureCNN(shape, channels_last, scale, channels, kernels, strides, features)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(
            f"{_KEY} cnn cannot run on images {shape} with kernels {list(kernels)} and strides "
            f"{list(strides)}: {_reason(err)}",
            "set smaller learner.model.kwargs kernels and strides (one per channels entry), "
            "e.g. {channels: [16, 32], kernels: [3, 3], strides: [1, 1]}",
        ) from None


BUILT_IN: dict[str, Callable[..., nn.Module]] = {"cnn": cnn}
"""Torsos by name, besides `mlp` (built by `networks.mlp`, bit for bit the network of runs
before torsos existed)."""
