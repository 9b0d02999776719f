"""wanspec.protocols.budget: AceSpec's network-aware budget and task-aware tree shape."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanspec.protocols.budget import (
    ALLOCATION_MODES,
    BETA_MAX,
    DEFAULT_POWER_LAW,
    PRIOR_ALPHA,
    BranchPlanner,
    Ewma,
    allocate_branches,
    decay_factor,
    fit_power_law,
    geometric_shares,
    hit_probability,
    largest_remainder,
    ranked_capture,
    residual_capture,
    tree_budget,
)

FAST = settings(max_examples=100, deadline=None)


def linear_tree_seconds(b: int) -> float:
    """A tree pass of b tips: 2 ms fixed plus 0.5 ms per tip."""
    return 0.002 + 0.0005 * b


# --- largest_remainder -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "total", "expected"),
    [
        ([0.5, 0.3, 0.2], 10, [5, 3, 2]),  # exact shares: nothing to round
        ([1, 2, 3, 4], 7, [1, 1, 2, 3]),  # shares .7 1.4 2.1 2.8: the +1s go to .8 and .7
        ([1, 1, 1], 5, [2, 2, 1]),  # a tie: the lower index wins
        ([1, 1], 1, [1, 0]),
        ([0, 1], 3, [0, 3]),  # a zero weight gets nothing
        ([0, 0], 0, [0, 0]),
    ],
)
def test_largest_remainder_hand_checked(weights, total, expected):
    assert largest_remainder(weights, total) == expected


@FAST
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=20).filter(
        lambda w: sum(w) > 0
    ),
    st.integers(0, 10_000),
)
def test_largest_remainder_sums_exactly_and_stays_within_one(weights, total):
    counts = largest_remainder(weights, total)
    exact = np.asarray(weights) * total / sum(weights)
    assert sum(counts) == total
    assert all(c >= 0 for c in counts)
    assert np.all(np.abs(np.asarray(counts) - exact) < 1 + 1e-9)


@pytest.mark.parametrize(
    ("weights", "total"),
    [([], 3), ([1.0, -1.0], 3), ([0.0, 0.0], 2), ([math.nan], 1), ([1.0], -1), ([1.0], 1.5)],
)
def test_largest_remainder_rejects_bad_input(weights, total):
    with pytest.raises(ValueError):
        largest_remainder(weights, total)


# --- allocate_branches -----------------------------------------------------------------------


def test_decay_factor_is_alpha_to_one_over_beta_plus_one():
    assert decay_factor(0.81, 1.0) == pytest.approx(0.9)
    assert decay_factor(0.125, 2.0) == pytest.approx(0.5)
    # α is clamped away from 1 (η = 1 would divide by zero in eq. 14) and from 0.
    assert decay_factor(1.0, 1.0) == pytest.approx((1 - 1e-3) ** 0.5)
    assert decay_factor(0.0, 1.0) == pytest.approx(1e-3**0.5)


@pytest.mark.parametrize(
    ("alpha", "beta", "b_alloc", "gamma"), [(0.7, 1.3, 37, 5), (0.3, 0.5, 9, 8)]
)
def test_geometric_shares_are_eq14(alpha, beta, b_alloc, gamma):
    eta = alpha ** (1 / (beta + 1))
    eq14 = [b_alloc * (1 - eta) / (1 - eta**gamma) * eta**k for k in range(gamma)]
    shares = geometric_shares(b_alloc, gamma, decay_factor(alpha, beta))
    np.testing.assert_allclose(shares, eq14, rtol=1e-12)
    assert shares.sum() == pytest.approx(b_alloc)


def test_geometric_allocation_hand_checked():
    # α = 1/4, β = 1: η = 1/2, and 15 = 8 + 4 + 2 + 1 exactly.
    assert allocate_branches(15, 4, 0.25, 1.0) == [8, 4, 2, 1]
    # η = 0.9, γ = 3: shares 36.90 33.21 29.89 -> floors 36 33 29, two units to .90 and .89.
    assert allocate_branches(100, 3, 0.81, 1.0) == [37, 33, 30]


@FAST
@given(
    b_alloc=st.integers(0, 500),
    gamma=st.integers(1, 12),
    alpha=st.floats(0, 1),
    beta=st.floats(0.05, 20),
)
def test_geometric_allocation_sums_decays_and_rounds_eq14(b_alloc, gamma, alpha, beta):
    shape = allocate_branches(b_alloc, gamma, alpha, beta, "geometric")
    exact = geometric_shares(b_alloc, gamma, decay_factor(alpha, beta))
    assert len(shape) == gamma
    assert sum(shape) == b_alloc
    assert all(a >= b for a, b in itertools.pairwise(shape))
    assert np.all(np.abs(np.asarray(shape) - exact) < 1 + 1e-9)


def test_uniform_and_single_shapes():
    assert allocate_branches(10, 4, 0.5, 1.0, "uniform") == [3, 3, 2, 2]
    assert allocate_branches(8, 4, 0.5, 1.0, "uniform") == [2, 2, 2, 2]
    assert allocate_branches(10, 4, 0.5, 1.0, "single") == [10, 0, 0, 0]
    assert allocate_branches(0, 3, 0.5, 1.0, "geometric") == [0, 0, 0]


def test_lower_acceptance_front_loads_the_tree():
    confident = allocate_branches(40, 4, 0.95, 1.0)
    doubtful = allocate_branches(40, 4, 0.2, 1.0)
    assert doubtful[0] > confident[0] and doubtful[-1] < confident[-1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "bushy"},
        {"b_alloc": -1},
        {"gamma": 0},
        {"beta": 0.0},
        {"alpha": math.nan},
    ],
)
def test_allocate_branches_rejects_bad_input(kwargs):
    args = {"b_alloc": 10, "gamma": 4, "alpha": 0.5, "beta": 1.0, "mode": "geometric"} | kwargs
    with pytest.raises(ValueError):
        allocate_branches(**args)


# --- tree_budget -----------------------------------------------------------------------------


def test_tree_budget_hand_checked():
    # γ = 4 passes of (2 + 0.5·B) ms fit in 101 ms for B <= 46.5.
    assert tree_budget(64, 0.101, linear_tree_seconds, 4) == 46
    # One pass per depth: with γ = 1 the same window holds B <= 198.
    assert tree_budget(1000, 0.101, linear_tree_seconds, 1) == 198


def test_tree_budget_fits_a_tree_that_exactly_fills_the_window():
    # Dyadic costs are exact in binary: 2 passes of 32/64 s fill 1 s exactly, so B = 32 fits.
    assert tree_budget(64, 1.0, lambda b: b / 64, 2) == 32


def test_tree_budget_follows_the_window_and_is_bounded():
    windows = [0.02, 0.05, 0.1, 0.2, 0.1, 0.03]
    budgets = [tree_budget(64, w, linear_tree_seconds, 4) for w in windows]
    assert budgets[0] < budgets[1] < budgets[2]  # grows with the RTT
    assert budgets[3] == 64  # capped by b_max
    assert budgets[3] > budgets[4] > budgets[5]  # shrinks when the RTT falls
    assert tree_budget(64, 0.001, linear_tree_seconds, 4) == 1  # nothing fits: the main chain
    assert tree_budget(64, -1.0, linear_tree_seconds, 4) == 1


@FAST
@given(
    increments=st.lists(st.floats(0, 5e-3), min_size=1, max_size=80),
    window=st.floats(0, 1.0),
    gamma=st.integers(1, 8),
)
def test_tree_budget_matches_brute_force(increments, window, gamma):
    profile = np.cumsum(increments)  # a monotone latency profile, B = 1..len
    calls: list[int] = []

    def seconds(b: int) -> float:
        calls.append(b)
        return float(profile[b - 1])

    b_max = len(profile)
    fitting = [b for b in range(1, b_max + 1) if gamma * profile[b - 1] <= window]
    assert tree_budget(b_max, window, seconds, gamma) == max(fitting, default=1)
    assert len(calls) <= math.ceil(math.log2(b_max)) + 1  # a binary search, not a scan


def test_tree_budget_rejects_bad_input():
    with pytest.raises(ValueError):
        tree_budget(0, 0.1, linear_tree_seconds, 4)
    with pytest.raises(ValueError):
        tree_budget(8, math.nan, linear_tree_seconds, 4)
    with pytest.raises(ValueError):
        tree_budget(8, 0.1, linear_tree_seconds, 0)


# --- Ewma ------------------------------------------------------------------------------------


def test_ewma_is_seeded_by_the_first_value_then_weighted():
    ewma = Ewma(0.3)
    assert ewma.value is None
    assert ewma.update(10.0) == 10.0
    assert ewma.update(20.0) == pytest.approx(0.3 * 20 + 0.7 * 10)
    assert ewma.update(0.0) == pytest.approx(0.7 * 13.0)
    assert ewma.value == pytest.approx(9.1)
    with pytest.raises(ValueError):
        Ewma(0.0)
    with pytest.raises(ValueError):
        ewma.update(math.inf)


# --- fit_power_law ---------------------------------------------------------------------------


@pytest.mark.parametrize(("c", "beta"), [(0.4, 1.7), (0.9, 0.3), (0.05, 4.0)])
def test_fit_power_law_recovers_exact_points(c, beta):
    fanouts = np.arange(1, 17)
    captured = 1 - c * fanouts ** (-beta)
    fitted_c, fitted_beta = fit_power_law(fanouts, captured)
    assert fitted_c == pytest.approx(c, abs=1e-6)
    assert fitted_beta == pytest.approx(beta, abs=1e-6)


def test_fit_power_law_recovers_noisy_points():
    rng = np.random.default_rng(0)
    fanouts = np.repeat(np.arange(1, 33), 4)
    tail = 0.3 * fanouts ** (-1.2) * np.exp(rng.normal(0, 0.05, fanouts.size))
    fitted_c, fitted_beta = fit_power_law(fanouts, 1 - tail)
    assert fitted_c == pytest.approx(0.3, rel=0.05)
    assert fitted_beta == pytest.approx(1.2, abs=0.05)


def test_fit_power_law_skips_saturated_points_and_falls_back():
    fanouts = [1, 2, 3, 4]
    captured = [0.0, 1 - 0.5 * 2**-1.0, 1 - 0.5 * 3**-1.0, 1.0]  # R = 0 and R = 1 carry no slope
    assert fit_power_law(fanouts, captured) == pytest.approx((0.5, 1.0))
    assert fit_power_law([2, 5], [0.5, 1.0]) == DEFAULT_POWER_LAW  # one usable point
    assert fit_power_law([3, 3], [0.5, 0.6]) == DEFAULT_POWER_LAW  # one distinct F
    assert fit_power_law([], []) == DEFAULT_POWER_LAW


def test_fit_power_law_clamps_beta_and_refits_c():
    fanouts = np.array([1.0, 2.0])
    c, beta = fit_power_law(fanouts, 1 - 0.5 * fanouts ** (-50.0))
    assert beta == BETA_MAX
    # c is the least-squares optimum for β = 20: the geometric mean of 1−R times F^20.
    assert c == pytest.approx(math.sqrt(0.5 * 0.5 * 2.0**-30))


def test_fit_power_law_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_power_law([1, 2], [0.5])
    with pytest.raises(ValueError):
        fit_power_law([0, 2], [0.5, 0.7])


# --- residual_capture ------------------------------------------------------------------------


def test_residual_capture_hand_checked():
    residual = np.array([0.0, 0.4, 0.6, 0.2, 0.8])  # unnormalised: total 2
    proxy = np.array([50, 10, 20, 5, 15])  # draft counts; token 0 is the main-chain token
    curve = residual_capture(residual, proxy, exclude=0, max_f=6)
    # Alternatives by p: 2, 4, 1, 3 -> captured 0.3, 0.7, 0.9, 1.0, then flat.
    np.testing.assert_allclose(curve, [0.3, 0.7, 0.9, 1.0, 1.0, 1.0])


def test_residual_capture_never_counts_the_main_token():
    residual = np.array([0.5, 0.25, 0.25])
    proxy = np.array([0.1, 0.6, 0.3])  # token 1 is both the draft's top and the main token
    curve = residual_capture(residual, proxy, exclude=1, max_f=2)
    np.testing.assert_allclose(curve, [0.25, 0.75])  # tokens 2 then 0; token 1's mass never
    np.testing.assert_allclose(residual_capture(residual, proxy, 0, 2), [0.25, 0.5])


def test_residual_capture_ties_rank_the_lower_id_first():
    residual = np.array([0.0, 0.1, 0.9])
    curve = residual_capture(residual, np.array([3, 1, 1]), exclude=0, max_f=1)
    np.testing.assert_allclose(curve, [0.1])


def test_ranked_capture_follows_the_list_the_tree_branched_on():
    residual = np.array([0.0, 0.4, 0.6, 0.2, 0.8])  # unnormalised: total 2
    # the branched-on order, not any distribution's: 3, then 1; flat past the list's end
    np.testing.assert_allclose(ranked_capture(residual, [3, 1], max_f=4), [0.1, 0.3, 0.3, 0.3])
    np.testing.assert_allclose(ranked_capture(residual, [4, 2, 1, 3], max_f=2), [0.4, 0.7])
    np.testing.assert_allclose(ranked_capture(residual, [], max_f=2), [0.0, 0.0])


def test_residual_capture_rejects_bad_input():
    good = np.array([0.5, 0.5])
    with pytest.raises(ValueError):
        residual_capture(np.zeros(2), good, 0, 1)
    with pytest.raises(ValueError):
        residual_capture(good, np.ones(3), 0, 1)
    with pytest.raises(ValueError):
        residual_capture(good, good, 2, 1)
    with pytest.raises(ValueError):
        residual_capture(good, good, 0, 0)


# --- BranchPlanner ---------------------------------------------------------------------------


def test_planner_budget_follows_the_window_ewma():
    planner = BranchPlanner(b_max=64, tree_seconds=linear_tree_seconds)
    assert sum(planner.plan(4)) == 63  # no window yet: b_max
    expected_window = None
    for window in [0.101, 0.2, 0.04, 0.04, 0.04]:
        planner.observe_window(window)
        expected_window = (
            window if expected_window is None else 0.3 * window + 0.7 * expected_window
        )
        budget = tree_budget(64, expected_window, linear_tree_seconds, 4)
        shape = planner.plan(4)
        assert planner.stats["budget"] == budget
        assert planner.stats["window_s"] == pytest.approx(expected_window)
        assert sum(shape) == budget - 1


def test_planner_budget_grows_and_shrinks_with_the_window():
    planner = BranchPlanner(b_max=64, tree_seconds=linear_tree_seconds)
    planner.observe_window(0.101)
    assert planner.budget(4) == 46  # seeded by the first window, as tree_budget alone
    planner.observe_window(0.2)
    grown = planner.budget(4)
    for _ in range(5):
        planner.observe_window(0.03)
    assert grown > 46 > planner.budget(4) >= 1


def test_planner_without_profile_or_with_fixed_budget():
    blind = BranchPlanner(b_max=20)
    blind.observe_window(0.001)
    assert blind.budget(4) == 20  # no latency profile: no network awareness
    fixed = BranchPlanner(b_max=64, tree_seconds=linear_tree_seconds, fixed_budget=9)
    fixed.observe_window(1.0)
    assert sum(fixed.plan(4)) == 8
    with pytest.raises(ValueError):
        BranchPlanner(b_max=8, fixed_budget=9)
    with pytest.raises(ValueError):
        BranchPlanner(b_max=8, mode="bushy")


def test_planner_modes_differ_at_one_budget():
    shapes = {}
    for mode in ALLOCATION_MODES:
        planner = BranchPlanner(b_max=64, mode=mode, fixed_budget=21)
        planner.observe_round(1, 4)
        shapes[mode] = planner.plan(4)
    assert shapes["single"] == [20, 0, 0, 0]
    assert shapes["uniform"] == [5, 5, 5, 5]
    # α = 1/2, β = 1: η = √½; geometric is non-increasing but neither of the others.
    assert shapes["geometric"] == allocate_branches(20, 4, 0.5, 1.0)
    assert len({tuple(s) for s in shapes.values()}) == 3


def test_planner_alpha_is_accepted_over_tested():
    planner = BranchPlanner(b_max=8)
    assert planner.alpha == PRIOR_ALPHA
    planner.observe_round(4, 4)  # all accepted: 4 tested
    planner.observe_round(1, 4)  # 1 accepted, the 2nd rejected, 2 untested
    assert planner.alpha == pytest.approx(5 / 6)
    planner.plan(4)
    assert planner.stats["alpha"] == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        planner.observe_round(5, 4)


def test_planner_alpha_is_unbiased_on_iid_chains():
    # Per-token acceptance 0.8, γ = 4: accepted/drafted would average 0.59.
    rng = np.random.default_rng(1)
    planner = BranchPlanner(b_max=8)
    gamma, alpha = 4, 0.8
    for _ in range(4000):
        rejected = np.flatnonzero(rng.random(gamma) >= alpha)
        planner.observe_round(int(rejected[0]) if rejected.size else gamma, gamma)
    assert planner.alpha == pytest.approx(alpha, abs=0.02)


def test_planner_fits_the_mean_capture_curve():
    # Curves in pairs that err in opposite directions: each one alone fits badly, their mean per F
    # is the exact power law. The long pair covers F = 9..16 alone, so each F has its own count.
    planner = BranchPlanner(b_max=8)
    assert planner.power_law == DEFAULT_POWER_LAW
    for length in (8, 16):
        fanouts = np.arange(1, length + 1)
        tail = 0.4 * fanouts ** (-2.0)
        wobble = 0.3 * (-1.0) ** fanouts
        planner.observe_capture(1 - tail * (1 + wobble))
        planner.observe_capture(1 - tail * (1 - wobble))
    c, beta = planner.power_law
    assert c == pytest.approx(0.4, abs=1e-6)
    assert beta == pytest.approx(2.0, abs=1e-6)
    planner.plan(4)
    assert (planner.stats["c"], planner.stats["beta"]) == (c, beta)
    with pytest.raises(ValueError):
        planner.observe_capture(np.array([]))


# ----------------------------------------------------------------------------- hit model


def test_hit_probability_weighs_each_depth_by_where_rejections_land() -> None:
    """α = ½: a rejection lands at depth 0, 1, 2 with weights 1, ½, ¼; F = 2, 1, 0 alternatives
    there hold it with R(2) = ½, R(1) = ¼ and nothing."""
    hit = hit_probability(0.5, [2, 1, 0], lambda f: f / 4)
    assert hit == pytest.approx((0.5 + 0.5 * 0.25) / 1.75)
    with pytest.raises(ValueError, match="depth"):
        hit_probability(0.5, [], lambda f: 1.0)


def test_the_planner_predicts_fewer_hits_for_longer_chains_at_one_budget() -> None:
    planner = BranchPlanner(b_max=16)
    assert planner.expected_hit(4) is None  # nothing captured yet
    for _ in range(5):
        planner.observe_round(3, 4)
        planner.observe_capture(np.array([0.3, 0.55, 0.75, 0.9, 1.0]))
    hits = [planner.expected_hit(g) for g in range(2, 9)]
    assert all(h is not None for h in hits)
    # non-increasing up to the rounding of the budget into whole alternatives
    assert all(b <= a + 0.01 for a, b in itertools.pairwise(hits)) and hits[0] > hits[-1] + 0.1
    assert planner.capture(3) == pytest.approx(0.75)  # the measured mean, not the fit
    assert planner.expected_hit(4) == pytest.approx(
        hit_probability(planner.alpha, planner.plan(4), planner.capture)
    )
