"""What happens at a rejection: every resampling scheme of SPEC.md over the same primitives.

Lossless schemes draw from the residual r(x) = max(q(x) − p(x), 0) / Z; they differ only in who
draws and what travels. Each scheme is split into the part the cloud computes (from q) and the
part the edge computes (with p), so protocols can put the wire between them. All arrays are
float64 probability vectors over the target vocabulary (q: the cloud's float q, or the rounded
q̂ of a method that ships it; p: the draft's p̃), or weights on one common scale; every draw is
`wanspec.sampling.draws.bernoulli` or `pick`. `common` is the boolean mask of the common
vocabulary C (all True for a shared vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from wanspec.sampling.draws import Rng, bernoulli, pick

Probs = np.ndarray  # float64 probabilities (or non-negative weights on one scale)

# --------------------------------------------------------------------- the shared primitive


def residual(target: Probs, draft: Probs) -> Probs:
    """Unnormalised residual max(q − p, 0); its sum is Z."""
    return np.maximum(np.asarray(target, np.float64) - np.asarray(draft, np.float64), 0.0)


def sample_residual(target: Probs, draft: Probs, rng: Rng) -> int:
    """Draw from r = max(q − p, 0)/Z (Naive, CoSD, DSSD on the edge; SD, UL on the cloud)."""
    mass = residual(target, draft)
    if not mass.any():
        raise ValueError("empty residual: q <= p everywhere, so no rejection could have happened")
    return pick(mass, rng)


# --------------------------------------------------------------------- HR (X-CoSD)


@dataclass(frozen=True)
class HybridPayload:
    """What the cloud sends for hybrid resampling: q on C, θ_o, and optionally an O-sample."""

    target_common: Probs  # q restricted to C (zeros elsewhere), full target width
    theta_o: float  # Σ_{x∈O} q(x)
    o_sample: int | None  # a draw from q restricted to O (piggybacked), None if requested later


def hybrid_cloud_payload(
    target: Probs, common: np.ndarray, rng: Rng, *, piggyback: bool = True
) -> HybridPayload:
    """Cloud side of HR; the piggybacked O-sample is independent of the edge's region choice."""
    target = np.asarray(target, np.float64)
    theta_o = float(np.where(common, 0.0, target).sum())
    o_sample = hybrid_o_sample(target, common, rng) if (piggyback and theta_o > 0) else None
    return HybridPayload(np.where(common, target, 0.0), theta_o, o_sample)


def hybrid_bins(target: Probs, common: np.ndarray, common_ids: np.ndarray) -> Probs:
    """q as HR ships it: q on C in the order of `common_ids`, then θ_o (the mass on O) as one
    more bin. Rounding these bins is all the rounding HR needs: the O-sample comes from the
    float q restricted to O, so O's share of q̂ is θ̂_o · q|O and TV(q, q̂) is the bins' TV."""
    target = np.asarray(target, np.float64)
    return np.append(target[common_ids], np.where(common, 0.0, target).sum())


def hybrid_o_sample(target: Probs, common: np.ndarray, rng: Rng) -> int:
    """A draw from q restricted to O (HR's requested mode, and the piggybacked O-sample)."""
    return pick(np.where(common, 0.0, np.asarray(target, np.float64)), rng)


@dataclass(frozen=True)
class HybridChoice:
    region: Literal["C", "O"]
    token: int | None  # None: region O chosen and the O-sample must be requested from the cloud


def hybrid_edge_resolve(
    payload: HybridPayload, draft: Probs, common: np.ndarray, rng: Rng
) -> HybridChoice:
    """Edge side of HR: pick C with prob θ_c/(θ_c+θ_o), then sample the residual on C locally."""
    common_residual = np.where(common, residual(payload.target_common, draft), 0.0)
    theta_c = float(common_residual.sum())
    if not theta_c + payload.theta_o > 0:
        raise ValueError("empty residual in hybrid resampling")
    if bernoulli(theta_c, theta_c + payload.theta_o, rng):
        return HybridChoice("C", pick(common_residual, rng))
    return HybridChoice("O", payload.o_sample)


# --------------------------------------------------------------------- SR-DV (X-CoSD-E)


def srdv_cloud_candidates(
    target: Probs, k: int, rng: Rng
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """K i.i.d. candidates y ~ q with their probabilities q(y) at full (float64) precision."""
    if k < 1:
        raise ValueError("SR-DV needs K >= 1 candidates")
    target = np.asarray(target, np.float64)
    ids = tuple(pick(target, rng) for _ in range(k))
    return ids, tuple(float(target[y]) for y in ids)


def srdv_edge_verify(
    ids: tuple[int, ...], target_probs: tuple[float, ...], draft: Probs, rng: Rng
) -> int | None:
    """Accept candidate y with prob max(0, 1 − p(y)/q(y)); the first accepted wins, else None.

    Rejection sampling of r with proposal q: each candidate is accepted with probability Z and an
    accepted value is distributed as r. O-tokens have p(y) = 0 and are always accepted.
    """
    for y, q_y in zip(ids, target_probs, strict=True):
        if not q_y > 0:
            raise ValueError("a candidate must have positive target probability")
        if bernoulli(q_y - float(draft[y]), q_y, rng):
            return y
    return None


# --------------------------------------------------------------------- lossy baselines


def greedy_replacement(target: Probs) -> int:
    """GR: the cloud's argmax replaces the rejected token (lossy)."""
    return int(np.argmax(target))


def truncate_top_k(target: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """TR cloud side: the top-k entries of q (ids ascending, their values: counts or probs)."""
    if k < 1:
        raise ValueError("TR needs k >= 1")
    target = np.asarray(target)
    target = target.astype(np.float64 if target.dtype.kind == "f" else np.int64)  # no uint wrap
    k = min(k, int(np.count_nonzero(target)))
    ids = np.sort(np.argpartition(-target, k - 1)[:k])
    return ids, target[ids]


def truncated_residual_sample(ids: np.ndarray, target: Probs, draft: Probs, rng: Rng) -> int:
    """TR edge side: residual over the truncation; argmax of the truncation if it is empty.
    `target` holds q at `ids` only; `draft` is p over the whole vocabulary."""
    mass = residual(target, np.asarray(draft, np.float64)[ids])
    if not mass.any():
        return int(ids[int(np.argmax(target))])
    return int(ids[pick(mass, rng)])


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
