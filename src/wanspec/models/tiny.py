"""Tiny random-weight causal LMs with tiny real tokenizers, saved as Hugging Face folders.

They exist so that tests can run the real transformers code paths (KV cache, tree masks, sliding
windows, tokenizers with "Ġ" or "▁" word markers) in milliseconds and enumerate whole
distributions. Everything is deterministic from a seed.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    PreTrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2Tokenizer,
)

Family = Literal["llama", "qwen2", "gemma3"]
TokenizerStyle = Literal["bytelevel", "metaspace"]

FAMILIES: tuple[Family, ...] = ("llama", "qwen2", "gemma3")
DEFAULT_STYLE: dict[str, TokenizerStyle] = {
    "llama": "metaspace",
    "qwen2": "bytelevel",
    "gemma3": "metaspace",
}
DEFAULT_VOCAB: dict[str, int] = {"bytelevel": 320, "metaspace": 160}

# Training text for the tokenizers: a little English, code and numbers, so merges are realistic.
_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small model draft tokens that a large model verifies.",
    "The edge device drafts, the cloud verifies, and the network sits in between.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "In 2024 the model answered 42 questions in 3.5 seconds.",
    "She sells sea shells by the sea shore, and the shells she sells are sea shells.",
    "Translate to German: the house is small. Das Haus ist klein.",
    "Summarize: the meeting was long, the coffee was cold, and nothing was decided.",
    "Question: what is 12 plus 30? Answer: 12 plus 30 is 42.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
    "Once upon a time there was a tiny model that wanted to speak.",
)

_SPECIALS: dict[TokenizerStyle, dict[str, str]] = {
    "bytelevel": {
        "eos_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    },
    "metaspace": {
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<unk>",
    },
}


def build_tokenizer(style: TokenizerStyle, vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a small BPE tokenizer on the built-in corpus (deterministic for a given size)."""
    if style == "bytelevel":
        # Take Qwen2's pipeline (NFC, regex split, byte-level): AutoTokenizer imposes it on every
        # qwen2 folder, so using it everywhere keeps tokenizer.json and AutoTokenizer in agreement.
        reference = Qwen2Tokenizer().backend_tokenizer
        tok = Tokenizer(models.BPE())
        tok.normalizer = reference.normalizer
        tok.pre_tokenizer = reference.pre_tokenizer
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    elif style == "metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = [*string.printable, "▁"]
    else:
        raise ValueError(f"unknown tokenizer style {style!r}; expected 'bytelevel' or 'metaspace'")
    specials = list(dict.fromkeys(_SPECIALS[style].values()))
    minimum = len(set(alphabet)) + len(specials)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is below the {style} alphabet size {minimum}")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=sorted(set(alphabet)),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **_SPECIALS[style])


def _config(family: Family, vocab: int, tokenizer: PreTrainedTokenizerFast) -> PreTrainedConfig:
    """Small but structurally faithful configs: GQA, RoPE, and for Gemma3 a short sliding window."""
    common = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "initializer_range": 0.15,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if family == "llama":
        return LlamaConfig(num_hidden_layers=2, tie_word_embeddings=False, **common)
    if family == "qwen2":
        return Qwen2Config(num_hidden_layers=2, tie_word_embeddings=False, **common)
    if family == "gemma3":
        return Gemma3TextConfig(
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            tie_word_embeddings=False,
            **common,
        )
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def _sharpen(model: torch.nn.Module, logit_std: float) -> None:
    """Scale the output head so that next-token distributions are peaky, not near-uniform."""
    head = model.get_output_embeddings().weight
    hidden = head.shape[1]
    with torch.no_grad():
        head.mul_(logit_std / (head.std().item() * hidden**0.5))


def make_tiny_model(
    family: Family,
    path: str | Path,
    vocab_size: int | None = None,
    seed: int = 0,
    tokenizer_style: TokenizerStyle | None = None,
    logit_std: float = 4.0,
) -> Path:
    """Write a tiny random `family` model plus its tokenizer to `path` and return the folder.

    `vocab_size` is the tokenizer's target size: at least the alphabet (104 for "metaspace",
    257 for "bytelevel"), at most what the built-in corpus supports (~516 byte-level). The
    model's embedding has exactly one row per token of the trained tokenizer.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    style = tokenizer_style or DEFAULT_STYLE[family]
    tokenizer = build_tokenizer(style, vocab_size or DEFAULT_VOCAB[style])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(family, len(tokenizer), tokenizer))
    _sharpen(model, logit_std)
    return _save(model, tokenizer, Path(path))


def _save(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "wanspec_tiny.json").write_text(json.dumps({"family": model.config.model_type}))
    return path


def _normalise(token: str) -> str:
    return token.replace("Ġ", " ").replace("▁", " ")


def _perturb_from(draft: torch.nn.Module, target: torch.nn.Module, noise: float) -> None:
    """Make `draft` a noisy copy of `target` wherever the shapes allow (the vocab may differ)."""
    target_params = dict(target.named_parameters())
    with torch.no_grad():
        for name, param in draft.named_parameters():
            source = target_params.get(name)
            if source is not None and source.shape == param.shape:
                param.copy_(source + noise * source.std() * torch.randn_like(source))


def _copy_common_rows(
    draft: torch.nn.Module,
    draft_tok: PreTrainedTokenizerFast,
    target: torch.nn.Module,
    target_tok: PreTrainedTokenizerFast,
) -> None:
    """Copy embedding/head rows of tokens whose strings agree, so the pair is related."""
    by_string = {_normalise(t): i for t, i in target_tok.get_vocab().items()}
    pairs = [
        (i, by_string[_normalise(t)])
        for t, i in draft_tok.get_vocab().items()
        if _normalise(t) in by_string
    ]
    rows_d = torch.tensor([d for d, _ in pairs])
    rows_t = torch.tensor([t for _, t in pairs])
    with torch.no_grad():
        for get in ("get_input_embeddings", "get_output_embeddings"):
            dst, src = getattr(draft, get)().weight, getattr(target, get)().weight
            dst[rows_d] = src[rows_t]


def make_tiny_pair(
    root: str | Path,
    shared: bool = True,
    seed: int = 0,
    noise: float = 0.03,
) -> tuple[Path, Path]:
    """Write a related (draft, target) pair of tiny Llama models under `root`.

    `shared=True`: both use the same byte-level tokenizer. `shared=False`: the draft uses a
    smaller Metaspace ("▁") tokenizer and the target a byte-level ("Ġ") one, so the vocabularies
    differ in size, merges and word markers. The draft is a noisy copy of the target (rows of
    tokens with the same string are copied across) so that acceptance rates are non-trivial.
    """
    root = Path(root)
    target_tok = build_tokenizer("bytelevel", DEFAULT_VOCAB["bytelevel"])
    draft_tok = target_tok if shared else build_tokenizer("metaspace", DEFAULT_VOCAB["metaspace"])
    torch.manual_seed(seed)
    target = AutoModelForCausalLM.from_config(_config("llama", len(target_tok), target_tok))
    _sharpen(target, 4.0)
    draft = AutoModelForCausalLM.from_config(_config("llama", len(draft_tok), draft_tok))
    _perturb_from(draft, target, noise)
    if not shared:
        _copy_common_rows(draft, draft_tok, target, target_tok)
    kind = "shared" if shared else "hetero"
    return (
        _save(draft, draft_tok, root / f"{kind}-draft"),
        _save(target, target_tok, root / f"{kind}-target"),
    )
