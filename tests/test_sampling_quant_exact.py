"""The integer primitives, checked exactly: every rng outcome on small denominators.

`bernoulli`, `sample`, `accept_token` and `verify_chain` are run once per outcome of each draw
(tests/exact_rng.py), so their laws are compared as fractions: a `<=` for a `<`, an off-by-one
in the search side or a draw wasted on a certain outcome fails deterministically. `quantize` is
checked against hand-computed largest-remainder roundings and by the properties that define it.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exact_rng import ScriptedRng, exact_law, normalised
from wanspec.sampling import (
    PROB_SCALE,
    SamplingParams,
    accept_token,
    bernoulli,
    quantize,
    sample,
    target_counts,
    verify_chain,
    warp_probs,
)

# ----------------------------------------------------------------------------- bernoulli


@pytest.mark.parametrize("denominator", range(1, 8))
def test_bernoulli_law_is_exactly_the_clipped_ratio(denominator: int) -> None:
    for numerator in range(-1, denominator + 2):
        p = min(max(Fraction(numerator, denominator), Fraction(0)), Fraction(1))
        law = exact_law(lambda rng, n=numerator: bernoulli(n, denominator, rng))
        assert law == {k: v for k, v in {True: p, False: 1 - p}.items() if v}, numerator


@pytest.mark.parametrize("numerator,denominator", [(0, 5), (-3, 5), (5, 5), (9, 5), (1, 1)])
def test_bernoulli_draws_nothing_when_the_outcome_is_certain(
    numerator: int, denominator: int
) -> None:
    """Greedy decoding must consume no randomness; certain outcomes are returned as bools."""
    rng = ScriptedRng()
    assert bernoulli(numerator, denominator, rng) is (numerator > 0)
    assert rng.draws == []


def test_bernoulli_is_one_uniform_below_the_ratio_with_a_strict_boundary() -> None:
    """With numpy's generator: True iff u·denominator < numerator for u = rng.random()."""
    u = np.random.default_rng(7).random()
    at = u * 7.0
    assert bernoulli(at, 7.0, np.random.default_rng(7)) is False  # u·7 < u·7 is false
    assert bernoulli(np.nextafter(at, np.inf), 7.0, np.random.default_rng(7)) is True
    rng = ScriptedRng([0])
    assert bernoulli(3, 7, rng) is True and rng.draws == [2]  # one two-way draw


# ----------------------------------------------------------------------------- sample

SAMPLE_CASES = [
    [1],
    [3, 1],
    [0, 2, 0, 1, 4, 0],  # zeros first, between and last
    [5, 0, 0, 0],
    [0, 0, 0, 7],
    [1, 1, 1, 1, 1],
]


@pytest.mark.parametrize("counts", SAMPLE_CASES, ids=str)
def test_sample_law_is_exactly_counts_over_total(counts: list[int]) -> None:
    arr = np.array(counts, dtype=np.int64)
    assert exact_law(lambda rng: sample(arr, rng)) == normalised(counts)


def test_sample_draws_once_from_the_total_and_maps_each_value() -> None:
    counts = np.array([0, 2, 0, 1, 3])
    picks = []
    for value in range(6):
        rng = ScriptedRng([value])
        picks.append(sample(counts, rng))
        assert rng.draws == [6]
    assert picks == [1, 1, 3, 4, 4, 4]
    assert all(isinstance(x, int) for x in picks)


def test_sample_rejects_an_all_zero_distribution() -> None:
    with pytest.raises(ValueError, match=r"^cannot sample from an all-zero distribution$"):
        sample(np.zeros(3, np.int64), ScriptedRng())


# ----------------------------------------------------------------------------- accept / verify


@pytest.mark.parametrize("target,draft", [(0, 4), (1, 4), (3, 4), (4, 4), (6, 4), (2, 3)])
def test_accept_token_law_is_min_one_q_over_p(target: int, draft: int) -> None:
    p = min(Fraction(target, draft), Fraction(1))
    law = exact_law(lambda rng: accept_token(target, draft, rng))
    assert law == {k: v for k, v in {True: p, False: 1 - p}.items() if v}


def test_accept_token_refuses_a_token_the_draft_could_not_draw() -> None:
    with pytest.raises(ValueError, match="positive draft"):
        accept_token(3, 0, ScriptedRng())


def test_verify_chain_law_stops_at_the_first_rejection() -> None:
    tokens, drafts = [0, 2, 1], [4, 2, 3]
    # q(x)/p(x) per position: 2/4, 1/2, 3/3 (certain, no draw); the fourth row is the bonus q
    dists = [np.array([2, 1, 1]), np.array([0, 1, 1]), np.array([1, 3, 0]), np.array([1, 1, 2])]
    law = exact_law(lambda rng: verify_chain(tokens, drafts, dists, rng))
    assert law == {0: Fraction(1, 2), 1: Fraction(1, 4), 3: Fraction(1, 4)}


def test_verify_chain_skips_unverified_tokens_without_drawing() -> None:
    dists = [np.array([0, 4]), np.array([4, 0]), np.array([1, 3])]
    rng = ScriptedRng()
    assert verify_chain([0, 0], [4, 4], dists, rng, unverified=[True, False]) == 2
    assert rng.draws == []  # q = p at position 1: certain, no draw
    assert verify_chain([0, 1], [4, 4], dists, ScriptedRng(), unverified=[True, False]) == 1
    assert verify_chain([0, 1], [4, 4], dists, ScriptedRng(), unverified=[False, True]) == 0


def test_verify_chain_accepts_everything_with_the_bonus_distribution_present() -> None:
    dists = [np.array([5, 0]), np.array([0, 5]), np.array([2, 3])]
    assert verify_chain([0, 1], [5, 5], dists, ScriptedRng()) == 2
    assert verify_chain([0, 1], [5, 5], dists[:2], ScriptedRng()) == 2  # no bonus row: fine
    assert verify_chain([], [], dists[:1], ScriptedRng()) == 0


@pytest.mark.parametrize(
    "tokens,drafts,n_dists", [([1, 2], [3], 3), ([1, 2], [3, 3], 1), ([1], [3, 3], 2)]
)
def test_verify_chain_rejects_misaligned_inputs(
    tokens: list[int], drafts: list[int], n_dists: int
) -> None:
    dists = [np.array([1, 1, 1])] * n_dists
    with pytest.raises(ValueError, match=r"^tokens, draft_probs and target_dists do not line up$"):
        verify_chain(tokens, drafts, dists, ScriptedRng())


# ----------------------------------------------------------------------------- quantize

HAND_CHECKED = [
    # 65535·(1/2, 1/4, 1/4) = 32767.5, 16383.75, 16383.75: deficit 2 goes to the two .75s
    ([0.5, 0.25, 0.25], [32767, 16384, 16384]),
    # 65535/7 · (1, 2, 0, 4) = 9362.14, 18724.29, 0, 37448.57: deficit 1 goes to the .57
    ([1, 2, 0, 4], [9362, 18724, 0, 37449]),
    # thirds: 21845 each exactly (65535 = 3 · 21845), whatever the float rounding of 1/3
    ([1, 1, 1], [21845, 21845, 21845]),
    ([0, 1, 1, 1, 0], [0, 21845, 21845, 21845, 0]),
    # 65535/7 · (5, 0, 2) = 46810.71, 0, 18724.29: deficit 1 goes to id 0
    ([5, 0, 2], [46811, 0, 18724]),
    ([3, 0, 0, 0], [PROB_SCALE, 0, 0, 0]),
    ([2e-6, 1.0], [0, PROB_SCALE]),  # 0.13 of a count: rounds to zero
    ([1e-5, 1.0], [1, 65534]),  # 0.655 beats 0.345
]


@pytest.mark.parametrize("probs,expected", HAND_CHECKED, ids=str)
def test_quantize_is_largest_remainder_on_hand_checked_vectors(
    probs: list[float], expected: list[int]
) -> None:
    counts = quantize(np.array(probs, dtype=np.float64))
    assert counts.tolist() == expected
    assert counts.dtype == np.int64


def test_quantize_accepts_torch_and_unnormalised_weights() -> None:
    weights = [1, 2, 0, 4]
    expected = [9362, 18724, 0, 37449]
    assert quantize(torch.tensor(weights, dtype=torch.float32)).tolist() == expected
    assert quantize(np.array(weights) * 1e-3).tolist() == expected
    assert quantize([0.0, 5.0]).tolist() == [0, PROB_SCALE]


@pytest.mark.parametrize(
    "bad,message",
    [
        (np.array([0.5, np.nan]), "^probabilities must be finite and non-negative$"),
        (np.array([0.5, np.inf]), "^probabilities must be finite"),
        (np.array([-0.1, 1.1]), "^probabilities must be finite and non-negative$"),
        (np.zeros(3), "^probabilities sum to zero$"),
        (np.zeros((2, 2)), "^quantize expects a non-empty 1-D probability vector$"),
        (np.zeros(0), "^quantize expects a non-empty 1-D"),
        (np.float64(1.0), "^quantize expects a non-empty 1-D"),
    ],
)
def test_quantize_rejects_bad_input_with_a_clear_message(bad: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quantize(bad)


WEIGHTS = st.lists(
    st.one_of(st.just(0.0), st.floats(1e-9, 1e6, allow_nan=False)), min_size=1, max_size=48
).filter(lambda w: sum(w) > 0)


@settings(max_examples=300, deadline=None)
@given(WEIGHTS)
def test_quantize_is_largest_remainder_and_zero_stays_zero(weights: list[float]) -> None:
    """The defining properties: total 65535, zeros exactly zero, floor or ceil of the exact
    share, and every count rounded up had a remainder at least as large as any rounded down."""
    probs = np.asarray(weights)
    counts = quantize(probs)
    scaled = probs / probs.sum() * PROB_SCALE
    assert counts.sum() == PROB_SCALE
    assert np.all(counts[probs == 0] == 0)
    floors = np.floor(scaled)
    assert np.all((counts == floors) | (counts == floors + 1))
    remainder = scaled - floors
    up, down = counts > floors, (counts == floors) & (probs > 0)
    if up.any() and down.any():
        assert remainder[up].min() >= remainder[down].max() - 1e-9


# ----------------------------------------------------------------------------- target_counts


def test_target_counts_masks_padding_then_warps_then_quantizes() -> None:
    """Padding ids (valid False) get exactly 0 even with the largest logit; the rest is the warp
    of the valid logits, quantised; greedy picks the best valid id; `valid` is left untouched."""
    logits = torch.tensor([1.0, 3.0, 0.5, 9.0, 2.0], dtype=torch.float64)
    valid = np.array([True, True, True, False, True])
    params = SamplingParams(0.7, top_k=3)
    counts = target_counts(logits, params, valid)
    masked = torch.tensor([[1.0, 3.0, 0.5, -np.inf, 2.0]])
    assert counts.tolist() == quantize(warp_probs(masked, params)[0]).tolist()
    assert counts[3] == 0 and counts[2] == 0 and counts.sum() == PROB_SCALE  # top-3 of valid
    assert target_counts(logits, SamplingParams(0.0), valid).tolist() == [0, PROB_SCALE, 0, 0, 0]
    assert valid.tolist() == [True, True, True, False, True]


def test_target_counts_applies_the_repetition_penalty_to_the_context() -> None:
    logits = torch.tensor([2.0, 1.9, 0.0])
    valid = np.ones(3, dtype=bool)
    params = SamplingParams(0.0, repetition_penalty=2.0)
    assert target_counts(logits, params, valid, prev_ids=[0]).tolist() == [0, PROB_SCALE, 0]
    assert target_counts(logits, params, valid, prev_ids=[2]).tolist() == [PROB_SCALE, 0, 0]
    with pytest.raises(ValueError, match="needs prev_ids"):
        target_counts(logits, params, valid)


def test_quantize_is_largest_remainder_at_vocabulary_scale() -> None:
    """20,000 ids (numpy's partition works differently on long arrays than on short ones)."""
    probs = np.random.default_rng(4).dirichlet(np.full(20_000, 0.3))
    counts = quantize(probs)
    scaled = probs * PROB_SCALE
    floors = np.floor(scaled)
    up = counts > floors
    assert counts.sum() == PROB_SCALE and np.all(counts - floors <= 1)
    assert (scaled - floors)[up].min() >= (scaled - floors)[~up].max() - 1e-9


def test_quantize_computes_in_float64_whatever_the_input_precision() -> None:
    probs = np.random.default_rng(5).dirichlet(np.ones(1000)).astype(np.float32)
    assert quantize(probs).tolist() == quantize(probs.astype(np.float64)).tolist()
    assert quantize(torch.from_numpy(probs)).tolist() == quantize(probs.astype(np.float64)).tolist()
