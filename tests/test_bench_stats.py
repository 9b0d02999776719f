"""The tables' 95 % intervals (wanspec.bench.stats): they cover a known truth about as often as
they claim, the paired version pairs prompts, degenerate inputs give no interval, the same data
always give the same interval, and the table text reads unambiguously."""

from __future__ import annotations

import numpy as np
import pytest

from wanspec.bench.stats import (
    Interval,
    ci_column,
    interval_text,
    paired_ratio_interval,
    paired_ratio_text,
    ratio_interval,
)

DATASETS = 400
MEAN_TOKENS, MEAN_SECONDS = 48.0, 2.75  # per prompt: Poisson(48) tokens in U(0.5, 5) seconds
TRUE_RATE = MEAN_TOKENS / MEAN_SECONDS  # the population's Σtokens / Σseconds
SPEEDUP_FACTOR = (0.4, 0.8)  # a method's seconds per prompt: ar's times U(0.4, 0.8)
TRUE_SPEEDUP = 1 / 0.6


def _prompts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n prompts' (tokens, seconds). Long prompts are slow ones, so the mean of per-prompt
    rates (≈ 48 · E[1/t] = 24.6) is far from the ratio of sums (17.5): an interval around the
    wrong statistic misses."""
    return rng.poisson(MEAN_TOKENS, n).astype(float), rng.uniform(0.5, 5.0, n)


def _coverage(n: int) -> float:
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(DATASETS):
        tokens, seconds = _prompts(rng, n)
        ci = ratio_interval(tokens, seconds)
        assert ci is not None and ci.lo <= tokens.sum() / seconds.sum() <= ci.hi
        covered += ci.lo <= TRUE_RATE <= ci.hi
    return covered / DATASETS


@pytest.mark.statistical
def test_the_interval_covers_the_true_rate_about_95_percent_of_the_time() -> None:
    assert 0.88 <= _coverage(30) <= 0.99


@pytest.mark.statistical
def test_at_8_prompts_the_percentile_interval_is_narrow_but_not_useless() -> None:
    """What the committed 8-prompt results can expect (the module docstring's "about 90 %")."""
    assert 0.80 <= _coverage(8) <= 0.95


@pytest.mark.statistical
def test_the_paired_speedup_interval_covers_the_true_speedup() -> None:
    """A method faster than ar by a per-prompt factor: the paired interval of (its tokens/s) /
    (ar's tokens/s) covers 1/E[factor] at the nominal rate, and is narrower than the spread of
    either rate alone (hard prompts slow both)."""
    rng = np.random.default_rng(11)
    covered, narrower = 0, 0
    for _ in range(DATASETS):
        tokens, seconds = _prompts(rng, 30)
        method_seconds = seconds * rng.uniform(*SPEEDUP_FACTOR, seconds.size)
        ci = paired_ratio_interval(tokens, method_seconds, tokens, seconds)
        assert ci is not None
        covered += ci.lo <= TRUE_SPEEDUP <= ci.hi
        alone = ratio_interval(tokens, method_seconds)
        assert alone is not None
        point = tokens.sum() / seconds.sum()
        narrower += (ci.hi - ci.lo) < (alone.hi - alone.lo) / point
    assert 0.88 <= covered / DATASETS <= 0.99
    assert narrower == DATASETS


def test_two_prompts_give_the_range_of_their_rates() -> None:
    """Two prompts at rates 1 and 3 (pooled 2.5): a quarter of the resamples draw prompt 1 twice
    and a quarter prompt 2 twice, so the 2.5 % and 97.5 % points are exactly 1 and 3."""
    assert ratio_interval([1, 9], [1, 3]) == (1.0, 3.0)
    assert paired_ratio_interval([1, 9], [1, 3], [1, 1], [1, 1]) == (1.0, 3.0)


def test_paired_ratio_text_is_the_pooled_ratio_with_its_paired_interval() -> None:
    """Pooled, not a mean of per-prompt ratios: prompts at rates 1 and 3 over rate-1 prompts
    pool to 10 / 4 = 2.5 (the mean of the ratios would be 2); one prompt has no interval."""
    assert paired_ratio_text([1, 9], [1, 3], [1, 1], [1, 1]) == "2.500× [1, 3]"
    assert paired_ratio_text([3], [1], [2], [1]) == "1.500×"


def test_equal_rates_and_identical_cells_give_the_point() -> None:
    tokens, seconds = np.array([10.0, 20, 40, 5]), np.array([1.0, 2, 4, 0.5])
    assert ratio_interval(tokens, seconds) == (10.0, 10.0)
    rng = np.random.default_rng(3)
    tokens, seconds = _prompts(rng, 8)
    # the same prompts drawn for both sides: every resample's ratio is exactly 1
    assert paired_ratio_interval(tokens, seconds, tokens, seconds) == (1.0, 1.0)


def test_degenerate_inputs_give_no_interval_or_an_error() -> None:
    assert ratio_interval([], []) is None
    assert ratio_interval([5], [2]) is None  # one prompt: nothing to resample
    assert ratio_interval([0, 0], [0, 0]) is None  # no lookups at all: no hit rate
    assert paired_ratio_interval([3], [1], [3], [1]) is None
    assert paired_ratio_interval([1, 2], [1, 1], [0, 0], [1, 1]) is None  # reference rate 0
    assert paired_ratio_interval([1, 2], [1, 1], [1, 2], [0, 0]) is None
    # a prompt without lookups: resamples of only that prompt have no rate and are left out
    assert ratio_interval([1, 0], [2, 0]) == (0.5, 0.5)
    with pytest.raises(ValueError, match="numerators"):
        ratio_interval([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="finite"):
        ratio_interval([1, float("nan")], [1, 2])
    with pytest.raises(ValueError, match="same prompts"):
        paired_ratio_interval([1, 2], [1, 2], [1, 2, 3], [1, 2, 3])


def test_the_interval_is_deterministic_and_the_seed_matters() -> None:
    tokens, seconds = _prompts(np.random.default_rng(5), 8)
    first = ratio_interval(tokens, seconds)
    assert ratio_interval(tokens, seconds) == first
    assert paired_ratio_interval(tokens, seconds, tokens, seconds * 2) == paired_ratio_interval(
        tokens, seconds, tokens, seconds * 2
    )
    assert ratio_interval(tokens, seconds, seed=1) != first
    narrow = ratio_interval(tokens, seconds, level=0.5)
    assert first is not None and narrow is not None
    assert first.lo < narrow.lo < narrow.hi < first.hi


def test_interval_text_and_overlap() -> None:
    assert interval_text(Interval(0.123456, 12345.6)) == "[0.1235, 12346]"  # no 12,346
    assert interval_text((1.0, 1.36e6)) == "[1, 1.36e+06]"
    assert interval_text(None) == ""
    assert str(Interval(6.065, 6.274)) == "[6.065, 6.274]"
    assert ci_column("tokens/s") == "tokens/s 95% CI"
    a, b, c = Interval(0.1, 0.3), Interval(0.3, 0.5), Interval(0.31, 0.4)
    assert a.overlaps(b) and b.overlaps(a) and b.overlaps(c)
    assert not a.overlaps(c) and not c.overlaps(a)
