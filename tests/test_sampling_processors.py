"""Context-dependent sampling (repetition penalty, min-p) equals transformers' own processors.

transformers' chain is taken from `model._get_logits_processor`, the very list `generate` builds,
so both the order of the processors and each one's arithmetic are checked (bitwise).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfgenerate import generate_processors, tiny_causal_lm
from wanspec.sampling import SamplingParams, warp_logits, warp_probs

VOCAB = 300


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    return tiny_causal_lm(VOCAB)


def random_case(seed: int, rows: int = 12) -> tuple[torch.Tensor, list[list[int]]]:
    """Logits with ties (before and after the penalty) and contexts of varied length: empty,
    repeated ids, ids beyond the logits width (which transformers ignores)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=gen) * 3
    logits[:, :4] = logits[:, 4:8]  # ties, for the top-k tie rule and first-argmax
    logits[:, 8:12] = -logits[:, 12:16]  # +x and -x: the penalty treats the signs differently
    contexts = []
    for row in range(rows):
        n = int(torch.randint(0, 60, (1,), generator=gen)) if row else 0
        ids = torch.randint(0, VOCAB + 20, (n,), generator=gen).tolist()
        contexts.append(ids + ids[: n // 3])
    return logits, contexts


def transformers_rows(
    processors: LogitsProcessorList, logits: torch.Tensor, contexts: list[list[int]]
) -> torch.Tensor:
    """Each row processed as generate processes it: one sequence, its own input_ids."""
    out = [
        processors(torch.tensor([ids], dtype=torch.long), logits[row : row + 1].clone())
        for row, ids in enumerate(contexts)
    ]
    return torch.cat(out)


def assert_same_warp(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert torch.equal(ours[finite], theirs[finite])


SAMPLED = [
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.6, "temperature": 0.8},
    {"min_p": 0.1},
    {"min_p": 0.3, "top_k": 10},
    {"min_p": 1.0},
    {"top_p": 0.6, "min_p": 0.2},
    {"temperature": 0.5, "top_k": 40, "top_p": 0.8, "min_p": 0.05, "repetition_penalty": 1.2},
    {"temperature": 2.0, "top_k": 1, "repetition_penalty": 1.5},
    {"temperature": 1.3, "top_p": 0.9, "repetition_penalty": 2.0, "min_p": 0.02},
]


@pytest.mark.parametrize("settings", SAMPLED, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_warp_equals_generate_processors(
    hf_model: torch.nn.Module, settings: dict, seed: int
) -> None:
    full = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **settings}
    processors = generate_processors(hf_model, GenerationConfig(do_sample=True, **full))
    logits, contexts = random_case(seed)
    ours = warp_logits(logits, SamplingParams(**full), prev_ids=contexts)
    assert_same_warp(ours, transformers_rows(processors, logits, contexts))


@pytest.mark.parametrize("penalty", [1.0, 1.3, 0.5, 3.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_greedy_is_argmax_of_penalised_logits(
    hf_model: torch.nn.Module, penalty: float, seed: int
) -> None:
    config = GenerationConfig(do_sample=False, repetition_penalty=penalty)
    logits, contexts = random_case(seed)
    theirs = transformers_rows(generate_processors(hf_model, config), logits, contexts)
    probs = warp_probs(logits, SamplingParams(0.0, repetition_penalty=penalty), contexts)
    assert torch.equal(probs.argmax(dim=-1), theirs.argmax(dim=-1))
    assert torch.equal(probs.sum(dim=-1), torch.ones(len(contexts), dtype=torch.float64))
    assert int((probs > 0).sum()) == len(contexts)


def test_penalty_moves_greedy_choice_off_a_repeated_token() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    params = SamplingParams(0.0, repetition_penalty=1.2)
    assert warp_probs(logits, params, [[0]]).argmax().item() == 1
    assert warp_probs(logits, params, [[2]]).argmax().item() == 0


def test_sampled_probs_are_the_softmax_of_the_warp() -> None:
    logits, contexts = random_case(5)
    params = SamplingParams(0.7, top_k=30, min_p=0.05, repetition_penalty=1.4)
    probs = warp_probs(logits, params, contexts)
    expected = warp_logits(logits, params, contexts).to(torch.float64).softmax(dim=-1)
    assert torch.equal(probs, expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_p": -0.1},
        {"min_p": 1.5},
        {"min_p": math.nan},
        {"min_p": True},
        {"repetition_penalty": 0.0},
        {"repetition_penalty": -1.2},
        {"repetition_penalty": math.inf},
        {"repetition_penalty": "1.1"},
    ],
)
def test_bad_new_sampling_params_name_the_setting(kwargs: dict) -> None:
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_context_is_required_and_checked() -> None:
    logits = torch.zeros((2, 5))
    params = SamplingParams(repetition_penalty=1.2)
    with pytest.raises(ValueError, match="prev_ids"):
        warp_probs(logits, params)
    with pytest.raises(ValueError, match="2 logits rows"):
        warp_probs(logits, params, [[1]])
    with pytest.raises(ValueError, match="negative"):
        warp_probs(logits, params, [[1], [-3]])
    with pytest.raises(TypeError, match="prev_ids"):
        warp_probs(logits, params, [[1], [0.5]])
    # no penalty: the context is not needed and not looked at
    assert torch.equal(
        warp_probs(logits, SamplingParams()), torch.full((2, 5), 0.2, dtype=torch.float64)
    )
