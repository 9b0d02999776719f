"""Quantised distributions: the form a distribution takes on the wire.

A distribution that travels is an int64 array of counts summing to exactly 2^bits − 1
(largest-remainder rounding), `bits` ∈ Q_BITS. The draft's p̃ is always 16-bit (PROB_SCALE =
65535): the draft may propose from any law it reports exactly, and it reports these counts.
The target's q travels only where a method must ship it (Naive, CoSD, HR, TR, AceSpec's
downlink), at the request's `q_bits`; both sides then decide with the same rounded q̂ =
counts / (2^bits − 1) (`dequantize`, one float division both sides compute bit for bit), so the
method is exact with respect to q̂, and `Rounded.tv` = TV(q, q̂) says how far that is from q.
Largest-remainder rounding bounds the error per token by 1/(2^bits − 1); tokens below that may
round to 0, which is why 16 bits is a poor default for a 151,665-token vocabulary at T = 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PROB_SCALE = 65535  # the draft's p̃ and the 16-bit q of the papers
Q_BITS = (16, 24, 32)  # precisions a shipped target distribution may use
ArrayLike = Any  # an array, or a tensor (converted through its own methods, so no import)
Counts = np.ndarray  # int64, non-negative, sums to the scale (or a sub-distribution of it)


def scale_of(bits: int) -> int:
    """The total of a complete `bits`-bit distribution: 2^bits − 1 (each count fits the bits)."""
    if bits not in Q_BITS:
        raise ValueError(f"precision must be one of {Q_BITS} bits, got {bits!r}")
    return (1 << bits) - 1


def quantize(probs: ArrayLike, scale: int = PROB_SCALE) -> Counts:
    """Largest-remainder rounding of a probability vector (an array, or a tensor on any device)
    to counts summing to `scale`."""
    if hasattr(probs, "detach"):  # a tensor: float64 on the host, converted there
        probs = probs.detach().double().cpu().numpy()
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 1 or probs.size == 0:
        raise ValueError("quantize expects a non-empty 1-D probability vector")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError("probabilities must be finite and non-negative")
    total = probs.sum()
    if total <= 0:
        raise ValueError("probabilities sum to zero")
    scaled = (probs / total) * scale
    counts = np.floor(scaled).astype(np.int64)
    deficit = scale - int(counts.sum())
    if deficit > 0:
        fractions = scaled - counts
        top = np.argpartition(-fractions, deficit - 1)[:deficit]
        counts[top] += 1
    return counts


def quantize_rows(probs: np.ndarray, scale: int) -> np.ndarray:
    """`quantize` for each row of a [rows, n] block of probabilities at once (a tree pass's
    draft rows): ties to the lower index, and a zero probability stays zero. A full sort per row,
    so meant for narrow rows (candidates); `quantize` selects partially over a wide one."""
    scaled = probs / probs.sum(axis=1, keepdims=True) * scale
    counts = np.floor(scaled).astype(np.int64)
    deficit = scale - counts.sum(axis=1, keepdims=True)
    fractions = np.where(probs > 0, scaled - counts, -1.0)
    rank = np.empty_like(counts)
    order = np.argsort(-fractions, axis=1, kind="stable")
    np.put_along_axis(rank, order, np.arange(probs.shape[1])[None, :], axis=1)
    return counts + (rank < deficit)


def dequantize(counts: Counts, bits: int = 16) -> np.ndarray:
    """counts / (2^bits − 1) in float64: the probabilities both sides decide with."""
    return np.asarray(counts, dtype=np.int64) / float(scale_of(bits))


@dataclass(frozen=True)
class Rounded:
    """A target distribution rounded for the wire: `counts` over its bins sum to 2^bits − 1,
    `tv` = TV(q, q̂) over those bins (float64), the distance from the float law it replaces."""

    counts: Counts
    bits: int
    tv: float

    @property
    def probs(self) -> np.ndarray:
        return dequantize(self.counts, self.bits)


def round_probs(probs: np.ndarray, bits: int) -> Rounded:
    """Round a float distribution to `bits`-bit counts and measure the TV distance it costs."""
    probs = np.asarray(probs, dtype=np.float64)
    counts = quantize(probs, scale_of(bits))
    tv = 0.5 * float(np.abs(dequantize(counts, bits) - probs / probs.sum()).sum())
    return Rounded(counts, bits, tv)


def sample(counts: Counts, rng: np.random.Generator) -> int:
    """Draw an index with probability counts[i] / counts.sum(), exactly (integer arithmetic)."""
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    if total <= 0:
        raise ValueError("cannot sample from an all-zero distribution")
    return int(np.searchsorted(cumulative, rng.integers(total), side="right"))
