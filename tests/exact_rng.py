"""Exact laws of rng-driven code: run it once for every outcome of every draw it makes.

wanspec's sampling primitives draw only through `rng.integers(n)` (uniform on 0..n-1, counts)
and the float draws `bernoulli(num, den)` and `pick(weights)` of wanspec.sampling.draws, which
hand a non-numpy rng the question itself (`rng.coin`, `rng.pick`). So the law of any function of
them is a finite sum over the outcomes of its draws, each outcome with an exact probability: 1/n,
num/den, or w_i/Σw as fractions of the very floats given. `exact_law` walks that tree depth
first: each run follows a script of outcome indices, the run's probability is the product of its
outcomes' probabilities, and the script then steps like an odometer to the next unexplored one.
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
    """Stands in for `np.random.Generator`: each draw returns the scripted outcome in turn.

    `integers(n)` returns the scripted value; `coin(num, den)` (a float Bernoulli) is True for
    outcome 0; `pick(weights)` returns the scripted one of the positive-weight indices. Past the
    end of the script the outcome is 0 (and the script grows). `draws` records each draw's
    number of outcomes, `branches` their probabilities. Any other use of the generator raises,
    so code that draws in another way cannot pass unnoticed.
    """

    def __init__(self, script: list[int] | None = None) -> None:
        self.script = [] if script is None else script
        self.draws: list[int] = []
        self.branches: list[list[Fraction]] = []

    def _next(self, probs: list[Fraction]) -> int:
        i = len(self.draws)
        self.draws.append(len(probs))
        self.branches.append(probs)
        if i == len(self.script):
            self.script.append(0)
        return self.script[i]

    def integers(self, n: int, *args: object, **kwargs: object) -> np.int64:
        if args or kwargs:
            raise TypeError("the scripted rng supports integers(n) only")
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"integers({n}): empty range")
        return np.int64(self._next([Fraction(1, n)] * n))

    def coin(self, numerator: float, denominator: float) -> bool:
        p = Fraction(float(numerator)) / Fraction(float(denominator))
        if not 0 < p < 1:
            raise AssertionError(f"coin({numerator}, {denominator}) is certain: draw nothing")
        return self._next([p, 1 - p]) == 0

    def pick(self, weights: np.ndarray) -> int:
        positive = np.flatnonzero(weights)
        exact = [Fraction(float(weights[i])) for i in positive]
        total = sum(exact, Fraction(0))
        return int(positive[self._next([w / total for w in exact])])


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
        law[outcome] += math.prod(
            (probs[k] for probs, k in zip(rng.branches, script, strict=True)), start=Fraction(1)
        )
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
