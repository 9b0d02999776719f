"""Every lossless method at temperature 0 equals the target's own greedy `generate`, token for
token, on the real pairs: heterogeneous SmolLM2-135M → Qwen2.5-Coder-0.5B (49k vs 152k vocab)
and shared-vocabulary Qwen2.5-Coder-0.5B → 1.5B. Models come from the registry (cached)."""

from __future__ import annotations

import pytest
import torch

import wanspec
from wanspec.protocols.registry import METHODS

pytestmark = pytest.mark.slow

PROMPTS = [
    "def fibonacci(n):",
    "The three primary colours are",
    "Übersetze ins Englische: Der Hund schläft. →",
]
NEW_TOKENS = 24
LINK = wanspec.Link(bandwidth_bps=2e6, rtt_s=0.08)
HETERO_OK = [n for n, m in METHODS.items() if m.lossless and not m.shared_vocab_only]
SHARED_ONLY = [n for n, m in METHODS.items() if m.shared_vocab_only]


def _reference(pair: wanspec.Pair, prompt: str) -> list[int]:
    ids = torch.tensor([pair.target_encode(prompt)])
    out = pair.target.model.generate(
        ids, max_new_tokens=NEW_TOKENS, do_sample=False, attention_mask=torch.ones_like(ids)
    )
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def hetero() -> tuple[wanspec.Pair, dict[str, list[int]]]:
    pair = wanspec.load_pair(target="qwen2.5-coder-0.5b", draft="smollm2-135m")
    return pair, {p: _reference(pair, p) for p in PROMPTS}


# `ar` streams the target's own tokens and never drafts: one run, whatever γ says.
HETERO_RUNS = [
    (method, gamma)
    for method in HETERO_OK
    for gamma in ((2,) if METHODS[method].family == "ar" else (2, 4))
]


@pytest.mark.parametrize(("method", "gamma"), HETERO_RUNS)
def test_hetero_pair_greedy_equals_target_generate(hetero, method: str, gamma: int) -> None:
    pair, refs = hetero
    assert not pair.shared_vocab
    for prompt, ref in refs.items():
        res = wanspec.generate(
            pair, prompt, method, temperature=0, gamma=gamma, max_new_tokens=NEW_TOKENS, link=LINK
        )
        assert res.token_ids == ref, (method, prompt)
        assert res.text == pair.decode(ref)


def test_hetero_pair_alignment_is_the_expected_overlap(hetero) -> None:
    stats = hetero[0].alignment.stats()
    assert (stats.draft_vocab, stats.target_vocab, stats.target_width) == (49152, 151665, 151936)
    assert 30_000 < stats.common < 45_000


@pytest.mark.parametrize("method", SHARED_ONLY)
def test_shared_only_methods_refuse_the_hetero_pair(hetero, method: str) -> None:
    with pytest.raises(ValueError, match="shared vocabulary"):
        wanspec.generate(hetero[0], "x", method, max_new_tokens=2)


def test_hetero_pair_sampling_is_reproducible(hetero) -> None:
    pair = hetero[0]
    runs = [
        wanspec.generate(
            pair,
            PROMPTS[0],
            "xcosd-e",
            temperature=0.8,
            top_p=0.95,
            seed=s,
            max_new_tokens=12,
            link=LINK,
        ).token_ids
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    assert len(runs[2]) == 12


@pytest.mark.veryslow
def test_shared_pair_greedy_equals_target_generate() -> None:
    pair = wanspec.load_pair(target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    assert pair.shared_vocab
    prompt = PROMPTS[0]
    ref = _reference(pair, prompt)[:16]  # 16 tokens: 2/3 of 24 tokens' 400 s here
    for method in [n for n, m in METHODS.items() if m.lossless]:
        res = wanspec.generate(
            pair, prompt, method, temperature=0, gamma=4, max_new_tokens=len(ref), link=LINK
        )
        assert res.token_ids == ref, method


@pytest.mark.veryslow
def test_bf16_invariant_shared_pair_greedy_equals_target_generate() -> None:
    """In bf16 a verification pass and a one-token decode pick different argmaxes by default
    (issue 10 measured it); in invariant mode they cannot, so greedy text equals transformers'
    own `generate` on the same bf16 target: checked for a verifying method (sd) and a pipeline
    whose drafts come from tree passes (acespec); 200 s here, so two methods only."""
    pair = wanspec.load_pair(
        target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
        dtype=torch.bfloat16, invariant=True,
    )  # fmt: skip
    prompt = PROMPTS[0]
    ids = torch.tensor([pair.target_encode(prompt)])
    with torch.inference_mode():
        ref = pair.target.model.generate(
            ids, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids)
        )[0, ids.shape[1] :].tolist()
    for method in ("sd", "acespec"):
        res = wanspec.generate(
            pair, prompt, method, temperature=0, gamma=4, max_new_tokens=12, link=LINK
        )
        assert res.token_ids == ref, method
