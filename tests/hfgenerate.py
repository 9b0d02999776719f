"""transformers' own `generate` machinery, as the reference for wanspec's sampling tests."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LogitsProcessorList


def tiny_causal_lm(vocab: int) -> torch.nn.Module:
    """A minimal transformers causal LM: only its `generate` machinery is used."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        eos_token_id=0,
    )
    return AutoModelForCausalLM.from_config(config)


def generate_processors(
    model: torch.nn.Module, config: GenerationConfig | None = None
) -> LogitsProcessorList:
    """The logits processors `model.generate(generation_config=config)` applies (config None:
    the model's own `generation_config`, as a plain `model.generate(ids)` uses it)."""
    prepared, _ = model._prepare_generation_config(config)
    prepared._eos_token_tensor = torch.tensor([0])  # generate sets this before the processors
    return model._get_logits_processor(
        prepared, input_ids_seq_length=1, device="cpu", model_kwargs={}
    )
