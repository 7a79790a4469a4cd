"""OpenSpiel games as turn-based environment copies (`env.kind: openspiel`).

Any sequential OpenSpiel game plays through one adapter: agents `player_0..player_{n-1}`, each
observing its `information_state_tensor` (its `observation_tensor` where the game has no
information state), one of them `active` per step: the player to move. Chance nodes never reach
the learners: the copy samples them itself, with its own generator seeded at reset, so a seeded
run deals the same cards every time. The legal actions are the mover's mask (every other agent
gets all actions, so a masked argmax stays defined for rows nobody trains on); an illegal
action is a bug in the acting code, so it raises instead of being fixed up. Rewards are
`state.rewards()` per player per step: for poker, the terminal payoffs at the end.

A turn-based step is not a transition of every agent: `items.writers.TurnBasedWriter` stitches
each player's steps from one of its decisions to the next.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import gymnasium
import numpy as np

from hpcmarl.envs.adapters import StepBuffers
from hpcmarl.errors import EnvError
from hpcmarl.extras import require

OPENSPIEL_EXAMPLE = "kuhn_poker"


def make_openspiel(env_id: str, kwargs: dict[str, Any]) -> OpenSpielCopy:
    """An OpenSpiel game by name (`kuhn_poker`, with `env.kwargs` as its parameters) or by a
    full game string (`turn_based_simultaneous_game(game=goofspiel(num_cards=4))`)."""
    return OpenSpielCopy(load_game(env_id, kwargs), env_id)


def load_game(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The game, refused in one message if it is unknown, misconfigured or not turn-based."""
    pyspiel = require("pyspiel", "env.kind=openspiel")

    if "(" in env_id:
        if kwargs:
            raise EnvError(
                f"env.id {env_id!r} carries its parameters and env.kwargs gives {kwargs}",
                "give the game's parameters in one place: env.kwargs, or the env.id string",
            )
        game = _load(pyspiel, env_id, {})
    else:
        types = {t.short_name: t for t in pyspiel.registered_games()}
        if env_id not in types:
            raise EnvError(f"unknown OpenSpiel game {env_id!r}", _suggest(env_id, list(types)))
        known = dict(types[env_id].parameter_specification)
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise EnvError(
                f"OpenSpiel game {env_id} has no parameter(s) {unknown}",
                f"use env.kwargs among {known or 'none (the game takes no parameters)'}",
            )
        game = _load(pyspiel, env_id, kwargs)
    check_turn_based(game, env_id)
    return game


def check_turn_based(game: Any, env_id: str) -> None:
    """Refuse games this adapter cannot play: simultaneous moves, mean-field games, games that
    give the players no tensor to observe."""
    pyspiel = require("pyspiel", "env.kind=openspiel")

    kind = game.get_type()
    if kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        raise EnvError(
            f"OpenSpiel game {env_id} is a simultaneous-move game; the openspiel env kind plays "
            "turn-based games only",
            f"play it turn by turn: env.id='turn_based_simultaneous_game(game={env_id}())'",
        )
    if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise EnvError(
            f"OpenSpiel game {env_id} has {kind.dynamics.name.lower()} dynamics, not turns",
            f"pick a turn-based game, e.g. env.id={OPENSPIEL_EXAMPLE}",
        )
    if not (kind.provides_information_state_tensor or kind.provides_observation_tensor):
        raise EnvError(
            f"OpenSpiel game {env_id} provides neither an information_state_tensor nor an "
            "observation_tensor, so its players have nothing a network can read",
            "pick a game that provides one, e.g. kuhn_poker, leduc_poker or tic_tac_toe",
        )


class OpenSpielCopy:
    """One OpenSpiel game being played; see the module docstring for what a step is."""

    turn_based = True
    has_masks = True

    def __init__(self, game: Any, env_id: str) -> None:
        self.game, self.env_id = game, env_id
        n = game.num_players()
        self.agents = [f"player_{p}" for p in range(n)]
        info_state = game.get_type().provides_information_state_tensor
        self._tensor_of = "information_state_tensor" if info_state else "observation_tensor"
        shapes = (game.information_state_tensor_shape, game.observation_tensor_shape)
        dim = math.prod(shapes[0]() if info_state else shapes[1]())
        space = gymnasium.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        actions = gymnasium.spaces.Discrete(game.num_distinct_actions())
        self.observation_spaces: dict[str, gymnasium.Space] = dict.fromkeys(self.agents, space)
        self.action_spaces: dict[str, gymnasium.Space] = dict.fromkeys(self.agents, actions)
        self.state_dim = n * dim
        self._dim = dim
        self._joint = np.zeros(self.state_dim, np.float32)
        """Every player's tensor now, side by side: the global state, sliced per player."""
        self._rng = np.random.default_rng(0)
        self._state: Any = None
        self._rewards = np.zeros(n, np.float64)

    def state_into(self, i: int, out: np.ndarray) -> None:
        out[i] = self._joint

    def masks_into(self, i: int, out: list[np.ndarray]) -> None:
        for mask in out:
            mask[i] = True
        if not self._state.is_terminal():
            player = self._state.current_player()
            out[player][i] = self._state.legal_actions_mask(player)

    def reset_into(self, seed: int | None, i: int, obs: list[np.ndarray]) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state = self.game.new_initial_state()
        self._rewards[:] = 0.0
        self._resolve_chance()
        self._write_obs(i, obs)

    def step_into(self, actions: list[Any], i: int, out: StepBuffers) -> bool:
        state = self._state
        player = state.current_player()
        action = int(actions[player])
        self._check_legal(player, action)
        state.apply_action(action)
        self._rewards[:] = state.rewards()
        self._resolve_chance()
        self._write_obs(i, out.obs)
        done = bool(state.is_terminal())
        out.rewards[:, i] = self._rewards
        out.active[:, i] = False
        out.active[player, i] = True
        out.terminations[:, i] = done
        out.truncations[:, i] = False
        return done

    def close(self) -> None:
        self._state = None

    def _resolve_chance(self) -> None:
        """Sample chance outcomes until a player is to move (or the game is over); rewards
        that chance transitions bring are added to this step's."""
        state = self._state
        while state.is_chance_node():
            outcomes, probs = zip(*state.chance_outcomes(), strict=True)
            pick = self._rng.choice(len(outcomes), p=np.asarray(probs) / np.sum(probs))
            state.apply_action(outcomes[pick])
            self._rewards += state.rewards()

    def _write_obs(self, i: int, obs: list[np.ndarray]) -> None:
        for p in range(len(self.agents)):
            row = self._joint[p * self._dim : (p + 1) * self._dim]
            row[:] = getattr(self._state, self._tensor_of)(p)
            obs[p][i] = row

    def _check_legal(self, player: int, action: int) -> None:
        legal = self._state.legal_actions(player)
        if action not in legal:
            raise EnvError(
                f"player_{player} chose action {action} in {self.env_id}, which is illegal "
                f"here; the legal actions are {legal}",
                "act with the env's action_masks (a policy that ignores them is a bug)",
            )


def _load(pyspiel: Any, name: str, params: dict[str, Any]) -> Any:
    try:
        return pyspiel.load_game(name, params) if params else pyspiel.load_game(name)
    except (pyspiel.SpielError, TypeError, ValueError) as exc:
        raise EnvError(
            f"OpenSpiel cannot load {name} with parameters {params}: {exc}",
            "fix env.kwargs (or the game string in env.id)",
        ) from exc


def _suggest(env_id: str, names: list[str]) -> str:
    close = difflib.get_close_matches(env_id.lower(), names, n=3, cutoff=0.5)
    if close:
        return f"did you mean {' or '.join(repr(c) for c in close)}?"
    return f"set env.id to an OpenSpiel game name, e.g. {OPENSPIEL_EXAMPLE!r}"
