"""PSRO meta-solvers on matrix games whose equilibria are known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmarl.errors import UserError
from hpcmarl.psro.meta_solvers import (
    META_SOLVERS,
    MetaSolverError,
    meta_solver,
    nash,
    projected_replicator_dynamics,
    uniform,
)

ROCK_PAPER_SCISSORS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])
# rock-paper-scissors plus a fourth row that loses 2 to everything: strictly dominated
WITH_DOMINATED_ROW = np.vstack([ROCK_PAPER_SCISSORS, [-2.0, -2.0, -2.0]])
FAST_PRD = {"iterations": 10_000, "dt": 2e-2}


def zero_sum(matrix: np.ndarray) -> list[np.ndarray]:
    return [matrix, -matrix]


def assert_distributions(strategies: list[np.ndarray], sizes: tuple[int, ...]) -> None:
    assert [s.shape for s in strategies] == [(n,) for n in sizes]
    for strategy in strategies:
        assert strategy.dtype == np.float64
        assert (strategy >= 0).all()
        assert strategy.sum() == pytest.approx(1.0, abs=1e-12)


def test_nash_of_rock_paper_scissors_is_uniform() -> None:
    for strategy in nash(zero_sum(ROCK_PAPER_SCISSORS)):
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=1e-9)


def test_nash_of_a_game_with_an_interior_mixed_equilibrium() -> None:
    # row: 2p - (1 - p) = -p + (1 - p) gives p = 2/5; the column's indifference gives 2/5 too
    rows, columns = nash(zero_sum(np.array([[2.0, -1.0], [-1.0, 1.0]])))
    np.testing.assert_allclose(rows, [0.4, 0.6], atol=1e-9)
    np.testing.assert_allclose(columns, [0.4, 0.6], atol=1e-9)


def test_nash_puts_no_weight_on_a_dominated_strategy() -> None:
    rows, columns = nash(zero_sum(WITH_DOMINATED_ROW))
    assert rows[3] == 0.0
    np.testing.assert_allclose(rows[:3], np.full(3, 1 / 3), atol=1e-9)
    np.testing.assert_allclose(columns, np.full(3, 1 / 3), atol=1e-9)


def test_nash_accepts_a_constant_sum_game() -> None:
    matrix = np.array([[2.0, -1.0], [-1.0, 1.0]])
    for strategy, expected in zip(
        nash([matrix, 3.0 - matrix]), nash(zero_sum(matrix)), strict=True
    ):
        np.testing.assert_allclose(strategy, expected, atol=1e-9)


def test_nash_refuses_general_sum_and_more_than_two_players() -> None:
    prisoners_dilemma = np.array([[3.0, 0.0], [5.0, 1.0]])
    with pytest.raises(MetaSolverError) as info:
        nash([prisoners_dilemma, prisoners_dilemma.T])
    assert "zero-sum" in str(info.value) and "uniform or prd" in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, UserError)
    three = np.zeros((2, 2, 2))
    with pytest.raises(MetaSolverError, match="two-player games; this one has 3 players"):
        nash([three, three, three])


def test_prd_on_rock_paper_scissors_approaches_uniform_from_anywhere() -> None:
    start = [np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.2, 0.6])]
    strategies = projected_replicator_dynamics(
        zero_sum(ROCK_PAPER_SCISSORS), initial=start, **FAST_PRD
    )
    for strategy in strategies:
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=0.03)


def test_prd_starves_a_dominated_strategy_down_to_its_floor() -> None:
    rows, columns = projected_replicator_dynamics(zero_sum(WITH_DOMINATED_ROW), **FAST_PRD)
    assert rows[3] < 0.01
    np.testing.assert_allclose(columns, np.full(3, 1 / 3), atol=0.03)
    # the average of the last iterate alone sits on the gamma floor
    last, _ = projected_replicator_dynamics(
        zero_sum(WITH_DOMINATED_ROW), gamma=1e-3, average_last=1, **FAST_PRD
    )
    assert last[3] == pytest.approx(1e-3, rel=1e-6)


def test_prd_solves_general_sum_and_three_player_games() -> None:
    prisoners_dilemma = np.array([[3.0, 0.0], [5.0, 1.0]])
    rows, columns = projected_replicator_dynamics(
        [prisoners_dilemma, prisoners_dilemma.T], **FAST_PRD
    )
    assert rows[1] > 0.99 and columns[1] > 0.99  # defection dominates
    payoffs = np.random.default_rng(0).normal(size=(3, 2, 3, 4))
    assert_distributions(projected_replicator_dynamics(list(payoffs), iterations=500), (2, 3, 4))


def test_prd_stays_on_the_simplex_for_a_losing_player() -> None:
    """A player whose every payoff is negative (Kuhn poker's second player, measured in a
    PSRO run) compounded rounding off the simplex into an overflow and NaN meta-strategies."""
    first = np.array([[0.65, 0.55], [0.65, 0.55]])
    rows, columns = projected_replicator_dynamics([first, -first])
    assert_distributions([rows, columns], (2, 2))
    assert columns[1] > 0.9  # the column that loses less


def test_uniform_is_fictitious_play_over_each_population() -> None:
    strategies = uniform(zero_sum(np.zeros((3, 2))))
    np.testing.assert_array_equal(strategies[0], np.full(3, 1 / 3))
    np.testing.assert_array_equal(strategies[1], np.full(2, 1 / 2))


def test_the_registry_holds_one_solver_per_meta_solver_value() -> None:
    assert META_SOLVERS == {
        "nash": nash,
        "uniform": uniform,
        "prd": projected_replicator_dynamics,
    }
    assert meta_solver("prd") is projected_replicator_dynamics


@pytest.mark.parametrize("name", sorted(META_SOLVERS))
def test_every_registered_solver_returns_distributions(name: str) -> None:
    solve = meta_solver(name)
    options = FAST_PRD if name == "prd" else {}
    matrix = np.random.default_rng(1).normal(size=(4, 5))
    assert_distributions(solve(zero_sum(matrix), **options), (4, 5))
    assert_distributions(solve(zero_sum(np.ones((1, 1))), **options), (1, 1))


def test_refusals_name_the_cause_and_the_fix() -> None:
    with pytest.raises(MetaSolverError, match=r"unknown meta-solver 'nsh'.*\['nash', 'prd'"):
        meta_solver("nsh")
    holes = np.array([[0.0, np.nan], [1.0, 0.0]])
    with pytest.raises(MetaSolverError, match="PayoffTable.missing"):
        uniform(zero_sum(holes))
    with pytest.raises(MetaSolverError, match="one non-empty axis per player"):
        nash([np.zeros((2, 2)), np.zeros((2, 3))])
    with pytest.raises(MetaSolverError, match="gamma"):
        projected_replicator_dynamics(zero_sum(ROCK_PAPER_SCISSORS), gamma=0.5)
