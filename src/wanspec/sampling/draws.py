"""Draws on float probabilities: a biased coin and an inverse-CDF pick.

The cloud decides with the target's float q (float64 probabilities of the warped logits) and the
draft's exactly reported p̃, so these draws take float weights. Each uses one uniform
u = `rng.random()` (53 random bits): `bernoulli` is True iff u·denominator < numerator, `pick`
returns the first index whose running sum exceeds u·total. Their laws are the ratios of the
float64 numbers they are given, up to the 2⁻⁵³ grid of u; nothing is rounded to counts.

Anything that is not a numpy Generator stands in for one by answering `coin(numerator,
denominator)` and `pick(weights)` itself: that is how tests/exact_rng.py enumerates every
branch and gets a scheme's law exactly, as fractions of the floats it was given.
"""

from __future__ import annotations

import math

import numpy as np

Rng = np.random.Generator  # or a law enumerator with coin() and pick() (see the docstring)


def bernoulli(numerator: float, denominator: float, rng: Rng) -> bool:
    """True with probability numerator/denominator (clipped to [0, 1]); draws nothing when the
    outcome is certain, so greedy decoding consumes no randomness."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        raise ValueError(f"bernoulli needs a positive denominator, got {numerator}/{denominator}")
    if numerator <= 0:
        return False
    if numerator >= denominator:
        return True
    if not isinstance(rng, np.random.Generator):
        return bool(rng.coin(numerator, denominator))
    return bool(rng.random() * denominator < numerator)


def pick(weights: np.ndarray, rng: Rng) -> int:
    """An index drawn with probability weights[i] / weights.sum() (inverse CDF, float uniform)."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1 or weights.size == 0:
        raise ValueError("pick expects a non-empty 1-D weight vector")
    cumulative = np.cumsum(weights)
    total = float(cumulative[-1])
    if not (math.isfinite(total) and total > 0) or weights.min() < 0:
        raise ValueError("cannot sample: weights must be finite, non-negative, not all zero")
    if not isinstance(rng, np.random.Generator):
        return int(rng.pick(weights))
    index = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
    if index == weights.size:  # u·total rounded up to the total: the last positive weight
        index = int(np.flatnonzero(weights)[-1])
    return index
