"""A draft row reshaped to aim at its cache (`DraftRow.reshaped`): the counts of its top tokens
scaled by a factor and renormalised to the 16-bit scale, the support, logits and ranking kept."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wanspec.sampling import PROB_SCALE, SamplingParams
from wanspec.sampling.draft import draft_row, draft_rows
from wanspec.sampling.proposal import DraftRow

WARPS = [
    SamplingParams(),
    SamplingParams(temperature=1.3),
    SamplingParams(temperature=0.8, top_k=6),
    SamplingParams(top_p=0.9),
]


def _logits(width: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(0, scale, width).astype(np.float32))


def _top(row: DraftRow, top: int) -> np.ndarray:
    """Positions (in `row.ids`) of the `top` highest-logit candidates, ties to the lower id."""
    return np.array(sorted(range(len(row.ids)), key=lambda i: (-row.logits[i], row.ids[i]))[:top])


@pytest.mark.parametrize("params", WARPS, ids=repr)
@pytest.mark.parametrize(("top", "factor"), [(1, 0.5), (4, 0.25), (8, 0.7), (2, 1e-3)])
def test_the_top_tokens_lose_a_factor_against_the_rest(
    params: SamplingParams, top: int, factor: float
) -> None:
    row = draft_row(_logits(3000, seed=top), params, ranks=8)
    new = row.reshaped(top, factor)
    assert new.counts.dtype == np.int64 and int(new.counts.sum()) == PROB_SCALE
    np.testing.assert_array_equal(new.counts > 0, row.counts > 0)  # the support is kept
    assert new.ids is row.ids and new.logits is row.logits and new.width == row.width
    assert new.ranked(8, -1) == row.ranked(8, -1)
    at = np.zeros(len(row.ids), dtype=bool)
    at[_top(row, top)] = True
    old_top, new_top = row.counts[at].sum(), new.counts[at].sum()
    old_rest, new_rest = row.counts[~at].sum(), new.counts[~at].sum()
    assert old_top > 0
    if old_rest == 0:  # the whole support is on top: one factor on all of it changes nothing
        assert np.abs(new.counts - row.counts).max() <= 2
        return
    # each count is one (kept for the support) plus its largest-remainder share of the rest
    support = row.counts > 0
    weights = np.where(at, factor, 1.0) * row.counts
    exact = support + weights * (PROB_SCALE - support.sum()) / weights.sum()
    assert np.abs(new.counts - exact).max() < 1.0
    if factor >= 0.25:  # so the odds of the top tokens against the rest shrink by the factor
        ratio = (new_top / new_rest) / (old_top / old_rest)
        assert ratio == pytest.approx(factor, rel=0.03)


def test_factor_one_is_the_row_itself() -> None:
    row = draft_row(_logits(500, seed=3), SamplingParams())
    assert row.reshaped(4, 1.0) is row
    assert row.reshaped(4, 1) is row


def test_every_token_of_the_support_keeps_a_count() -> None:
    """A top token with a single count stays proposable whatever the factor: the support, and
    so what the draft may propose and report, never changes."""
    counts = np.array([1, 1, PROB_SCALE - 4, 1, 1], dtype=np.int64)
    logits = np.array([5.0, 4.0, 3.0, 2.0, -1.0])  # ids 0 and 1 rank first, with one count each
    row = DraftRow(np.arange(5) * 10, counts, logits, 50)
    new = row.reshaped(2, 1e-6)
    assert list(new.counts[:2]) == [1, 1] and new.counts[2:].min() >= 1
    assert int(new.counts.sum()) == PROB_SCALE
    with_zero = DraftRow(np.arange(3), np.array([0, 65000, 535]), np.array([9.0, 1.0, 0.0]), 3)
    np.testing.assert_array_equal(with_zero.reshaped(2, 0.5).counts > 0, [False, True, True])


def test_ties_in_the_logits_go_to_the_lower_id_as_in_the_ranking() -> None:
    counts = np.array([21845, 21845, 21845], dtype=np.int64)
    row = DraftRow(np.array([3, 7, 9]), counts, np.array([1.0, 1.0, 1.0]), 10)
    assert row.ranked(1, -1) == [3]
    new = row.reshaped(1, 0.5)
    assert new.counts[0] < new.counts[1] == new.counts[2]
    assert int(new.counts.sum()) == PROB_SCALE


def test_greedy_and_whole_support_rows_keep_their_law() -> None:
    """Scaling every token of the support by one factor changes nothing but the rounding."""
    greedy = draft_row(_logits(400, seed=5), SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(greedy.reshaped(4, 0.1).counts, greedy.counts)
    narrow = draft_row(_logits(400, seed=6), SamplingParams(top_k=3))
    assert np.abs(narrow.reshaped(3, 0.3).counts - narrow.counts).max() <= 2


def test_a_row_reshapes_alike_alone_and_inside_a_tree_pass_block() -> None:
    block = torch.stack([_logits(2000, seed=s) for s in range(5)])
    params = SamplingParams(temperature=1.1)
    together = draft_rows(block, params, ranks=4)
    for i in range(5):
        alone = draft_row(block[i], params, ranks=4).reshaped(3, 0.4)
        np.testing.assert_array_equal(together[i].reshaped(3, 0.4).counts, alone.counts)


@pytest.mark.parametrize(
    ("top", "factor"),
    [(0, 0.5), (-1, 0.5), (1.5, 0.5), (True, 0.5), (2, 0.0), (2, -0.5), (2, 1.5), (2, math.nan)],
)
def test_bad_arguments_are_refused(top: object, factor: float) -> None:
    row = draft_row(_logits(300, seed=7), SamplingParams())
    with pytest.raises(ValueError, match=r"^(top|factor) must"):
        row.reshaped(top, factor)  # type: ignore[arg-type]
