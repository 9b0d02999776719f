"""A target's generation_config becomes the sampling transformers' generate would use."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GenerationConfig,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hfgenerate import generate_processors, tiny_causal_lm
from wanspec.models.generation import sampling_defaults, unsupported_generation_settings
from wanspec.sampling import SamplingParams, warp_logits, warp_probs

VOCAB = 200
COVERED = (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
)


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    return tiny_causal_lm(VOCAB)


def model_processors(model: torch.nn.Module, config: GenerationConfig) -> tuple[object, list]:
    """What `model.generate(ids)` does with no arguments once `config` is the model's own."""
    model.generation_config = config
    prepared, _ = model._prepare_generation_config(None)
    return prepared, generate_processors(model)


CONFIGS = [
    GenerationConfig(),
    GenerationConfig(do_sample=True),
    GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.1),
    GenerationConfig(do_sample=False, temperature=0.7, top_p=0.5, repetition_penalty=1.2),
    GenerationConfig(do_sample=True, top_k=0, min_p=0.1, temperature=1.5),
    GenerationConfig(do_sample=True, top_k=5, repetition_penalty=0.8),
    GenerationConfig.from_dict({"do_sample": True, "temperature": 0.6, "top_p": 0.95}),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.to_json_string(use_diff=True))
def test_defaults_reproduce_generate(hf_model: torch.nn.Module, config: GenerationConfig) -> None:
    prepared, processors = model_processors(hf_model, config)
    params = SamplingParams(**sampling_defaults(config))
    assert params.greedy == (prepared.do_sample is not True)
    assert all(isinstance(p, COVERED) for p in processors)
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, VOCAB, generator=gen) * 3
    contexts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (1, 4, 9, 2, 30, 5)]
    theirs = torch.cat(
        [processors(torch.tensor([c]), logits[i : i + 1].clone()) for i, c in enumerate(contexts)]
    )
    if params.greedy:
        chosen = warp_probs(logits, params, contexts).argmax(dim=-1)
        assert torch.equal(chosen, theirs.argmax(dim=-1))
        return
    ours = warp_logits(logits, params, contexts)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert torch.equal(ours[finite], theirs[finite])


def test_unset_fields_take_transformers_defaults() -> None:
    assert sampling_defaults(GenerationConfig(do_sample=True)) == {
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    greedy = sampling_defaults(GenerationConfig(temperature=0.3, top_k=3, repetition_penalty=1.5))
    assert greedy == {
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.5,
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (GenerationConfig(do_sample=True, temperature=0.0), "temperature 0"),
        (GenerationConfig(do_sample=True, min_p=2.0), "generation_config: min_p"),
        (GenerationConfig(repetition_penalty=-1.0), "generation_config: repetition_penalty"),
    ],
)
def test_bad_generation_configs_are_clear_errors(config: GenerationConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sampling_defaults(config)


def test_only_generation_configs_are_accepted() -> None:
    with pytest.raises(TypeError, match="GenerationConfig"):
        sampling_defaults({"do_sample": True})


UNSUPPORTED = [
    {"do_sample": True, "typical_p": 0.5},
    {"do_sample": True, "epsilon_cutoff": 0.01},
    {"no_repeat_ngram_size": 2},
    {"suppress_tokens": [3]},
    {"min_new_tokens": 2},
    {"bad_words_ids": [[4]]},
]


@pytest.mark.parametrize("fields", UNSUPPORTED, ids=str)
def test_unsupported_fields_are_exactly_those_generate_adds_processors_for(
    hf_model: torch.nn.Module, fields: dict
) -> None:
    _, processors = model_processors(hf_model, GenerationConfig(**fields))
    assert not all(isinstance(p, COVERED) for p in processors)
    flagged = unsupported_generation_settings(GenerationConfig(**fields))
    assert set(flagged) == set(fields) - {"do_sample"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.to_json_string(use_diff=True))
def test_covered_configs_flag_nothing(config: GenerationConfig) -> None:
    assert unsupported_generation_settings(config) == {}
