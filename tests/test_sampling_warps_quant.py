"""Warps match transformers' logits processors (quantize, sample and bernoulli: exact tests in
test_sampling_quant_exact.py)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from wanspec.sampling import SamplingParams, warp_probs
from wanspec.sampling.warps import warp_logits


def transformers_warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    chain = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k:
        chain.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        chain.append(TopPLogitsWarper(params.top_p))
    return chain(torch.zeros((logits.shape[0], 1), dtype=torch.long), logits)


WARP_SETTINGS = [
    SamplingParams(1.0),
    SamplingParams(0.7, top_k=5),
    SamplingParams(1.3, top_p=0.9),
    SamplingParams(0.5, top_k=40, top_p=0.8),
    SamplingParams(2.0, top_k=1),
    SamplingParams(1.0, top_p=0.05),
]


@pytest.mark.parametrize("params", WARP_SETTINGS, ids=str)
def test_warps_equal_transformers_processors(params: SamplingParams) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 300, generator=gen) * 3
    logits[:, :4] = logits[:, 4:8]  # ties, to exercise the top-k tie rule
    ours = warp_logits(logits, params)
    theirs = transformers_warp(logits.clone(), params)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert torch.equal(ours[finite], theirs[finite])


def test_greedy_is_one_hot_first_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, -1.0]])
    probs = warp_probs(logits, SamplingParams(0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert probs.dtype == torch.float64


def test_greedy_has_no_logits_warp() -> None:
    """Temperature 0 must go through warp_probs' argmax, never divide the logits by zero."""
    with pytest.raises(ValueError, match=r"^temperature 0 is greedy and has no logits warp"):
        warp_logits(torch.zeros(1, 3), SamplingParams(0.0))


@pytest.mark.parametrize("top_p,kept", [(0.5, 2), (0.75, 3)])
def test_top_p_drops_a_tail_of_mass_exactly_one_minus_p(top_p: float, kept: int) -> None:
    """Four equal logits: the tail masses 0.25, 0.5, 0.75 are exact in float32, so the boundary
    (`<=`, as transformers has it) decides how many survive."""
    logits = torch.zeros(1, 4)
    ours = warp_logits(logits, SamplingParams(1.0, top_p=top_p))
    assert int(torch.isfinite(ours).sum()) == kept
    theirs = transformers_warp(logits.clone(), SamplingParams(1.0, top_p=top_p))
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))


BATCH_SETTINGS = [
    SamplingParams(0.0),
    SamplingParams(0.8, top_k=3, top_p=0.9),
    SamplingParams(1.0, min_p=0.3),
]


@pytest.mark.parametrize("params", BATCH_SETTINGS, ids=str)
def test_warp_probs_works_row_wise_on_any_batch_shape(params: SamplingParams) -> None:
    """One row alone, a batch of rows and a batch of batches give the same float64 rows."""
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(2, 3, 7, generator=gen)
    batched = warp_probs(rows, params)
    assert batched.dtype == torch.float64 and batched.shape == rows.shape
    torch.testing.assert_close(batched.sum(dim=-1), torch.ones(2, 3, dtype=torch.float64))
    torch.testing.assert_close(warp_probs(rows[1], params), batched[1], rtol=0, atol=0)
    torch.testing.assert_close(warp_probs(rows[1, 2], params), batched[1, 2], rtol=0, atol=0)
    as_double = warp_probs(rows.to(torch.float64), params)  # float32 arithmetic, as transformers
    torch.testing.assert_close(as_double, batched, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"temperature": math.nan},
        {"top_k": -2},
        {"top_k": 1.5},
        {"top_p": 0.0},
        {"top_p": 1.2},
    ],
)
def test_bad_sampling_params_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
