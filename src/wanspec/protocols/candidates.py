"""SR-DV's K (candidates in a rejection's first set) and M (candidate sets before the exact
fallback), chosen online from what the edge measures.

At a rejected position SR-DV's verdict brings K candidates y ~ q; the edge accepts each with
probability max(0, 1 − p̃(y)/q(y)), whose mean over y ~ q is the position's residual mass
β = TV(q, p̃), so a set fails with (1 − β)^K. After a failed set the edge asks for another (a
round trip, K candidates down) or, after M sets, uploads p̃ of the position and the cloud draws
the residual (a round trip, p̃ up, always resolved). Seconds from the verdict to resolution:

    T(K, M) = K·c + Σ_{j=1}^{M−1} F_j·(t + K·c) + F_M·(t + f),    F_j = E[(1 − β)^{jK}]

with c the seconds one candidate adds to a reply, t a follow-up's round trip besides its bits,
and f the seconds the fallback's upload adds. F_j averages over recent rejected positions: β
differs from one position to the next, and (1 − mean β)^{jK} would understate the failures at
the hard ones. The costs come from `LinkFit`, a least-squares fit of every exchange's seconds
on its bits up and down (both link rates from message sizes and times).

Every choice depends only on earlier rounds and each set is an exact rejection sampler of the
residual, so each round's law is the target's whatever K and M; the tokens follow the timing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The most candidates and sets `srdv_k="auto"` / `srdv_m="auto"` may choose.
AUTO_SRDV_K_MAX = 16
AUTO_SRDV_M_MAX = 8
# Rejected positions whose β the failure odds average over.
BETA_WINDOW = 64
# Exchanges the link fit keeps.
LINK_WINDOW = 64
# A plan changes only when the model expects it to resolve a rejection this much faster.
SWITCH_GAIN = 0.05
# Before a position's candidates are seen, β is assumed to be this.
PRIOR_BETA = 0.3
# The fit's ridge on seconds per kbit (pulls an unidentified rate to "free", not to noise).
RIDGE = 1e-6


@dataclass(frozen=True)
class LinkCosts:
    """What one exchange costs, as the link fit sees it."""

    trip_s: float  # a follow-up's round trip besides its bits: RTT and the cloud's draw
    up_s_per_bit: float
    down_s_per_bit: float
    verify_s: float = 0.0  # what a verification adds to a trip (0 until a follow-up was seen)


def failure_table(k_max: int, sets_max: int, betas: Sequence[float]) -> np.ndarray:
    """F_j(K) for every K ≤ k_max and j ≤ sets_max (entry [K − 1, j − 1]): the share of recent
    rejected positions at which j sets of K candidates all fail (the prior β before any)."""
    misses = 1.0 - np.clip(np.asarray(betas if len(betas) else [PRIOR_BETA], np.float64), 0, 1)
    k = np.arange(1, k_max + 1, dtype=np.float64)[:, None]
    j = np.arange(1, sets_max + 1, dtype=np.float64)[None, :]
    return np.mean(misses[:, None, None] ** (k * j)[None], axis=0)


def set_failures(betas: Sequence[float], k: int, sets: int) -> float:
    """F_j: the share of rejected positions at which `sets` sets of `k` candidates all fail."""
    return float(failure_table(k, sets, betas)[k - 1, sets - 1])


def resolution_table(
    k_max: int,
    m_max: int,
    betas: Sequence[float],
    costs: LinkCosts,
    *,
    candidate_bits: float,
    fallback_bits: float,
) -> np.ndarray:
    """T(K, M) for every K ≤ k_max and M ≤ m_max at once (entry [K − 1, M − 1]): the
    controller prices the whole grid after each rejection, so it is one array expression."""
    if k_max < 1 or m_max < 1:
        raise ValueError(f"K and M must be at least 1, got K={k_max}, M={m_max}")
    fails = failure_table(k_max, m_max, betas)
    per_set = np.arange(1, k_max + 1)[:, None] * candidate_bits * costs.down_s_per_bit
    # sets 2..M follow the first when the sets before them all failed
    more_sets = np.cumsum(fails, axis=1) - fails
    fallback = costs.trip_s + fallback_bits * costs.up_s_per_bit
    return per_set + more_sets * (costs.trip_s + per_set) + fails * fallback


def resolution_seconds(
    k: int,
    m: int,
    betas: Sequence[float],
    costs: LinkCosts,
    *,
    candidate_bits: float,
    fallback_bits: float,
) -> float:
    """T(K, M): expected seconds from a rejection's verdict to its resolution."""
    table = resolution_table(
        k, m, betas, costs, candidate_bits=candidate_bits, fallback_bits=fallback_bits
    )
    return float(table[k - 1, m - 1])


class LinkFit:
    """Seconds of an exchange (a message out, its reply back) as a + v·[cloud verified] +
    u·bits up + d·bits down, fitted by least squares over the last `window` exchanges with
    non-negative coefficients. An exchange where the cloud verified a draft carries its
    verification time in v; a follow-up's (candidates, a fallback) has only the draw."""

    def __init__(self, window: int = LINK_WINDOW) -> None:
        self.rows: deque[tuple[float, float, float, float]] = deque(maxlen=window)
        self.seconds: deque[float] = deque(maxlen=window)

    def observe(self, *, up_bits: int, down_bits: int, seconds: float, verified: bool) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be finite and non-negative, got {seconds!r}")
        self.rows.append((1.0, float(verified), up_bits / 1000.0, down_bits / 1000.0))
        self.seconds.append(float(seconds))

    def costs(self) -> LinkCosts | None:
        """The fitted costs (None before any exchange). Until a follow-up was seen the
        verification cannot be told from the round trip, and a follow-up is priced like a
        verdict: an upper bound, which errs toward fewer round trips."""
        if not self.rows:
            return None
        x, y = np.array(self.rows), np.array(self.seconds)
        free = [0, 1, 2, 3]
        if len(set(x[:, 1])) == 1:
            free.remove(1)  # all verified or none: the intercept holds it
        coef = np.zeros(4)
        while free:
            ridge = np.diag([RIDGE if i >= 2 else 0.0 for i in free])
            a = np.vstack([x[:, free], np.sqrt(ridge)])
            b = np.concatenate([y, np.zeros(len(free))])
            solution = np.linalg.lstsq(a, b, rcond=None)[0]
            if (solution >= 0).all():
                coef[free] = solution
                break
            free.pop(int(np.argmin(solution)))  # the most negative term is held at 0
        return LinkCosts(float(coef[0]), coef[2] / 1000.0, coef[3] / 1000.0, float(coef[1]))


@dataclass
class CandidatePlanner:
    """The edge's K and M for SR-DV, re-planned after each resolved rejection.

    `adapt_k` / `adapt_m` False hold K / M at their start; `k_max` and `m_max` cap the choice
    (the request's srdv_k and srdv_m, which the cloud enforces)."""

    k: int
    m: int
    k_max: int
    m_max: int
    adapt_k: bool = True
    adapt_m: bool = True

    def __post_init__(self) -> None:
        if not (1 <= self.k <= self.k_max and 1 <= self.m <= self.m_max):
            raise ValueError(
                f"start K={self.k}, M={self.m} must lie within 1..{self.k_max}, 1..{self.m_max}"
            )
        self.betas: deque[float] = deque(maxlen=BETA_WINDOW)
        self.link = LinkFit()
        self.candidate_bits: float | None = None
        self.fallback_bits: float | None = None
        self.history: list[tuple[int, int]] = [(self.k, self.m)]

    def observe_position(self, beta: float) -> None:
        """A resolved rejection's β, estimated from its candidates (each set is y ~ q)."""
        self.betas.append(min(max(float(beta), 0.0), 1.0))

    def observe_candidates(self, count: int, bits: int) -> None:
        """A reply carrying `count` candidates in `bits` (the reply's bits over its count: an
        upper bound on what one candidate adds, headers included)."""
        if count > 0:
            per = bits / count
            self.candidate_bits = (
                per if self.candidate_bits is None else 0.8 * self.candidate_bits + 0.2 * per
            )

    def observe_fallback(self, bits: int) -> None:
        """The bits of a fallback's upload (or of the one the edge would send)."""
        self.fallback_bits = float(bits)

    def replan(self) -> tuple[int, int]:
        """The (K, M) with the least modelled resolution time, if it beats the current one by
        `SWITCH_GAIN`; otherwise the current one."""
        costs = self.link.costs()
        if costs is None or self.candidate_bits is None or self.fallback_bits is None:
            return self.k, self.m
        table = resolution_table(
            self.k_max,
            self.m_max,
            list(self.betas),
            costs,
            candidate_bits=self.candidate_bits,
            fallback_bits=self.fallback_bits,
        )
        ks = range(1, self.k_max + 1) if self.adapt_k else [self.k]
        ms = range(1, self.m_max + 1) if self.adapt_m else [self.m]

        def seconds(plan: tuple[int, int]) -> float:
            return float(table[plan[0] - 1, plan[1] - 1])

        best = min(((k, m) for k in ks for m in ms), key=lambda p: (seconds(p), p))
        if seconds(best) < (1.0 - SWITCH_GAIN) * seconds((self.k, self.m)):
            self.k, self.m = best
            self.history.append(best)
        return self.k, self.m
