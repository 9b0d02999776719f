"""A model job's logits rows as a machine gets them (`TorchLogitRows`): every law it answers is
the sampling floor's own function of the same row, bit for bit, and its rows are its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wanspec.sampling import SamplingParams
from wanspec.sampling.draft import draft_rows
from wanspec.sampling.logits import TorchLogitRows
from wanspec.sampling.target import target_probs

WIDTH = 300


@pytest.fixture
def block() -> torch.Tensor:
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(3)) * 3


def test_target_probs_at_a_row_is_the_target_law_of_that_row(block: torch.Tensor) -> None:
    rows = TorchLogitRows(block)
    valid = np.ones(WIDTH, dtype=bool)
    valid[-7:] = False  # padding rows of the vocabulary
    params = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3)
    for i in range(len(rows)):
        expected = target_probs(block[i], params, valid, [1, 2, i])
        assert np.array_equal(rows.target_probs(i, params, valid, [1, 2, i]), expected)


def test_draft_rows_and_the_last_row_are_the_draft_law_of_those_rows(block: torch.Tensor) -> None:
    rows = TorchLogitRows(block)
    params = SamplingParams(temperature=1.2, top_k=40)
    allowed = np.arange(WIDTH) % 3 != 0
    got = rows.draft_rows(params, allowed=allowed, to_ids=None, width=None, ranks=4)
    expected = draft_rows(block, params, allowed=allowed, ranks=4)
    for a, b in zip(got, expected, strict=True):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.counts, b.counts)
    last = rows.last().draft_rows(params, allowed=allowed, to_ids=None, width=None, ranks=4)
    assert len(last) == 1 and np.array_equal(last[0].counts, expected[-1].counts)
    assert np.array_equal(rows.last().numpy(), block[-1:].numpy())


def test_pieces_join_in_order_and_a_copy_is_its_own(block: torch.Tensor) -> None:
    pieces = [TorchLogitRows(block[:1]), TorchLogitRows(block[1:3]), TorchLogitRows(block[3:])]
    joined = TorchLogitRows.concat(pieces)
    assert len(joined) == 4 and np.array_equal(joined.numpy(), block.numpy())
    with torch.inference_mode():
        made = TorchLogitRows(block.clone())
    copy = made.copy()
    assert copy.block.is_inference() and copy.nbytes == block.numel() * 4
    with torch.inference_mode():
        copy.block.zero_()
    assert np.array_equal(made.numpy(), block.numpy())


def test_rows_must_be_a_two_dimensional_block() -> None:
    with pytest.raises(ValueError, match=r"\[rows, V\]"):
        TorchLogitRows(torch.zeros(WIDTH))
