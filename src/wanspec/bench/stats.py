"""95 % intervals for the benchmark tables' rates, from the per-prompt data of a cell.

Every rate in the tables is a ratio of sums over a cell's prompts (tokens/s = Σtokens / Σseconds,
hit rate = Σhits / Σlookups, ...). The intervals come from a percentile bootstrap that resamples
whole prompts: the tokens and rounds of one prompt are correlated (same text, same draft
quality), so resampling them one by one would pretend there are far more independent
observations than prompts and give intervals that are much too narrow.

The percentile bootstrap is itself narrow-biased when there are few clusters: with 8 prompts a
nominal 95 % interval covers the truth about 90 % of the time (tests/test_bench_stats.py
measures it). Read the intervals of an 8-prompt run as a lower bound on the uncertainty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0  # fixed: the same results give the same intervals, so reports are reproducible
CI_SUFFIX = " 95% CI"


class Interval(NamedTuple):
    """A (lo, hi) interval; printed as the tables show it (`interval_text`)."""

    lo: float
    hi: float

    def __str__(self) -> str:
        return interval_text(self)

    def overlaps(self, other: Interval) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi


def ci_column(column: str) -> str:
    """The name of the column holding `column`'s interval: "tokens/s" → "tokens/s 95% CI"."""
    return column + CI_SUFFIX


def _sums(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: one value per prompt, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: every per-prompt value must be finite")
    return array


def _resamples(n: int, resamples: int, seed: int) -> np.ndarray:
    """Prompt indices drawn with replacement, one row per bootstrap resample."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentiles(values: np.ndarray, level: float) -> Interval | None:
    """The central `level` percentile interval of the finite values; resamples whose ratio is
    undefined (every drawn prompt has a zero denominator) are left out."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return Interval(float(lo), float(hi))


def _divide(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """top / bottom elementwise, NaN (an undefined resample) where bottom is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(bottom != 0, top / np.where(bottom != 0, bottom, 1), np.nan)


def _ratios(num: np.ndarray, den: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return _divide(num[idx].sum(axis=1), den[idx].sum(axis=1))


def ratio_interval(
    num: Sequence[float],
    den: Sequence[float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """Percentile-bootstrap interval of Σnum / Σden, resampling prompts (index i of both).

    None with fewer than 2 prompts (no spread to resample) or when Σden is 0 (no estimate).
    """
    num, den = _sums(num, "numerators"), _sums(den, "denominators")
    if num.shape != den.shape:
        raise ValueError(f"{num.size} numerators but {den.size} denominators")
    if num.size < 2 or den.sum() == 0:
        return None
    return _percentiles(_ratios(num, den, _resamples(num.size, resamples, seed)), level)


def paired_ratio_interval(
    num: Sequence[float],
    den: Sequence[float],
    ref_num: Sequence[float],
    ref_den: Sequence[float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """Interval of (Σnum / Σden) / (Σref_num / Σref_den), e.g. a method's speedup over `ar`.

    Both cells ran the same prompts, so each resample draws the same prompt indices for both:
    a hard prompt slows both, and the ratio keeps only the difference between the methods.
    None with fewer than 2 prompts or when either rate or the reference rate is undefined or 0.
    """
    arrays = [
        _sums(v, name)
        for v, name in (
            (num, "numerators"),
            (den, "denominators"),
            (ref_num, "reference numerators"),
            (ref_den, "reference denominators"),
        )
    ]
    if len({a.size for a in arrays}) != 1:
        raise ValueError("a paired interval needs the same prompts on both sides")
    num_a, den_a, ref_num_a, ref_den_a = arrays
    if num_a.size < 2 or den_a.sum() == 0 or ref_den_a.sum() == 0 or ref_num_a.sum() == 0:
        return None
    idx = _resamples(num_a.size, resamples, seed)
    rate, reference = _ratios(num_a, den_a, idx), _ratios(ref_num_a, ref_den_a, idx)
    return _percentiles(_divide(rate, reference), level)


def paired_ratio_text(
    num: Sequence[float],
    den: Sequence[float],
    ref_num: Sequence[float],
    ref_den: Sequence[float],
) -> str:
    """ "1.234× [lo, hi]": the pooled ratio (Σnum / Σden) / (Σref_num / Σref_den) and its
    paired interval (`paired_ratio_interval`), as the goal scripts print a speedup."""
    point = (sum(num) / sum(den)) / (sum(ref_num) / sum(ref_den))
    return (
        f"{point:.3f}× {interval_text(paired_ratio_interval(num, den, ref_num, ref_den))}".strip()
    )


def number_text(value: float) -> str:
    """A number as the tables print one (4 significant digits, 3 outside 1e-3 … 1e6), without
    thousands separators, which inside an interval would read as its comma."""
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return f"{value:.3g}"


def interval_text(interval: tuple[float, float] | None) -> str:
    """The table text of an interval, "[lo, hi]"; empty when there is none."""
    if interval is None:
        return ""
    lo, hi = interval
    return f"[{number_text(lo)}, {number_text(hi)}]"
