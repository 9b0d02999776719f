"""Sampling-floor checks the mutation re-measure (docs/MUTATION.md) showed missing.

Two error messages the callers show (a float coin with no denominator, a negative temperature),
the open bracket of a range that excludes its low end, and `pick`'s guard for the one uniform
whose product with the total rounds up to the total, which a real generator almost never draws.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from wanspec.sampling import SamplingParams
from wanspec.sampling.draws import bernoulli, pick


class _TopUniform(np.random.Generator):
    """A numpy generator whose uniform lands on the top of [0, 1): u·total == total."""

    def random(self, *args: object, **kwargs: object) -> float:
        return 1.0


def test_pick_maps_a_uniform_that_rounds_up_to_the_total_to_the_last_positive_weight() -> None:
    rng = _TopUniform(np.random.PCG64(0))
    assert pick(np.array([1.0, 2.0, 0.0, 0.0]), rng) == 1
    assert pick(np.array([0.0, 3.0]), rng) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: bernoulli(1.0, 0.0, np.random.default_rng(0)),
         "bernoulli needs a positive denominator, got 1.0/0.0"),
        (lambda: SamplingParams(temperature=-0.5), "temperature must be >= 0, got -0.5"),
        (lambda: SamplingParams(repetition_penalty=0.0),
         "repetition_penalty (1.0 = off) must be a number in (0.0, inf], got 0.0"),
        (lambda: SamplingParams(min_p=1.5),
         "min_p (0 = off) must be a number in [0.0, 1.0], got 1.5"),
    ],
)  # fmt: skip
def test_bad_sampling_input_is_refused_with_its_message(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        call()
