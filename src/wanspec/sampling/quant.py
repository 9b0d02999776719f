"""Quantised distributions: the one representation that travels and that both sides decide on.

A distribution is an int64 numpy array of counts summing to exactly PROB_SCALE (65535), so each
count fits in 16 bits on the wire. Both sides use the very same counts, and every acceptance test
and sample below is integer arithmetic, so lossless methods are exact with respect to
q̃ = counts / PROB_SCALE. Largest-remainder rounding bounds the error per token:
|q̃(x) − q(x)| < 1/PROB_SCALE (≈1.5e-5); tokens with q(x) < 1/PROB_SCALE may round to 0.
"""

from __future__ import annotations

import numpy as np
import torch

PROB_SCALE = 65535
Counts = np.ndarray  # int64, non-negative, sums to PROB_SCALE (or a sub-distribution of it)


def quantize(probs: np.ndarray | torch.Tensor) -> Counts:
    """Largest-remainder rounding of a probability vector to counts summing to PROB_SCALE."""
    if isinstance(probs, torch.Tensor):
        probs = probs.detach().to(torch.float64).cpu().numpy()
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 1 or probs.size == 0:
        raise ValueError("quantize expects a non-empty 1-D probability vector")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError("probabilities must be finite and non-negative")
    total = probs.sum()
    if total <= 0:
        raise ValueError("probabilities sum to zero")
    scaled = (probs / total) * PROB_SCALE
    counts = np.floor(scaled).astype(np.int64)
    deficit = PROB_SCALE - int(counts.sum())
    if deficit > 0:
        fractions = scaled - counts
        top = np.argpartition(-fractions, deficit - 1)[:deficit]
        counts[top] += 1
    return counts


def sample(counts: Counts, rng: np.random.Generator) -> int:
    """Draw an index with probability counts[i] / counts.sum(), exactly (integer arithmetic)."""
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    if total <= 0:
        raise ValueError("cannot sample from an all-zero distribution")
    return int(np.searchsorted(cumulative, rng.integers(total), side="right"))


def bernoulli(numerator: int, denominator: int, rng: np.random.Generator) -> bool:
    """True with probability numerator/denominator exactly (clipped to [0, 1])."""
    if numerator <= 0:
        return False
    if numerator >= denominator:
        return True
    return int(rng.integers(denominator)) < numerator
