"""The kinds of allowed-value check a job key can have, in words a user reads: a `Rule` and its
common forms (`above`, `at_least`, `within`, `one_of`).

They import nothing of hpcmarl, so that an algorithm's configuration (built in, beside its code,
or a user's) can name its checks without importing the schema that lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """An allowed-value check on one key, with the words that explain it to the user.

    `advice` completes "set KEY to ..."; `{noun}` / `{a_noun}` become "integer" / "an integer"
    or "number" / "a number" after the key's type. `bounds` are the numbers the text names, so
    that a test can try every key at its limits (`tests/unit/test_bounds.py`).
    """

    ok: Callable[[Any], bool]
    text: str
    advice: str
    problem: str = "is out of range"
    example: bool = True
    bounds: tuple[float, ...] = ()

    def fix(self, path: str, noun: str, example: Any) -> str:
        article = "an" if noun[0] in "aeiou" else "a"
        advice = self.advice.format(noun=noun, a_noun=f"{article} {noun}")
        from hpcmarl.config.docs import show  # docs reads the schema, which reads these checks

        return f"set {path} to {advice}" + (f" such as {show(example)}" if self.example else "")


def above(lo: float) -> Rule:
    advice = "a positive {noun}" if lo == 0 else "{a_noun} above " + str(lo)
    return Rule(lambda v: v > lo, f"must be > {lo}", advice, bounds=(lo,))


def at_least(lo: float) -> Rule:
    advice = "a non-negative {noun}" if lo == 0 else "{a_noun} of at least " + str(lo)
    return Rule(lambda v: v >= lo, f"must be >= {lo}", advice, bounds=(lo,))


def within(lo: float, hi: float, open_low: bool = False) -> Rule:
    low, left = (above(lo), "(") if open_low else (at_least(lo), "[")
    return Rule(
        lambda v: low.ok(v) and v <= hi,
        f"{low.text} and <= {hi}",
        f"{{a_noun}} in {left}{lo}, {hi}]",
        bounds=(lo, hi),
    )


def one_of(*choices: str) -> Rule:
    listed = ", ".join(choices)
    return Rule(
        lambda v: v in choices,
        f"must be one of {listed}",
        f"one of {listed}",
        problem="is not a valid choice",
        example=False,
    )
