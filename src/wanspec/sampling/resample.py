"""What happens at a rejection: every resampling scheme of SPEC.md over the same primitives.

Lossless schemes draw from the residual r(x) = max(q(x) − p(x), 0) / Z; they differ only in who
draws and what travels. Each scheme is split into the part the cloud computes (from q) and the
part the edge computes (with p), so protocols can put the wire between them. All arrays are
count vectors over the target vocabulary (see wanspec.sampling.quant); `common` is the boolean
mask of the common vocabulary C (all True for a shared vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from wanspec.sampling.quant import Counts, bernoulli, sample

# --------------------------------------------------------------------- the shared primitive


def residual(target: Counts, draft: Counts) -> Counts:
    """Unnormalised residual max(q − p, 0); its sum is Z (in counts)."""
    return np.maximum(np.asarray(target, np.int64) - np.asarray(draft, np.int64), 0)


def sample_residual(target: Counts, draft: Counts, rng: np.random.Generator) -> int:
    """Draw from r = max(q − p, 0)/Z (Naive, CoSD, DSSD on the edge; UL on the cloud)."""
    mass = residual(target, draft)
    if not mass.any():
        raise ValueError("empty residual: q <= p everywhere, so no rejection could have happened")
    return sample(mass, rng)


# --------------------------------------------------------------------- HR (X-CoSD)


@dataclass(frozen=True)
class HybridPayload:
    """What the cloud sends for hybrid resampling: q on C, θ_o, and optionally an O-sample."""

    target_common: Counts  # q restricted to C (zeros elsewhere), full target width
    theta_o: int  # Σ_{x∈O} q(x) in counts
    o_sample: int | None  # a draw from q restricted to O (piggybacked), None if requested later


def hybrid_cloud_payload(
    target: Counts, common: np.ndarray, rng: np.random.Generator, *, piggyback: bool = True
) -> HybridPayload:
    """Cloud side of HR; the piggybacked O-sample is independent of the edge's region choice."""
    target = np.asarray(target, np.int64)
    outside = np.where(common, 0, target)
    theta_o = int(outside.sum())
    o_sample = sample(outside, rng) if (piggyback and theta_o > 0) else None
    return HybridPayload(np.where(common, target, 0), theta_o, o_sample)


def hybrid_o_sample(target: Counts, common: np.ndarray, rng: np.random.Generator) -> int:
    """Cloud side of HR's requested mode: a draw from q restricted to O."""
    return sample(np.where(common, 0, np.asarray(target, np.int64)), rng)


@dataclass(frozen=True)
class HybridChoice:
    region: Literal["C", "O"]
    token: int | None  # None: region O chosen and the O-sample must be requested from the cloud


def hybrid_edge_resolve(
    payload: HybridPayload, draft: Counts, common: np.ndarray, rng: np.random.Generator
) -> HybridChoice:
    """Edge side of HR: pick C with prob θ_c/(θ_c+θ_o), then sample the residual on C locally."""
    common_residual = np.where(common, residual(payload.target_common, draft), 0)
    theta_c = int(common_residual.sum())
    if theta_c + payload.theta_o <= 0:
        raise ValueError("empty residual in hybrid resampling")
    if bernoulli(theta_c, theta_c + payload.theta_o, rng):
        return HybridChoice("C", sample(common_residual, rng))
    return HybridChoice("O", payload.o_sample)


# --------------------------------------------------------------------- SR-DV (X-CoSD-E)


def srdv_cloud_candidates(
    target: Counts, k: int, rng: np.random.Generator
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """K i.i.d. candidates y ~ q with their counts q(y)."""
    if k < 1:
        raise ValueError("SR-DV needs K >= 1 candidates")
    target = np.asarray(target, np.int64)
    ids = tuple(sample(target, rng) for _ in range(k))
    return ids, tuple(int(target[y]) for y in ids)


def srdv_edge_verify(
    ids: tuple[int, ...], target_counts: tuple[int, ...], draft: Counts, rng: np.random.Generator
) -> int | None:
    """Accept candidate y with prob max(0, 1 − p(y)/q(y)); the first accepted wins, else None.

    Rejection sampling of r with proposal q: each candidate is accepted with probability Z and an
    accepted value is distributed as r. O-tokens have p(y) = 0 and are always accepted.
    """
    for y, q_y in zip(ids, target_counts, strict=True):
        if q_y <= 0:
            raise ValueError("a candidate must have positive target probability")
        if bernoulli(q_y - int(draft[y]), q_y, rng):
            return y
    return None


# --------------------------------------------------------------------- lossy baselines


def greedy_replacement(target: Counts) -> int:
    """GR: the cloud's argmax replaces the rejected token (lossy)."""
    return int(np.argmax(target))


def truncate_top_k(target: Counts, k: int) -> tuple[np.ndarray, Counts]:
    """TR cloud side: the top-k entries of q (ids ascending, their counts)."""
    if k < 1:
        raise ValueError("TR needs k >= 1")
    target = np.asarray(target, np.int64)
    k = min(k, int(np.count_nonzero(target)))
    ids = np.sort(np.argpartition(-target, k - 1)[:k])
    return ids, target[ids]


def truncated_residual_sample(
    ids: np.ndarray, counts: Counts, draft: Counts, rng: np.random.Generator
) -> int:
    """TR edge side: residual over the truncation; argmax of the truncation if it is empty."""
    mass = np.maximum(np.asarray(counts, np.int64) - np.asarray(draft, np.int64)[ids], 0)
    if not mass.any():
        return int(ids[int(np.argmax(counts))])
    return int(ids[sample(mass, rng)])


def uhlm_uncertainty(
    logits: np.ndarray,
    token: int,
    rng: np.random.Generator,
    *,
    samples: int = 20,
    eta_max: float = 2.0,
) -> float:
    """U-HLM uncertainty: share of E temperature-perturbed draft samples that differ from token.

    Temperatures are drawn uniformly from (0, eta_max]; `logits` are the draft's (TLI-restricted)
    logits at the position, −inf where the draft may not go.
    """
    logits = np.asarray(logits, np.float64)
    finite = np.isfinite(logits)
    disagreements = 0
    for _ in range(samples):
        eta = float(rng.uniform(0.0, eta_max)) or eta_max
        scaled = np.where(finite, (logits - logits[finite].max()) / eta, -np.inf)
        weights = np.exp(scaled)
        drawn = int(rng.choice(weights.size, p=weights / weights.sum()))
        disagreements += drawn != token
    return disagreements / samples
