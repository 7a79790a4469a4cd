"""Meta-solvers: from the empirical payoff tensors of a population to one meta-strategy per player.

`payoffs[p]` is player p's payoff tensor, one axis per player (for two players: rows are
player 0's policies, columns player 1's); the answer is one probability vector per player over
that player's policies. Every solver here is a pure function of those arrays, so the PSRO
schedule can call it anywhere and a test can check it on a matrix game with a known answer.
`META_SOLVERS` is the one list of the names `psro.meta_solver` accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hpcmarl.errors import UserError
from hpcmarl.extras import require

MetaSolver = Callable[[Sequence[np.ndarray]], list[np.ndarray]]
"""payoffs[p] [n_0, ..., n_{P-1}] per player -> one distribution [n_p] per player."""

ZERO_SUM_TOLERANCE = 1e-6
"""How far payoffs[0] + payoffs[1] may stray from a constant, relative to the payoffs' scale,
before a game is no longer zero-sum: empirical means of a zero-sum game cancel up to rounding."""


class MetaSolverError(UserError, ValueError):
    """Payoffs the chosen meta-solver cannot solve, or a solver name that does not exist."""


def nash(payoffs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """An exact Nash equilibrium of a two-player zero-sum (or constant-sum) matrix game.

    Two linear programs (maximin for the rows, minimax for the columns) solved by HiGHS; in a
    zero-sum game any pair of maximin strategies is an equilibrium, so no search is needed.
    """
    tensors = _checked(payoffs)
    if len(tensors) != 2:
        raise MetaSolverError(
            f"the nash meta-solver solves two-player games; this one has {len(tensors)} players",
            "set psro.meta_solver to uniform or prd",
        )
    _require_constant_sum(tensors[0], tensors[1])
    rows = _maximin(tensors[0])
    columns = _maximin(-tensors[0].T)
    return [rows, columns]


def uniform(payoffs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every policy of the population equally likely: PSRO with this solver is fictitious play."""
    return [np.full(n, 1.0 / n) for n in _checked(payoffs)[0].shape]


def projected_replicator_dynamics(
    payoffs: Sequence[np.ndarray],
    iterations: int = 100_000,
    dt: float = 1e-3,
    gamma: float = 1e-6,
    average_last: int | None = None,
    initial: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Projected replicator dynamics (Lanctot et al. 2017, PRD), for any number of players.

    Each step grows a policy's weight by how much better than the player's average it does,
    then projects back onto the simplex with every weight at least `gamma`, so no policy dies
    out and a later best response can still revive it. Replicator dynamics cycle around
    interior equilibria (rock-paper-scissors) instead of converging, so the answer is the mean of
    the last `average_last` iterates (all of them by default), which does approach them.
    """
    tensors = _checked(payoffs)
    shape = tensors[0].shape
    if iterations < 1 or dt <= 0 or not 0 <= gamma * max(shape) < 1:
        raise MetaSolverError(
            f"prd needs iterations >= 1, dt > 0 and 0 <= gamma < 1/n (got iterations="
            f"{iterations}, dt={dt}, gamma={gamma} for a population of {max(shape)})",
            "use the defaults (100000 iterations, dt 1e-3, gamma 1e-6) or values in range",
        )
    strategies = (
        [np.full(n, 1.0 / n) for n in shape] if initial is None else _initial(initial, shape)
    )
    window = iterations if average_last is None else min(max(average_last, 1), iterations)
    totals = [np.zeros(n) for n in shape]
    for step in range(iterations):
        strategies = _replicator_step(tensors, strategies, dt, gamma)
        if step >= iterations - window:
            for total, strategy in zip(totals, strategies, strict=True):
                total += strategy
    return [_normalised(total) for total in totals]


META_SOLVERS: dict[str, MetaSolver] = {
    "nash": nash,
    "uniform": uniform,
    "prd": projected_replicator_dynamics,
}
"""`psro.meta_solver` value -> solver."""


def meta_solver(name: str) -> MetaSolver:
    """The solver a job names, or one message listing the names there are."""
    if name not in META_SOLVERS:
        raise MetaSolverError(
            f"unknown meta-solver {name!r}",
            f"set psro.meta_solver to one of {sorted(META_SOLVERS)}",
        )
    return META_SOLVERS[name]


def _checked(payoffs: Sequence[np.ndarray]) -> list[np.ndarray]:
    tensors = [np.asarray(tensor, dtype=np.float64) for tensor in payoffs]
    if not tensors:
        raise MetaSolverError("no payoff tensors were given", "pass one tensor per player")
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors) or len(shape) != len(tensors) or 0 in shape:
        raise MetaSolverError(
            f"payoff tensors of shapes {[t.shape for t in tensors]} do not describe a game of "
            f"{len(tensors)} players with at least one policy each",
            "pass one tensor per player, each with one non-empty axis per player",
        )
    if not all(np.isfinite(t).all() for t in tensors):
        raise MetaSolverError(
            "the payoff tensors hold NaN or infinite entries (matchups not yet evaluated?)",
            "fill every entry of the payoff table (PayoffTable.missing) before solving",
        )
    return tensors


def _initial(initial: Sequence[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    strategies = [_normalised(strategy) for strategy in initial]
    if [len(strategy) for strategy in strategies] != list(shape):
        raise MetaSolverError(
            f"prd initial strategies of lengths {[len(s) for s in strategies]} do not fit a "
            f"population of sizes {list(shape)}",
            "pass one weight vector per player, one weight per policy, or none",
        )
    return strategies


def _require_constant_sum(first: np.ndarray, second: np.ndarray) -> None:
    total = first + second
    scale = max(1.0, float(np.abs(first).max()), float(np.abs(second).max()))
    spread = float(total.max() - total.min())
    if spread > ZERO_SUM_TOLERANCE * scale:
        raise MetaSolverError(
            f"the nash meta-solver needs a zero-sum game, but payoffs[0] + payoffs[1] varies by "
            f"{spread:.3g} across entries",
            "set psro.meta_solver to uniform or prd, which solve general-sum games",
        )


def _maximin(matrix: np.ndarray) -> np.ndarray:
    """The row strategy x maximising min_j (x @ matrix)[j]: variables (x, v), minimise -v."""
    # here: scipy.optimize costs every rank 0.3 s to import
    linprog = require("scipy.optimize", "psro.meta_solver=nash").linprog

    n_rows, n_columns = matrix.shape
    objective = np.zeros(n_rows + 1)
    objective[-1] = -1.0
    # v - x @ matrix[:, j] <= 0 for every column j
    upper = np.hstack([-matrix.T, np.ones((n_columns, 1))])
    equal = np.hstack([np.ones((1, n_rows)), np.zeros((1, 1))])
    bounds = [(0.0, None)] * n_rows + [(None, None)]
    result = linprog(
        objective,
        A_ub=upper,
        b_ub=np.zeros(n_columns),
        A_eq=equal,
        b_eq=[1.0],
        bounds=bounds,
        method="highs",
    )
    if not result.success:  # a bounded, feasible LP: only a solver fault lands here
        raise RuntimeError(f"HiGHS failed on a matrix game: {result.message}")
    return _normalised(result.x[:n_rows])


def _replicator_step(
    tensors: list[np.ndarray], strategies: list[np.ndarray], dt: float, gamma: float
) -> list[np.ndarray]:
    updated = []
    for player, (tensor, strategy) in enumerate(zip(tensors, strategies, strict=True)):
        values = _values_per_policy(tensor, strategies, player)
        # The growth sums to zero only on the simplex: off it by a rounding error e, the step
        # scales e by (1 - dt * value), which a negative value (a losing player) compounds
        # (seen: a sum of 1.5 after 58,668 steps). So each step goes back onto it.
        stepped = strategy + dt * strategy * (values - values @ strategy)
        stepped /= stepped.sum()
        if stepped.min() < gamma:
            stepped = _project_onto_floored_simplex(stepped, gamma)
        updated.append(stepped)
    return updated


def _values_per_policy(tensor: np.ndarray, strategies: list[np.ndarray], player: int) -> np.ndarray:
    """Expected payoff of each of `player`'s policies against the others' strategies."""
    if tensor.ndim == 2:  # the common case, without tensordot's overhead
        return tensor @ strategies[1] if player == 0 else strategies[0] @ tensor
    for other in reversed(range(len(strategies))):
        if other != player:
            tensor = np.tensordot(tensor, strategies[other], axes=([other], [0]))
    return tensor


def _project_onto_floored_simplex(point: np.ndarray, gamma: float) -> np.ndarray:
    """Euclidean projection onto {x : x >= gamma, sum(x) = 1} (sort-based, Duchi et al. 2008)."""
    mass = 1.0 - gamma * len(point)
    shifted = point - gamma
    ordered = np.sort(shifted)[::-1]
    thresholds = (np.cumsum(ordered) - mass) / np.arange(1, len(point) + 1)
    last = np.nonzero(ordered > thresholds)[0][-1]
    return np.maximum(shifted - thresholds[last], 0.0) + gamma


def _normalised(weights: np.ndarray) -> np.ndarray:
    clipped = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    return clipped / clipped.sum()
