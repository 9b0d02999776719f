"""AceSpec's policy math: how many branch tips to draft (budget) and where to put them (shape).

Pure functions over numbers and numpy arrays (no I/O, no clock, no model), called by the AceSpec
pipeline machine once per round. The paper's section IV in our terms:

- Budget (eq. 5): ``B* = min(B_max, ⌊T_tree⁻¹(RTT + T_verify)⌋)``: the edge may draft as big a
  tree as it can finish while the reply is in flight, so tree drafting never becomes the
  bottleneck. `tree_budget` inverts a measured latency profile by binary search.
- Shape (eq. 14): ``F_k = B_alloc (1−η)/(1−η^γ) η^k`` with ``η = α^{1/(β+1)}``: depth k is only
  reached with probability α^k, so alternatives are worth more near the root. α is the running
  per-token acceptance rate, β the exponent of the residual's power-law tail
  ``R(F) ≈ 1 − c F^{−β}`` (how much rejected-token mass the top-F draft alternatives capture),
  fitted online by `fit_power_law` from curves measured by `ranked_capture`.
- `BranchPlanner` keeps the online estimates (window EWMA, α, β) and turns them into an F vector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALLOCATION_MODES = ("single", "uniform", "geometric")

# α is clamped away from 0 and 1: η = 1 would make eq. 14 divide by zero, η = 0 puts every
# branch at depth 0 whatever the budget, and a running rate of exactly 0 or 1 is just few samples.
ALPHA_MIN, ALPHA_MAX = 1e-3, 1.0 - 1e-3
# β outside this range is a fit to noise: β → 0 means "alternatives capture nothing", β → ∞
# "the top-1 alternative captures everything"; both would drive η to a degenerate 1 or 0.
BETA_MIN, BETA_MAX = 0.05, 20.0
# (c, β) before any residual has been observed: R(F) = 1 − 1/F, a plain harmonic tail.
DEFAULT_POWER_LAW = (1.0, 1.0)
# α before any round has been verified: the uninformative midpoint.
PRIOR_ALPHA = 0.5


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Non-negative integers summing exactly to `total`, proportional to weights (ties: lower
    index first).

    Each entry is the floor of its exact share ``total·w_k/Σw`` plus at most one, the extra units
    going to the largest fractional parts, so every entry is within 1 of its exact share.
    """
    total = _check_int("total", total, 0)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError("weights must be a non-empty 1-D sequence")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    if not np.any(w > 0):
        if total == 0:
            return [0] * w.size
        raise ValueError("weights sum to zero: nothing to be proportional to")
    w = w / w.max()  # scale first: neither a huge sum nor a subnormal one may overflow
    exact = w / w.sum() * total
    floors = np.floor(exact).astype(np.int64)
    missing = total - int(floors.sum())  # in [0, len(w)]: the fractional parts sum below len(w)
    order = np.argsort(-(exact - floors), kind="stable")  # stable: ties go to the lower index
    floors[order[:missing]] += 1
    return [int(f) for f in floors]


def decay_factor(alpha: float, beta: float) -> float:
    """η = α^{1/(β+1)} (paper eq. 13), with α clamped into [ALPHA_MIN, ALPHA_MAX]."""
    alpha = min(max(_check_real("alpha", alpha), ALPHA_MIN), ALPHA_MAX)
    beta = _check_real("beta", beta)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return alpha ** (1.0 / (beta + 1.0))


def geometric_shares(b_alloc: int, gamma: int, eta: float) -> np.ndarray:
    """Unrounded optimum of paper eq. 14: ``F_k = B_alloc (1−η)/(1−η^γ) η^k``, k = 0..γ−1."""
    b_alloc = _check_int("b_alloc", b_alloc, 0)
    gamma = _check_int("gamma", gamma, 1)
    eta = _check_real("eta", eta)
    if not 0 < eta < 1:
        raise ValueError(f"eta must be in (0, 1), got {eta}")
    return b_alloc * (1 - eta) / (1 - eta**gamma) * eta ** np.arange(gamma, dtype=np.float64)


def allocate_branches(
    b_alloc: int, gamma: int, alpha: float, beta: float, mode: str = "geometric"
) -> list[int]:
    """F_0..F_{γ−1}: how many alternatives to branch off at each depth, summing to b_alloc.

    geometric: eq. 14 rounded by largest remainder (non-increasing with depth, since the exact
    shares decrease and ties round towards the shallower depth); uniform: equal shares (the
    paper's ablation baseline); single: everything at depth 0 (a one-level tree). α is clamped
    into [ALPHA_MIN, ALPHA_MAX].
    """
    b_alloc = _check_int("b_alloc", b_alloc, 0)
    gamma = _check_int("gamma", gamma, 1)
    if mode == "geometric":
        return largest_remainder(
            geometric_shares(b_alloc, gamma, decay_factor(alpha, beta)), b_alloc
        )
    if mode == "uniform":
        return largest_remainder([1.0] * gamma, b_alloc)
    if mode == "single":
        return [b_alloc] + [0] * (gamma - 1)
    raise ValueError(f"unknown allocation mode {mode!r}; expected one of {ALLOCATION_MODES}")


def hit_probability(alpha: float, fanout: Sequence[int], capture: Callable[[int], float]) -> float:
    """P(the tree holds a rejection's outcome): the chain is rejected at depth k with probability
    ∝ α^k (k < γ), and the F_k alternatives branched there hold the outcome with probability
    R(F_k), the residual mass the top F_k capture (R(0) = 0)."""
    alpha = min(max(_check_real("alpha", alpha), ALPHA_MIN), ALPHA_MAX)
    if not fanout:
        raise ValueError("a tree has at least one depth")
    weights = alpha ** np.arange(len(fanout), dtype=np.float64)
    captured = [capture(f) if f > 0 else 0.0 for f in fanout]
    return float(np.dot(weights, captured) / weights.sum())


def tree_budget(
    b_max: int, window_s: float, tree_seconds: Callable[[int], float], gamma: int
) -> int:
    """B* = min(b_max, ⌊T_tree⁻¹(window)⌋) (paper eq. 5): the most branch tips worth drafting.

    Our reading of the paper's T_tree_draft(B): the edge drafts the tree depth by depth, γ
    sequential tree passes each over all B branch tips (the main continuation is one of them), so
    a tree of B tips costs ``γ·tree_seconds(B)``. It must fit in `window_s`, the time the reply
    takes as the edge observes it (reply time minus send time, i.e. RTT + T_verify). Returns the
    largest B in [1, b_max] with ``γ·tree_seconds(B) <= window_s``, or 1 when even B = 1 does not
    fit: the main continuation is always drafted. `tree_seconds` must be non-decreasing in B
    (more tips never cost less); it is called O(log b_max) times.
    """
    b_max = _check_int("b_max", b_max, 1)
    gamma = _check_int("gamma", gamma, 1)
    window_s = _check_real("window_s", window_s)

    def fits(b: int) -> bool:
        return gamma * float(tree_seconds(b)) <= window_s

    low, high = 1, b_max  # invariant: the answer lies in [low, high]
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


class Ewma:
    """Exponentially weighted moving average seeded by the first observation (no bias towards an
    arbitrary starting value): value ← weight·x + (1 − weight)·value."""

    def __init__(self, weight: float = 0.3) -> None:
        weight = _check_real("weight", weight)
        if not 0 < weight <= 1:
            raise ValueError(f"EWMA weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.value: float | None = None

    def update(self, x: float) -> float:
        x = _check_real("observation", x)
        self.value = x if self.value is None else self.weight * x + (1 - self.weight) * self.value
        return self.value


def fit_power_law(fanouts: Sequence[int], captured: Sequence[float]) -> tuple[float, float]:
    """(c, β) of ``R(F) ≈ 1 − c F^{−β}`` by least squares on ``log(1−R) = log c − β log F``.

    Only points with 0 < R < 1 carry information on the log scale (R = 1 is log 0). With fewer
    than 2 distinct usable F the slope is undetermined and DEFAULT_POWER_LAW is returned. β is
    clamped into [BETA_MIN, BETA_MAX]; when clamped, c is refitted for that β (the constrained
    least-squares optimum) so that the pair still describes the data.
    """
    f = np.asarray(fanouts, dtype=np.float64)
    r = np.asarray(captured, dtype=np.float64)
    if f.ndim != 1 or f.shape != r.shape:
        raise ValueError("fanouts and captured must be 1-D sequences of the same length")
    if not np.all(np.isfinite(f)) or np.any(f < 1):
        raise ValueError("fanouts must be finite and >= 1")
    if not np.all(np.isfinite(r)):
        raise ValueError("captured masses must be finite")
    usable = (r > 0) & (r < 1)
    x, y = np.log(f[usable]), np.log1p(-r[usable])
    if np.unique(x).size < 2:
        return DEFAULT_POWER_LAW
    slope, intercept = np.polyfit(x, y, 1)
    beta = float(-slope)
    if not BETA_MIN <= beta <= BETA_MAX:
        beta = min(max(beta, BETA_MIN), BETA_MAX)
        intercept = float(np.mean(y + beta * x))
    return float(math.exp(intercept)), beta


def residual_capture(
    residual: np.ndarray, proxy: np.ndarray, exclude: int, max_f: int
) -> np.ndarray:
    """R(F) for F = 1..max_f: the residual mass captured by the top-F tokens of `proxy`,
    excluding token `exclude`.

    `residual` is the distribution the rejected position is resampled from (normalised here);
    `proxy` ranks the alternatives the edge would have branched on: the draft distribution p at
    that depth (counts or floats; ties rank the lower id first), without the main-chain token
    `exclude`, which is never an alternative. Beyond the vocabulary the curve stays flat.
    """
    residual = np.asarray(residual, dtype=np.float64)
    proxy = np.asarray(proxy, dtype=np.float64)
    if residual.ndim != 1 or residual.shape != proxy.shape:
        raise ValueError("residual and proxy must be 1-D arrays over the same vocabulary")
    if not np.all(np.isfinite(residual)) or np.any(residual < 0) or residual.sum() <= 0:
        raise ValueError("residual must be finite, non-negative and not all zero")
    if not np.all(np.isfinite(proxy)):
        raise ValueError("proxy must be finite")
    exclude = _check_int("exclude", exclude, 0)
    if exclude >= residual.size:
        raise ValueError(f"exclude {exclude} outside the vocabulary of {residual.size}")
    max_f = _check_int("max_f", max_f, 1)
    ranked = np.argsort(-proxy, kind="stable")
    return ranked_capture(residual, ranked[ranked != exclude], max_f)


def ranked_capture(residual: np.ndarray, ranked: Sequence[int], max_f: int) -> np.ndarray:
    """R(F) for F = 1..max_f when the alternatives, best first, are `ranked` (the list the edge
    really branched on); past its end the curve stays flat."""
    residual = np.asarray(residual, dtype=np.float64)
    ranked = np.asarray(ranked, dtype=np.int64)[:max_f]
    curve = np.cumsum(residual[ranked]) / residual.sum()
    return np.concatenate([curve, np.full(max_f - curve.size, curve[-1] if curve.size else 0.0)])


@dataclass
class BranchPlanner:
    """Online state of AceSpec's budget and shape, one per generation.

    Feeds: `observe_window(seconds)` with each reply's send-to-reply time (RTT + T_verify as the
    edge sees it, smoothed by an EWMA); `observe_round(accepted, drafted)` with each verified
    chain; `observe_capture(curve)` with the R(F) curve (`ranked_capture`) of each rejection.
    `plan(γ)` then gives the F vector for the next tree.

    Budget: `fixed_budget` if set (the ablation compares shapes at one B); otherwise b_max when
    there is no pass cost (`tree_seconds` None, as with `tree_fixed`: no network awareness; an edge
    with no latency profile gets `control.PassCost`, fitted to its own passes) or no window observed
    yet; otherwise `tree_budget(b_max, window EWMA, tree_seconds, γ)`.

    Shape: ``B_alloc = B* − 1``, unlike the paper's ``B* − γ``: here B counts branch TIPS per tree
    pass (what a pass costs), and the main continuation is one tip at every depth, so B* − 1 tips
    are left for alternatives.

    α is the maximum-likelihood per-token acceptance rate Σaccepted / Σtested, where a round
    tests its accepted tokens plus the first rejected one (tokens after a rejection are never
    tested). The plain ratio accepted/drafted would count untested tokens as rejections and
    underestimate α: for α = 0.8, γ = 4 it averages 0.59. Before any round α = PRIOR_ALPHA.
    β is fitted (`fit_power_law`) to the mean of all observed capture curves, i.e. to E[R(F)].
    """

    b_max: int
    mode: str = "geometric"
    tree_seconds: Callable[[int], float] | None = None
    fixed_budget: int | None = None
    window_weight: float = 0.3
    window: Ewma = field(init=False, repr=False)
    accepted: int = field(init=False, default=0)
    tested: int = field(init=False, default=0)
    stats: dict[str, Any] = field(init=False, default_factory=dict)
    _capture_sum: np.ndarray = field(init=False, repr=False)
    _capture_count: np.ndarray = field(init=False, repr=False)
    _power_law: tuple[float, float] = field(init=False, repr=False, default=DEFAULT_POWER_LAW)

    def __post_init__(self) -> None:
        _check_int("b_max", self.b_max, 1)
        if self.mode not in ALLOCATION_MODES:
            raise ValueError(f"unknown allocation mode {self.mode!r}; expected {ALLOCATION_MODES}")
        if self.fixed_budget is not None:
            _check_int("fixed_budget", self.fixed_budget, 1)
            if self.fixed_budget > self.b_max:
                raise ValueError(f"fixed_budget {self.fixed_budget} exceeds b_max {self.b_max}")
        self.window = Ewma(self.window_weight)
        self._capture_sum = np.zeros(0)
        self._capture_count = np.zeros(0, dtype=np.int64)

    @property
    def alpha(self) -> float:
        return self.accepted / self.tested if self.tested else PRIOR_ALPHA

    @property
    def power_law(self) -> tuple[float, float]:
        """(c, β) fitted to the observed captures so far."""
        return self._power_law

    def observe_window(self, seconds: float) -> None:
        if _check_real("seconds", seconds) < 0:
            raise ValueError(f"a reply window cannot be negative, got {seconds}")
        self.window.update(seconds)

    def observe_round(self, accepted: int, drafted: int) -> None:
        drafted = _check_int("drafted", drafted, 0)
        accepted = _check_int("accepted", accepted, 0)
        if accepted > drafted:
            raise ValueError(f"accepted {accepted} exceeds drafted {drafted}")
        self.accepted += accepted
        self.tested += accepted + int(accepted < drafted)  # + the first rejected token

    def observe_capture(self, curve: np.ndarray) -> None:
        curve = np.asarray(curve, dtype=np.float64)
        if curve.ndim != 1 or curve.size == 0 or not np.all(np.isfinite(curve)):
            raise ValueError("a capture curve is a non-empty 1-D array of R(1), R(2), ...")
        if curve.size > self._capture_sum.size:
            grow = curve.size - self._capture_sum.size
            self._capture_sum = np.concatenate([self._capture_sum, np.zeros(grow)])
            self._capture_count = np.concatenate([self._capture_count, np.zeros(grow, np.int64)])
        self._capture_sum[: curve.size] += curve
        self._capture_count[: curve.size] += 1
        mean_curve = self._capture_sum / self._capture_count
        self._power_law = fit_power_law(np.arange(1, mean_curve.size + 1), mean_curve)

    def budget(self, passes: int) -> int:
        """B*: branch tips per tree pass for a tree of `passes` passes, main continuation
        included."""
        if self.fixed_budget is not None:
            return self.fixed_budget
        if self.tree_seconds is None or self.window.value is None:
            return self.b_max
        return tree_budget(self.b_max, self.window.value, self.tree_seconds, passes)

    def capture(self, fanout: int) -> float:
        """R(F): the mean captured mass measured at F alternatives, or the fitted power law past
        the longest curve observed."""
        if 1 <= fanout <= self._capture_sum.size:
            return float(self._capture_sum[fanout - 1] / self._capture_count[fanout - 1])
        c, beta = self._power_law
        return min(max(1.0 - c * fanout ** (-beta), 0.0), 1.0)

    def expected_hit(self, gamma: int, budget: int | None = None) -> float | None:
        """P(hit | rejection) of the tree `plan(γ)` would draft for a chain of γ (at `budget`
        tips, else at its own budget), from the captures observed so far (None before any:
        nothing to predict from)."""
        if self._capture_sum.size == 0:
            return None
        return hit_probability(self.alpha, self._shape(gamma, gamma, budget), self.capture)

    def _shape(self, gamma: int, passes: int, budget: int | None = None) -> list[int]:
        tips = self.budget(passes) if budget is None else budget
        return allocate_branches(tips - 1, gamma, self.alpha, self._power_law[1], self.mode)

    def plan(self, gamma: int, passes: int | None = None) -> list[int]:
        """F_0..F_{γ−1} for the next tree over a chain of γ, summing to B* − 1 (the tree drafts
        `passes` passes, γ unless the next chain's length differs); records them in `stats`."""
        budget = self.budget(gamma if passes is None else passes)
        c, beta = self._power_law
        shape = self._shape(gamma, gamma if passes is None else passes)
        self.stats = {
            "budget": budget,
            "F": shape,
            "alpha": self.alpha,
            "beta": beta,
            "c": c,
            "window_s": self.window.value,
        }
        return shape
