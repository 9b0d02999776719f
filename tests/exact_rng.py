"""Exact laws of rng-driven code: run it once for every outcome of every draw it makes.

wanspec's sampling primitives draw only through `rng.integers(n)` (uniform on 0..n-1), so the
law of any function of them is a finite sum over the outcomes of its draws. `exact_law` walks that
tree depth first: each run follows a script of draw values, the run's probability is the product
of 1/n over its draws, and the script then steps like an odometer to the next unexplored outcome.
The result is the law as exact fractions, so an off-by-one, a `<=` for a `<`, a wrong normaliser
or a wrong acceptance probability shows as an exact difference, not as a statistical hint.
Counts with small totals (a stand-in for PROB_SCALE) keep the tree small.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Callable, Hashable
from fractions import Fraction

import numpy as np


class ScriptedRng:
    """Stands in for `np.random.Generator`: `integers(n)` returns the scripted values in turn.

    Past the end of the script it returns 0 (and extends the script). Every denominator is
    recorded in `draws`. Any other use of the generator raises, so code that draws in another
    way cannot pass unnoticed.
    """

    def __init__(self, script: list[int] | None = None) -> None:
        self.script = [] if script is None else script
        self.draws: list[int] = []

    def integers(self, n: int, *args: object, **kwargs: object) -> np.int64:
        if args or kwargs:
            raise TypeError("the scripted rng supports integers(n) only")
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"integers({n}): empty range")
        i = len(self.draws)
        self.draws.append(n)
        if i == len(self.script):
            self.script.append(0)
        return np.int64(self.script[i])


def exact_law(
    draw: Callable[[ScriptedRng], Hashable], max_runs: int = 200_000
) -> dict[Hashable, Fraction]:
    """{outcome: exact probability} of `draw(rng)` over every outcome of its integer draws."""
    law: dict[Hashable, Fraction] = defaultdict(Fraction)
    script: list[int] = []
    for _ in range(max_runs):
        rng = ScriptedRng(script)
        outcome = draw(rng)
        sizes = rng.draws
        del script[len(sizes) :]
        law[outcome] += Fraction(1, math.prod(sizes))
        while script and script[-1] == sizes[len(script) - 1] - 1:
            script.pop()
        if not script:
            return dict(law)
        script[-1] += 1
    raise AssertionError(f"more than {max_runs} rng paths: use smaller totals")


def normalised(weights: np.ndarray | list[int]) -> dict[int, Fraction]:
    """{index: weight / total} over the non-zero weights (the law a count vector means)."""
    total = int(np.sum(weights))
    return {i: Fraction(int(w), total) for i, w in enumerate(weights) if w}


def total_variation(a: dict[Hashable, Fraction], b: dict[Hashable, Fraction]) -> Fraction:
    """Exact TV distance between two laws."""
    return sum((abs(a.get(k, 0) - b.get(k, 0)) for k in a.keys() | b.keys()), Fraction(0)) / 2
