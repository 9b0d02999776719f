"""The draft's proposal law over its candidates (`wanspec.sampling.draft`), against brute force
over the whole row: the same law where the row is small, the top candidates where it is not, never
a token the draft may not propose, and tree alternatives that are the row's own top-F."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wanspec.sampling import PROB_SCALE, SamplingParams, quantize, warp_probs
from wanspec.sampling.draft import MAX_CANDIDATES, EmptyDraftRowError, draft_row, draft_rows
from wanspec.sampling.quant import quantize_rows

WARPS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(top_p=0.8),
    SamplingParams(min_p=0.05),
    SamplingParams(temperature=0.0),
]


def _row(width: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(0, scale, width).astype(np.float32))


@pytest.mark.parametrize("params", WARPS, ids=repr)
def test_a_row_narrower_than_the_candidates_keeps_the_full_law_bit_for_bit(
    params: SamplingParams,
) -> None:
    row = _row(200, seed=1)
    full = quantize(warp_probs(row.unsqueeze(0), params)[0])
    got = draft_row(row, params)
    np.testing.assert_array_equal(got.dense(), full)
    assert got.dense().sum() == PROB_SCALE
    assert [got.count(t) for t in range(200)] == list(full)


@pytest.mark.parametrize("params", WARPS[:4], ids=repr)
def test_a_wide_row_proposes_from_its_top_candidates_with_their_own_law(
    params: SamplingParams,
) -> None:
    row = _row(5000, seed=2)
    top = torch.topk(row, MAX_CANDIDATES).indices.sort().values
    expected = np.zeros(5000, dtype=np.int64)
    expected[top.numpy()] = quantize(warp_probs(row[top].unsqueeze(0), params)[0])
    got = draft_row(row, params)
    np.testing.assert_array_equal(got.dense(), expected)
    assert len(got.ids) == MAX_CANDIDATES and np.all(np.diff(got.ids) > 0)


def test_a_larger_top_k_widens_the_candidates() -> None:
    row = _row(5000, seed=3)
    got = draft_row(row, SamplingParams(top_k=400))
    assert len(got.ids) == 400


def test_a_draw_is_the_counts_law_and_reports_its_own_count() -> None:
    row = _row(40, seed=4, scale=1.0)
    got = draft_row(row, SamplingParams())
    rng = np.random.default_rng(0)
    draws = np.array([got.draw(rng) for _ in range(40_000)])
    freq = np.bincount(draws, minlength=40) / len(draws)
    np.testing.assert_allclose(freq, got.dense() / PROB_SCALE, atol=0.01)
    assert all(got.count(int(t)) > 0 for t in np.unique(draws))


def test_tokens_the_draft_may_not_propose_are_never_candidates() -> None:
    """TLI: the row's top tokens outside the common vocabulary are dropped, and when none of
    the top candidates is allowed the candidates are the best allowed ones."""
    row = _row(1000, seed=5)
    allowed = np.ones(1000, dtype=bool)
    allowed[torch.topk(row, 10).indices.numpy()] = False
    got = draft_row(row, SamplingParams(), allowed=allowed)
    assert allowed[got.ids].all() and len(got.ids) == MAX_CANDIDATES - 10
    only_low = np.zeros(1000, dtype=bool)
    only_low[torch.topk(-row, 3).indices.numpy()] = True  # the three lowest logits
    got = draft_row(row, SamplingParams(), allowed=only_low)
    assert sorted(got.ids) == sorted(np.flatnonzero(only_low)) and got.dense().sum() == PROB_SCALE


def test_a_row_with_nothing_to_propose_is_refused() -> None:
    row = _row(50, seed=6)
    with pytest.raises(EmptyDraftRowError):
        draft_row(row, SamplingParams(), allowed=np.zeros(50, dtype=bool))
    with pytest.raises(EmptyDraftRowError):
        draft_row(torch.full((50,), float("-inf")), SamplingParams())


def test_ids_are_mapped_to_the_protocols_ids_and_kept_ascending() -> None:
    row = _row(300, seed=7)
    to_ids = np.random.default_rng(1).permutation(1000)[:300]
    got = draft_row(row, SamplingParams(), to_ids=to_ids, width=1000)
    assert np.all(np.diff(got.ids) > 0) and got.dense().shape == (1000,)
    best = int(torch.argmax(row))
    assert got.count(int(to_ids[best])) == got.dense().max()


@pytest.mark.parametrize("few", [False, True], ids=["many candidates", "few allowed"])
def test_alternatives_are_the_rows_own_top_f_of_allowed_tokens(few: bool) -> None:
    """Ranked from the candidates when they are enough, from the row itself when the allowed
    ones among the top candidates are too few: the same list as a top-k over the whole row."""
    width, limit = 3000, 8
    row = _row(width, seed=8)
    allowed = np.ones(width, dtype=bool)
    if few:  # all but 3 of the top 256 logits are not allowed
        allowed[torch.topk(row, MAX_CANDIDATES).indices.numpy()[3:]] = False
    got = draft_row(row, SamplingParams(), allowed=allowed, ranks=limit)
    exclude = int(got.ids[np.argmax(got.counts)])
    masked = row.masked_fill(~torch.from_numpy(allowed), float("-inf"))
    brute = [int(i) for i in torch.topk(masked, limit + 1).indices if int(i) != exclude][:limit]
    assert got.ranked(limit, exclude) == brute
    assert (got.source is not None) == few  # the row is kept only when it may be needed


@pytest.mark.parametrize("params", WARPS, ids=repr)
def test_a_row_gets_the_same_law_alone_and_inside_a_tree_pass_block(params: SamplingParams) -> None:
    """A tree node's token must be the token a redraft of the same row would draw (the keyed
    streams rely on it): each row of a block gets, bit for bit, the law it gets alone, whatever
    the other rows hold, including rows whose top candidates are all disallowed."""
    width = 3000
    block = torch.stack([_row(width, seed=20 + i, scale=1.0 + i) for i in range(6)])
    allowed = np.ones(width, dtype=bool)
    allowed[torch.topk(block[2], 300).indices.numpy()] = False  # row 2: no top candidate allowed
    to_ids = np.random.default_rng(3).permutation(2 * width)[:width]
    kwargs = {"allowed": allowed, "to_ids": to_ids, "width": 2 * width, "ranks": 4}
    together = draft_rows(block, params, **kwargs)
    for i, got in enumerate(together):
        alone = draft_row(block[i], params, **kwargs)
        np.testing.assert_array_equal(got.ids, alone.ids)
        np.testing.assert_array_equal(got.counts, alone.counts)
        np.testing.assert_array_equal(got.logits, alone.logits)
        assert got.counts.sum() == PROB_SCALE and np.isin(got.ids, to_ids[allowed]).all()


def test_rows_are_rounded_as_quantize_rounds_each_one() -> None:
    rng = np.random.default_rng(9)
    probs = rng.dirichlet(np.full(40, 0.3), size=50)
    probs[:, ::7] = 0.0
    counts = quantize_rows(probs, PROB_SCALE)
    for row, got in zip(probs, counts, strict=True):
        np.testing.assert_array_equal(got, quantize(row, PROB_SCALE))
    assert (counts[:, ::7] == 0).all()
