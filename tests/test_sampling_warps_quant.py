"""Warps match transformers' logits processors; quantisation and integer sampling are exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from wanspec.sampling import PROB_SCALE, SamplingParams, bernoulli, quantize, sample, warp_probs
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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=64))
def test_quantize_sums_exactly_and_bounds_error(weights: list[float]) -> None:
    probs = np.asarray(weights)
    if probs.sum() <= 0:
        with pytest.raises(ValueError):
            quantize(probs)
        return
    counts = quantize(probs)
    assert counts.sum() == PROB_SCALE
    assert counts.min() >= 0 and counts.max() <= PROB_SCALE
    error = np.abs(counts / PROB_SCALE - probs / probs.sum())
    assert error.max() < 1.0 / PROB_SCALE + 1e-12


def test_quantize_keeps_one_hot_and_rejects_bad_input() -> None:
    assert quantize(np.array([0.0, 1.0, 0.0])).tolist() == [0, PROB_SCALE, 0]
    for bad in (np.array([0.5, np.nan]), np.array([-0.1, 1.1]), np.zeros((2, 2))):
        with pytest.raises(ValueError):
            quantize(bad)


def test_integer_sampler_matches_counts_chi_square() -> None:
    rng = np.random.default_rng(0)
    counts = quantize(np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0]))
    draws = np.bincount([sample(counts, rng) for _ in range(60_000)], minlength=6)
    assert draws[5] == 0
    expected = counts[:5] / PROB_SCALE * draws.sum()
    assert stats.chisquare(draws[:5], expected).pvalue > 1e-3


def test_bernoulli_is_exact_rational() -> None:
    rng = np.random.default_rng(3)
    hits = sum(bernoulli(3, 7, rng) for _ in range(70_000))
    assert abs(hits / 70_000 - 3 / 7) < 0.01
    assert bernoulli(0, 5, rng) is False and bernoulli(5, 5, rng) is True
