"""Several environment copies stepped together, one data path for one agent or many.

The loop is written here rather than borrowed from gymnasium's vector wrappers so that the final
observation of an ended episode is always the true s' (`next_observations`) while the reset
observation goes to `observations`, and so that the per-step overhead over a bare env loop stays
a few list operations. Legal-action masks follow the same split (`next_action_masks` at s',
`action_masks` for what to act on next) and exist only for envs that supply them.

Every step is checked before anything learns from it: the copies check shapes and dtypes where
they write (`adapters.BadOutput`), and one dot product of the step's rewards and observations
(one float32 array) with zeros finds NaN and inf. A step that fails raises `EnvOutputError`
naming the env, the agent, the step and the field; the collector lets it end the job, since a
NaN that reaches a learner turns every weight NaN and a run goes on "training" in silence.
The check costs one numpy call per vector step, and a shape, a dtype and a None test per agent
and copy: timed alone, 0.6 us for the dot product and about 1 % of a collector step in all
(docs/benchmarks.md, 2026-12-06). `tools/bench_collector.py --env-check` measures the
collector with and without the finite test (`check_finite`, which only that benchmark turns
off; the shape, dtype and None tests are part of writing a step and stay).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import gymnasium
import numpy as np

from hpcmarl.config.schema import EnvConfig
from hpcmarl.envs.adapters import BadOutput, EnvCopy, StepBuffers, empty_masks, obs_views
from hpcmarl.envs.registry import make_env_copy
from hpcmarl.errors import EnvError, EnvOutputError

AgentArrays = dict[str, np.ndarray]


@dataclass
class VectorStep:
    """One step of every copy; arrays are fresh each step, rows are env copies."""

    next_observations: AgentArrays
    """The true s' of this step: for a copy whose episode just ended, its final observation."""
    observations: AgentArrays
    """What to act on next: equal to `next_observations` except for ended copies (reset obs)."""
    rewards: AgentArrays
    """float32 [num_envs] per agent."""
    terminations: AgentArrays
    """bool [num_envs]: s' is terminal, do not bootstrap."""
    truncations: AgentArrays
    """bool [num_envs]: the episode was cut (time limit); s' still bootstraps."""
    episode_ended: np.ndarray
    """bool [num_envs]: the copy was reset after this step."""
    active: AgentArrays = field(default_factory=dict)
    """bool [num_envs]: the agent acted in this step. False rows are padding for an agent that
    finished before the rest of its multi-agent episode; they never reach a learner's table."""
    next_states: np.ndarray | None = None
    """float32 [num_envs, state_dim]: the true global s' (None unless the env tracks state)."""
    states: np.ndarray | None = None
    """The global state to act on next: `next_states`, or the reset state for ended copies."""
    next_action_masks: AgentArrays | None = None
    """bool [num_envs, n_actions] per agent: the legal actions at the true s' (None when the
    env has no masks)."""
    action_masks: AgentArrays | None = None
    """The legal actions at `observations`: what the agents act on next."""


class MultiAgentVectorEnv:
    """`num_envs` copies of one environment, auto-reset, copy i seeded `seed + i` on its first
    reset. With `with_state`, `states` holds the global state of every copy; for an env with
    masks, `action_masks` holds the legal actions to act on now."""

    def __init__(
        self,
        copies: list[EnvCopy],
        seed: int,
        with_state: bool = False,
        env_id: str = "the environment",
    ) -> None:
        if not copies:
            raise ValueError("a vector env needs at least one environment copy")
        self._copies = copies
        self.env_id = env_id
        self.steps = 0
        """Steps taken (by every copy: they step together), for naming a bad one."""
        self._seed = seed
        self._seeded = False
        self.state_dim = copies[0].state_dim
        """Width of the global state."""
        self._state_dim = self.state_dim if with_state else None
        self.states: np.ndarray | None = None
        """float32 [num_envs, state_dim] now (after the last reset or step), if tracked."""
        self.num_envs = len(copies)
        self.agents: list[str] = list(copies[0].agents)
        """Agent ids in fixed, sorted order."""
        self._positions = tuple(enumerate(self.agents))
        first = copies[0]
        self._obs_dims = [
            gymnasium.spaces.flatdim(first.observation_spaces[a]) for a in self.agents
        ]
        self.turn_based = bool(first.turn_based)
        """One agent acts per step (`VectorStep.active`); the others' actions are ignored."""
        self.action_masks: AgentArrays | None = None
        """bool [num_envs, n_actions] per agent now (after the last reset or step), or None
        for an env without masks."""
        self._n_actions: list[int] | None = None
        self.check_finite = True
        """Look for NaN and inf in every step (off only in tools/bench_collector.py's A/B)."""
        self._zeros = np.zeros(self.num_envs * (len(self.agents) + sum(self._obs_dims)), np.float32)
        """What a step's rewards and observations are dotted with: 0 unless one is NaN or inf
        (a quarter of what `np.isfinite(...).all()` costs, and exact: no product can overflow)."""

    def all_finite(self, numbers: np.ndarray) -> bool:
        """The check made on every step's rewards and observations (`numbers`, as a step
        buffer holds them); only where it fails are they searched for the culprit."""
        return bool(numbers.dot(self._zeros) == 0.0)

    def step_numbers(self) -> np.ndarray:
        """A buffer of the size `all_finite` takes, all zeros (for tools/bench_collector.py)."""
        return np.zeros_like(self._zeros)

    @property
    def time_limit(self) -> int | None:
        """The env's own episode limit (a gymnasium TimeLimit), or None where it has none or
        it is not known (PettingZoo and OpenSpiel envs)."""
        return getattr(self._copies[0], "time_limit", None)

    @property
    def unlimited(self) -> bool:
        """The env is known to have no time limit (a gymnasium env without a TimeLimit): its
        episodes may never end."""
        return hasattr(self._copies[0], "time_limit") and self.time_limit is None

    @property
    def has_masks(self) -> bool:
        """Whether the env supplies legal-action masks; known once `reset()` has run."""
        return self._n_actions is not None

    def obs_dim(self, agent: str) -> int:
        """Length of the agent's flattened observation."""
        return self._obs_dims[self.agents.index(agent)]

    def n_actions(self, agent: str) -> int:
        """Number of discrete actions of the agent, or the width of its flat action vector
        for a `Box` space (other spaces have neither)."""
        space = self.action_space(agent)
        if isinstance(space, gymnasium.spaces.Box):
            return gymnasium.spaces.flatdim(space)
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise EnvError(
                f"agent {agent!r} has action space {space}, which has no action count",
                "use an algorithm for this action space or an environment with Discrete actions",
            )
        return int(space.n)

    def action_space(self, agent: str) -> gymnasium.Space:
        """The agent's action space (the same in every copy)."""
        return self._copies[0].action_spaces[agent]

    def observation_space(self, agent: str) -> gymnasium.Space:
        """The agent's unflattened observation space."""
        return self._copies[0].observation_spaces[agent]

    def reset(self, seed: int | None = None) -> AgentArrays:
        """Reset every copy; only the first call seeds them (later resets continue their RNG)
        unless `seed` is given: then copy i is reseeded with `seed + i`."""
        buffers = StepBuffers.empty(self._obs_dims, self.num_envs, self._state_dim)
        base = seed if seed is not None else (None if self._seeded else self._seed)
        for i, copy in enumerate(self._copies):
            with self._blaming(i, "at its reset"):
                copy.reset_into(None if base is None else base + i, i, buffers.obs)
            if buffers.state is not None:
                copy.state_into(i, buffers.state)
        self._check_finite(buffers.obs, range(self.num_envs), "at its reset")
        if self._copies[0].has_masks and self._n_actions is None:
            self._n_actions = [self.n_actions(a) for a in self.agents]
        masks = empty_masks(self._n_actions, self.num_envs)
        if masks is not None:
            for i, copy in enumerate(self._copies):
                copy.masks_into(i, masks)
            self.action_masks = self._by_agent(masks)
        self._seeded = True
        self.states = buffers.state
        return self._by_agent(buffers.obs)

    def step(self, actions: AgentArrays) -> VectorStep:
        """Step every copy with its row of `actions` (agent -> [num_envs]); reset ended copies."""
        if not self._seeded:
            raise RuntimeError("call reset() before the first step()")
        per_agent = [_rows(actions[a]) for a in self.agents]
        out = StepBuffers.empty(self._obs_dims, self.num_envs, self._state_dim, self._n_actions)
        ended = []
        self.steps += 1
        for i, copy in enumerate(self._copies):
            try:
                if copy.step_into([a[i] for a in per_agent], i, out):
                    ended.append(i)
            except BadOutput as bad:
                raise self._output_error(bad, i, f"at step {self.steps}") from bad
            if out.state is not None:
                copy.state_into(i, out.state)
            if out.action_masks is not None:
                copy.masks_into(i, out.action_masks)
        numbers = out.numbers
        assert numbers is not None  # StepBuffers.empty made it
        after = numbers.copy()  # what to act on next: reset observations go in here
        observations = obs_views(after, self._obs_dims, self.num_envs)
        states = None if out.state is None else out.state.copy()
        masks = None if out.action_masks is None else [m.copy() for m in out.action_masks]
        if self.check_finite and not self.all_finite(numbers):
            when = f"at step {self.steps}"
            self._check_finite(list(out.rewards), range(self.num_envs), when, "reward")
            self._check_finite(out.obs, range(self.num_envs), when)
        for i in ended:
            try:
                self._copies[i].reset_into(None, i, observations)
            except BadOutput as bad:
                raise self._output_error(bad, i, "at its reset") from bad
            if states is not None:
                self._copies[i].state_into(i, states)
            if masks is not None:
                self._copies[i].masks_into(i, masks)
        if ended and self.check_finite and not self.all_finite(after):
            self._check_finite(observations, ended, "at its reset")
        self.states = states
        next_masks = None if out.action_masks is None else self._by_agent(out.action_masks)
        self.action_masks = None if masks is None else self._by_agent(masks)
        episode_ended = np.zeros(self.num_envs, dtype=bool)
        if ended:
            episode_ended[ended] = True
        return VectorStep(
            next_observations=self._by_agent(out.obs),
            observations=self._by_agent(observations),
            rewards=self._by_agent(out.rewards),
            terminations=self._by_agent(out.terminations),
            truncations=self._by_agent(out.truncations),
            episode_ended=episode_ended,
            active=self._by_agent(out.active),
            next_states=out.state,
            states=states,
            next_action_masks=next_masks,
            action_masks=self.action_masks,
        )

    def check_api(self) -> None:
        """After a reset: refuse a copy whose env speaks an older API than its family's (an
        old-gym env whose step returns 4 values), before any collector steps it."""
        for copy in self._copies:
            if hasattr(copy, "check_api"):
                copy.check_api()

    def close(self) -> None:
        """Close every copy (renderers, subprocesses of the underlying envs)."""
        for copy in self._copies:
            copy.close()

    def _by_agent(self, rows: np.ndarray | list[np.ndarray]) -> AgentArrays:
        """Each agent's row of `rows` (a list, or an array with a row per agent), taken by
        index: iterating an array to its end (as `zip` does) raises an IndexError inside numpy
        whose message is formatted and dropped, about 3,000 instructions, four times a step:
        7 % of a CartPole step."""
        return {agent: rows[k] for k, agent in self._positions}

    def _output_error(self, bad: BadOutput, copy: int, when: str) -> EnvOutputError:
        return EnvOutputError(
            f"{self.env_id} returned {bad.problem} as the {bad.field} of agent {bad.agent!r} "
            f"{when} of env copy {copy}",
            f"make its step() and reset() return finite numbers, observations of the shape its "
            f"observation_space says, or wrap it so that it does (a NaN {bad.field} trained on "
            "turns every weight NaN)",
        )

    @contextmanager
    def _blaming(self, copy: int, when: str) -> Iterator[None]:
        try:
            yield
        except BadOutput as bad:
            raise self._output_error(bad, copy, when) from bad

    def _check_finite(
        self, arrays: list[np.ndarray], copies: Iterable[int], when: str, field: str = "observation"
    ) -> None:
        """Raise for the first agent and copy whose value in `arrays` (one per agent, a row
        per copy) is NaN or inf."""
        for k, array in enumerate(arrays):
            for i in copies:
                row = np.atleast_1d(array[i])
                bad = ~np.isfinite(row)
                if bad.any():
                    problem = f"{row[bad][0]}"
                    raise self._output_error(BadOutput(field, problem, self.agents[k]), i, when)


def make_vector_env(
    env_cfg: EnvConfig, num_envs: int, seed: int, with_state: bool = False, frame_stack: int = 1
) -> MultiAgentVectorEnv:
    """`num_envs` copies of the configured environment, copy i seeded `seed + i`, each
    stacking its last `frame_stack` observations."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    copies = [make_env_copy(env_cfg, frame_stack) for _ in range(num_envs)]
    return MultiAgentVectorEnv(copies, seed, with_state, env_cfg.id)


def _rows(actions: np.ndarray) -> list:
    """Per-copy actions; plain Python ints for discrete actions, which every env accepts."""
    actions = np.asarray(actions)
    return actions.tolist() if actions.ndim == 1 else list(actions)
