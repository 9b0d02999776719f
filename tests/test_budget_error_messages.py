"""AceSpec's policy math refuses bad input with the message that names the bad value, exactly.

tests/test_budget.py checks that bad input raises; the mutation run showed that a message naming
the wrong argument (`"WINDOW_S"`, `"XXmax_fXX"`) or garbling the rule passes it. A caller (the
pipeline, a bench config) sees only the message, so each is pinned here in full.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest

from wanspec.protocols.budget import (
    ALLOCATION_MODES,
    BranchPlanner,
    Ewma,
    allocate_branches,
    decay_factor,
    fit_power_law,
    geometric_shares,
    largest_remainder,
    residual_capture,
    tree_budget,
)

ONE = np.array([1.0, 2.0])

CASES: list[tuple[Callable[[], object], str]] = [
    (lambda: largest_remainder([1.0], -1), "total must be an integer >= 0, got -1"),
    (lambda: largest_remainder([1.0], True), "total must be an integer >= 0, got True"),
    (lambda: largest_remainder([], 1), "weights must be a non-empty 1-D sequence"),
    (lambda: largest_remainder([1.0, -1.0], 1), "weights must be finite and non-negative"),
    (lambda: largest_remainder([0.0], 1), "weights sum to zero: nothing to be proportional to"),
    (lambda: decay_factor("a", 1.0), "alpha must be a real number, got 'a'"),
    (lambda: decay_factor(0.5, math.inf), "beta must be finite, got inf"),
    (lambda: decay_factor(0.5, 0.0), "beta must be > 0, got 0.0"),
    (lambda: geometric_shares(3, 2, 1.0), "eta must be in (0, 1), got 1.0"),
    (lambda: geometric_shares(3, 2, math.nan), "eta must be finite, got nan"),
    (lambda: geometric_shares(3, 0, 0.5), "gamma must be an integer >= 1, got 0"),
    (lambda: geometric_shares(-1, 2, 0.5), "b_alloc must be an integer >= 0, got -1"),
    (
        lambda: allocate_branches(3, 2, 0.5, 1.0, "tree"),
        f"unknown allocation mode 'tree'; expected one of {ALLOCATION_MODES}",
    ),
    (lambda: tree_budget(0, 1.0, float, 2), "b_max must be an integer >= 1, got 0"),
    (lambda: tree_budget(4, 1.0, float, 0), "gamma must be an integer >= 1, got 0"),
    (lambda: tree_budget(4, math.nan, float, 2), "window_s must be finite, got nan"),
    (lambda: Ewma(0.0), "EWMA weight must be in (0, 1], got 0.0"),
    (lambda: Ewma(math.nan), "weight must be finite, got nan"),
    (lambda: Ewma(0.5).update(math.inf), "observation must be finite, got inf"),
    (
        lambda: fit_power_law([1, 2], [0.5]),
        "fanouts and captured must be 1-D sequences of the same length",
    ),
    (lambda: fit_power_law([0, 2], [0.5, 0.6]), "fanouts must be finite and >= 1"),
    (lambda: fit_power_law([1, 2], [0.5, math.nan]), "captured masses must be finite"),
    (
        lambda: residual_capture(ONE, np.ones(3), 0, 1),
        "residual and proxy must be 1-D arrays over the same vocabulary",
    ),
    (
        lambda: residual_capture(np.zeros(2), ONE, 0, 1),
        "residual must be finite, non-negative and not all zero",
    ),
    (lambda: residual_capture(ONE, np.array([1.0, math.nan]), 0, 1), "proxy must be finite"),
    (lambda: residual_capture(ONE, ONE, 2, 1), "exclude 2 outside the vocabulary of 2"),
    (lambda: residual_capture(ONE, ONE, -1, 1), "exclude must be an integer >= 0, got -1"),
    (lambda: residual_capture(ONE, ONE, 0, 0), "max_f must be an integer >= 1, got 0"),
    (lambda: BranchPlanner(0), "b_max must be an integer >= 1, got 0"),
    (
        lambda: BranchPlanner(4, mode="tree"),
        f"unknown allocation mode 'tree'; expected {ALLOCATION_MODES}",
    ),
    (lambda: BranchPlanner(4, fixed_budget=0), "fixed_budget must be an integer >= 1, got 0"),
    (lambda: BranchPlanner(4, fixed_budget=5), "fixed_budget 5 exceeds b_max 4"),
    (
        lambda: BranchPlanner(4).observe_window(-1.0),
        "a reply window cannot be negative, got -1.0",
    ),
    (lambda: BranchPlanner(4).observe_window(math.inf), "seconds must be finite, got inf"),
    (lambda: BranchPlanner(4).observe_round(3, 2), "accepted 3 exceeds drafted 2"),
    (lambda: BranchPlanner(4).observe_round(0, -1), "drafted must be an integer >= 0, got -1"),
    (lambda: BranchPlanner(4).observe_round(-1, 2), "accepted must be an integer >= 0, got -1"),
    (
        lambda: BranchPlanner(4).observe_capture(np.zeros(0)),
        "a capture curve is a non-empty 1-D array of R(1), R(2), ...",
    ),
]


@pytest.mark.parametrize(("call", "message"), CASES)
def test_bad_input_is_refused_with_its_exact_message(call: Callable[[], object], message: str):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_the_capture_ranking_breaks_ties_towards_the_lower_id() -> None:
    """Equal proxy values rank the lower id first (a stable sort), so the curve is defined."""
    residual = np.array([0.0, 0.1, 0.6, 0.3])
    proxy = np.array([5.0, 1.0, 1.0, 1.0])
    assert residual_capture(residual, proxy, 0, 3).tolist() == pytest.approx([0.1, 0.7, 1.0])


def test_a_zero_reply_window_is_a_valid_observation() -> None:
    """A reply may come back within the clock's resolution: a window of 0 s is data, not error."""
    planner = BranchPlanner(4)
    planner.observe_window(0.0)
    assert planner.window.value == 0.0
