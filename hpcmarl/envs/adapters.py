"""One environment copy behind one interface, whether it has one agent or many.

A gymnasium env is the one-agent case (agent id `agent_0`); a PettingZoo parallel env is the
general case. A copy writes its step straight into row `i` of the vector env's output arrays,
in a fixed, sorted agent order: no per-step dicts or lists for the one-agent case, because the
collector's hot loop is benchmarked against a bare loop of the same env.

Every copy also has a global state (what a centralised critic sees): PettingZoo's `state()`
where the env has one, else every agent's observation side by side; for gymnasium the
observation itself. It is written only when the vector env asks (`with_state`).

A copy may also know each agent's legal actions (`has_masks`): a gymnasium env gives them as
`info["action_mask"]`, a PettingZoo env as observation dicts `{"observation", "action_mask"}`
(only the observation part is the agent's observation). Like the state, masks are pulled by the
vector env after each reset and step (`masks_into`), and only from envs that have them, so an
env without masks pays one flag test per step. A gymnasium env's masks are found at its first
reset: nothing in its spaces says it has them.

What a copy is given is checked where it is written: an observation must have its space's shape
(a shape-(1,) observation would otherwise be broadcast into every input) and a numeric dtype,
and a reward must be a number; a copy that gets anything else raises `BadOutput`, which the
vector env turns into one error naming the env, agent, step and field. Whether rewards and
observations are finite is checked by the vector env over the whole step at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium
import numpy as np

from hpcmarl.errors import EnvError

SINGLE_AGENT_ID = "agent_0"
"""Agent id of a gymnasium (one-agent) environment."""


class BadOutput(Exception):
    """What an env copy returned for one agent cannot be trained on; the vector env adds the
    env, the step and the copy (`vector.EnvOutputError`)."""

    def __init__(self, field: str, problem: str, agent: str | None = None) -> None:
        super().__init__(f"{problem} as the {field} of agent {agent!r}")
        self.field, self.problem, self.agent = field, problem, agent


NUMERIC_KINDS = frozenset("biuf")
"""numpy dtype kinds an observation may have: bool, ints, floats."""


@dataclass
class StepBuffers:
    """One vector step's outputs; index [agent position][copy]. Rewards and observations are
    views of one float32 array (`numbers`), so one dot product checks the whole step."""

    obs: list[np.ndarray]
    """Per agent, float32 [num_envs, obs_dim]."""
    rewards: np.ndarray
    """float32 [agents, num_envs]."""
    terminations: np.ndarray
    """bool [agents, num_envs]."""
    truncations: np.ndarray
    """bool [agents, num_envs]."""
    active: np.ndarray
    """bool [agents, num_envs]; True when the agent acted in this step, False for the padding
    of an agent that finished before its episode did."""
    state: np.ndarray | None = None
    """float32 [num_envs, state_dim] after the step (the true s'), or None when not tracked."""
    action_masks: list[np.ndarray] | None = None
    """Per agent, bool [num_envs, n_actions]: the legal actions at the observation in `obs`;
    None when the env has no masks."""
    numbers: np.ndarray | None = None
    """float32, flat: the rewards and then every agent's observations, which are views of it."""

    @classmethod
    def empty(
        cls,
        obs_dims: list[int],
        num_envs: int,
        state_dim: int | None,
        n_actions: list[int] | None = None,
    ) -> StepBuffers:
        """Buffers for one step; mask arrays only when `n_actions` (the env has masks)."""
        shape = (len(obs_dims), num_envs)
        numbers = np.empty(num_envs * (len(obs_dims) + sum(obs_dims)), np.float32)
        return cls(
            obs=obs_views(numbers, obs_dims, num_envs),
            rewards=numbers[: len(obs_dims) * num_envs].reshape(shape),
            terminations=np.empty(shape, dtype=bool),
            truncations=np.empty(shape, dtype=bool),
            active=np.ones(shape, dtype=bool),
            state=None if state_dim is None else np.empty((num_envs, state_dim), np.float32),
            action_masks=empty_masks(n_actions, num_envs),
            numbers=numbers,
        )


def obs_views(numbers: np.ndarray, obs_dims: list[int], num_envs: int) -> list[np.ndarray]:
    """Each agent's [num_envs, obs_dim] observations within a step's `numbers`."""
    views, start = [], len(obs_dims) * num_envs
    for d in obs_dims:
        views.append(numbers[start : start + num_envs * d].reshape(num_envs, d))
        start += num_envs * d
    return views


def empty_masks(n_actions: list[int] | None, num_envs: int) -> list[np.ndarray] | None:
    """Per agent bool [num_envs, n] mask arrays, or None for an env without masks."""
    if n_actions is None:
        return None
    return [np.empty((num_envs, n), dtype=bool) for n in n_actions]


class EnvCopy(Protocol):
    """What the vector env needs from one environment copy."""

    agents: list[str]
    observation_spaces: dict[str, gymnasium.Space]
    action_spaces: dict[str, gymnasium.Space]
    state_dim: int
    has_masks: bool
    """The env supplies legal-action masks (known after the first reset)."""
    turn_based: bool
    """One agent acts per step (`active`); the others' actions are ignored."""

    def state_into(self, i: int, out: np.ndarray) -> None:
        """Write the global state now into row `i` of `out`."""
        ...

    def masks_into(self, i: int, out: list[np.ndarray]) -> None:
        """Write each agent's legal actions now into row `i` of its mask array."""
        ...

    def reset_into(self, seed: int | None, i: int, obs: list[np.ndarray]) -> None:
        """Reset and write each agent's flat observation into row `i` of `obs`."""
        ...

    def step_into(self, actions: list[Any], i: int, out: StepBuffers) -> bool:
        """Step with one action per agent, write row `i` of `out`; True when the episode is
        over."""
        ...

    def close(self) -> None: ...


def old_gym_api(env_id: str, what: str) -> EnvError:
    """An env written for gym < 0.26: its outputs would be unpacked into the wrong fields."""
    return EnvError(
        f"{env_id} uses the old gym API: its {what}",
        "port it to gymnasium's API (reset returns (obs, info); step returns (obs, reward, "
        "terminated, truncated, info)), or wrap it in shimmy's GymV26CompatibilityV0",
    )


class GymnasiumCopy:
    """A gymnasium env as a one-agent copy; the episode is over on termination or truncation.
    Masks come from `info["action_mask"]`; a step whose info lacks one (a terminal step, say)
    gets an all-legal mask."""

    turn_based = False

    def __init__(self, env: gymnasium.Env, env_id: str) -> None:
        self.env = env
        self.env_id = env_id
        self.agents = [SINGLE_AGENT_ID]
        self.observation_spaces = {SINGLE_AGENT_ID: env.observation_space}
        self.action_spaces = {SINGLE_AGENT_ID: env.action_space}
        self._flat = flattener(env.observation_space, env_id)
        self._offset = action_offset(env.action_space)
        self._box = box_clipper(env.action_space)
        limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
        self.time_limit = limit if limit is not None and limit > 0 else None
        """The env's own episode limit (its TimeLimit), or None: its episodes may never end."""
        self.state_dim = gymnasium.spaces.flatdim(env.observation_space)
        self._last: Any = None
        self.has_masks = False
        self._mask: Any = None

    def state_into(self, i: int, out: np.ndarray) -> None:
        out[i] = self._last

    def masks_into(self, i: int, out: list[np.ndarray]) -> None:
        out[0][i] = True if self._mask is None else self._mask

    def reset_into(self, seed: int | None, i: int, obs: list[np.ndarray]) -> None:
        result = self.env.reset(seed=seed)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            raise old_gym_api(self.env_id, "reset() returned only the observation")
        first, info = result
        self._write_obs(first, obs, i)
        self._mask = info.get("action_mask")
        self.has_masks = self.has_masks or self._mask is not None

    def step_into(self, actions: list[Any], i: int, out: StepBuffers) -> bool:
        if self._box is not None:
            action = self._box(actions[0])
        else:
            action = actions[0] + self._offset if self._offset else actions[0]
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.has_masks:
            self._mask = info.get("action_mask")
        self._write_obs(obs, out.obs, i)
        if reward is None:  # numpy would store it as NaN
            raise BadOutput("reward", "None", SINGLE_AGENT_ID)
        try:
            out.rewards[0, i] = reward
        except (TypeError, ValueError) as err:
            raise BadOutput("reward", not_a_number(reward), SINGLE_AGENT_ID) from err
        out.terminations[0, i] = terminated
        out.truncations[0, i] = truncated
        return terminated or truncated

    def check_api(self) -> None:
        """One step of the bare env (after a reset), by a legal action: gymnasium's wrappers
        unpack a step themselves, so a 4-value step fails inside them with a bare ValueError."""
        action: Any = 0 if self._mask is None else int(np.argmax(self._mask))
        if self._box is not None:
            action = self._box(np.zeros(gymnasium.spaces.flatdim(self.env.action_space)))
        else:
            action += self._offset
        result = self.env.unwrapped.step(action)
        if not isinstance(result, tuple) or len(result) != 5:
            got = f"{len(result)} values" if isinstance(result, tuple) else describe(result)
            raise old_gym_api(self.env_id, f"step() returned {got}, not 5")

    def close(self) -> None:
        self.env.close()

    def _write_obs(self, obs: Any, arrays: list[np.ndarray], i: int) -> None:
        try:
            arrays[0][i] = self._last = self._flat(obs)
        except BadOutput as bad:
            bad.agent = SINGLE_AGENT_ID
            raise
        except (TypeError, ValueError) as err:  # not numbers
            raise BadOutput("observation", describe(obs), SINGLE_AGENT_ID) from err


class PettingZooSpaces:
    """What every PettingZoo copy, parallel or AEC, reads from its env's spaces: the agents in
    sorted order, whether observations carry action masks, and per agent the observation part,
    its flattener and the action offset."""

    def __init__(self, env: Any, env_id: str) -> None:
        self.env = env
        self.agents = sorted(env.possible_agents)
        spaces = {a: env.observation_space(a) for a in self.agents}
        self.has_masks = all(has_mask_dict(space) for space in spaces.values())
        self.observation_spaces = {a: observation_part(s) for a, s in spaces.items()}
        self.action_spaces = {a: env.action_space(a) for a in self.agents}
        self._flat = [flattener(self.observation_spaces[a], env_id) for a in self.agents]
        self._offset = [action_offset(self.action_spaces[a]) for a in self.agents]
        self._box = [box_clipper(self.action_spaces[a]) for a in self.agents]
        self._continuous = any(clip is not None for clip in self._box)


class ParallelCopy(PettingZooSpaces):
    """A PettingZoo parallel env. An agent that finished before the others gets padding rows
    (zero obs, zero reward, terminated, not active, all actions legal) until the whole episode
    is over, which is when the env has no live agents left."""

    turn_based = False

    def __init__(self, env: Any, env_id: str) -> None:
        super().__init__(env, env_id)
        self._masks: list[Any] = [None] * len(self.agents)
        space = getattr(env, "state_space", None)
        self._own_state = space is not None and callable(getattr(env, "state", None))
        dims = [gymnasium.spaces.flatdim(self.observation_spaces[a]) for a in self.agents]
        self.state_dim = sum(dims)
        if space is not None and self._own_state:
            self.state_dim = gymnasium.spaces.flatdim(space)
        self._last: list[np.ndarray] = [np.zeros(d, np.float32) for d in dims]

    def state_into(self, i: int, out: np.ndarray) -> None:
        """PettingZoo's `state()`, or the agents' observations side by side (zeros for agents
        that have finished)."""
        if self._own_state:
            out[i] = np.reshape(self.env.state(), -1)
        else:
            out[i] = np.concatenate(self._last)

    def masks_into(self, i: int, out: list[np.ndarray]) -> None:
        for k, mask in enumerate(self._masks):
            out[k][i] = True if mask is None else mask

    def reset_into(self, seed: int | None, i: int, obs: list[np.ndarray]) -> None:
        first, _ = self.env.reset(seed=seed)
        self._write_obs(first, i, obs)

    def step_into(self, actions: list[Any], i: int, out: StepBuffers) -> bool:
        live = set(self.env.agents)
        if self._continuous:
            clip = self._box
            sent = {a: clip[k](actions[k]) for k, a in enumerate(self.agents) if a in live}  # type: ignore[misc]
        else:
            sent = {
                a: actions[k] + self._offset[k] if self._offset[k] else actions[k]
                for k, a in enumerate(self.agents)
                if a in live
            }
        obs, rewards, terms, truncs, _ = self.env.step(sent)
        self._write_obs(obs, i, out.obs)
        for k, agent in enumerate(self.agents):
            reward = rewards.get(agent, 0.0)
            if reward is None:  # numpy would store it as NaN
                raise BadOutput("reward", "None", agent)
            try:
                out.rewards[k, i] = reward
            except (TypeError, ValueError) as err:
                raise BadOutput("reward", not_a_number(reward), agent) from err
            out.terminations[k, i] = terms.get(agent, agent not in live)
            out.truncations[k, i] = truncs.get(agent, False)
            out.active[k, i] = agent in live
        return not self.env.agents

    def close(self) -> None:
        self.env.close()

    def _write_obs(self, obs: dict[str, Any], i: int, arrays: list[np.ndarray]) -> None:
        if self.has_masks:
            obs = self._split_masks(obs)
        for k, agent in enumerate(self.agents):
            try:
                arrays[k][i] = self._flat[k](obs[agent]) if agent in obs else 0.0
            except BadOutput as bad:
                bad.agent = agent
                raise
            except (TypeError, ValueError) as err:  # not numbers
                raise BadOutput("observation", describe(obs[agent]), agent) from err
            if not self._own_state:
                self._last[k] = arrays[k][i]

    def _split_masks(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Keep each agent's mask (None for a finished agent: all legal), return the
        observation parts."""
        self._masks = [obs[a]["action_mask"] if a in obs else None for a in self.agents]
        return {a: part["observation"] for a, part in obs.items()}


def has_mask_dict(space: gymnasium.Space) -> bool:
    """PettingZoo's convention for legal actions: a Dict of `observation` and `action_mask`."""
    return isinstance(space, gymnasium.spaces.Dict) and {"observation", "action_mask"} <= set(
        space.spaces
    )


def observation_part(space: gymnasium.Space) -> gymnasium.Space:
    """The agent's observation space without the mask, which is not something to learn from."""
    if isinstance(space, gymnasium.spaces.Dict) and has_mask_dict(space):
        return space["observation"]
    return space


def flattener(space: gymnasium.Space, env_id: str) -> Callable[[Any], Any]:
    """A function turning one observation into a 1-D array, raising `BadOutput` for one that
    does not fit the space; for a 1-D box, a numeric array of its shape passes as it is (the
    common case costs one comparison)."""
    if isinstance(space, gymnasium.spaces.Box):
        shape = space.shape

        def box(obs: Any) -> Any:
            try:
                if obs.shape == shape:  # a non-numeric dtype fails where it is written
                    return obs if len(shape) == 1 else obs.reshape(-1)
            except AttributeError:  # a list, a float, None
                pass
            return conform(obs, shape).reshape(-1)

        return box
    try:
        gymnasium.spaces.flatdim(space)
    except (ValueError, NotImplementedError) as exc:
        raise EnvError(
            f"{env_id} has observation space {space}, which cannot be flattened to a vector",
            "wrap the environment so that it returns Box (or Discrete/MultiDiscrete) observations",
        ) from exc

    def other(obs: Any) -> Any:
        try:
            return gymnasium.spaces.flatten(space, obs)
        except (TypeError, ValueError, KeyError, AssertionError) as err:
            raise BadOutput("observation", f"{describe(obs)}, which {space} cannot hold") from err

    return other


def conform(obs: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`obs` as an array of `shape` with a numeric dtype (a list, a float64 array), or
    `BadOutput` saying what it is instead."""
    try:
        array = np.asarray(obs)
    except (TypeError, ValueError) as err:  # ragged lists
        raise BadOutput("observation", describe(obs)) from err
    if array.dtype.kind not in NUMERIC_KINDS:
        raise BadOutput("observation", describe(obs))
    if array.shape != shape:
        raise BadOutput("observation", f"shape {array.shape} (its space says {shape})")
    return array


def describe(value: Any) -> str:
    """A short account of an observation that does not fit: None, or its type, dtype, shape."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return f"a {type(value).__name__}"


def not_a_number(reward: Any) -> str:
    """What a reward that numpy refused to store as a float is."""
    return f"a {type(reward).__name__} ({str(reward)[:40]})"


def box_clipper(space: gymnasium.Space) -> Callable[[Any], np.ndarray] | None:
    """For a `Box` action space, what turns a policy's flat action vector into one the env
    takes: clipped to the bounds (the Gaussian actor's sample is unbounded; its unclipped value
    is what items keep, for the log-probability) and shaped and typed as the space; None for
    other spaces."""
    if not isinstance(space, gymnasium.spaces.Box):
        return None
    low, high = space.low.reshape(-1), space.high.reshape(-1)
    shape, dtype = space.shape, space.dtype

    def clip(action: Any) -> np.ndarray:
        return np.clip(action, low, high).reshape(shape).astype(dtype, copy=False)

    return clip


def box_bounds(space: gymnasium.Space) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The flat (low, high) bounds of a `Box` action space, None for other spaces."""
    if not isinstance(space, gymnasium.spaces.Box):
        return None
    low = tuple(float(x) for x in space.low.reshape(-1))
    return low, tuple(float(x) for x in space.high.reshape(-1))


def action_offset(space: gymnasium.Space) -> int:
    """Policies emit actions 0..n-1; a Discrete space may start elsewhere."""
    return int(space.start) if isinstance(space, gymnasium.spaces.Discrete) else 0
