"""Every lossless method at temperature 0 equals the target's own greedy `generate`, token for
token, on the real heterogeneous pair SmolLM2-135M → Qwen2.5-Coder-0.5B (49k vs 152k vocab);
the shared-vocabulary pair Qwen2.5-Coder-0.5B → 1.5B is in test_real_shared_pair.py. Models
come from the registry (cached). Each test takes a minute or more: under `make test` they go out
to the xdist workers one by one (tests/conftest.py), each worker loading the pair once."""

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
# 16 tokens: several verification rounds per prompt at γ = 2 and 4; every token costs a 0.5B
# fp32 pass (~0.4 s on one core), so 24 tokens cost half as much again.
NEW_TOKENS = 16
LINK = wanspec.Link(bandwidth_bps=2e6, rtt_s=0.08)
HETERO_OK = [n for n, m in METHODS.items() if m.lossless and not m.shared_vocab_only]
SHARED_ONLY = [n for n, m in METHODS.items() if m.shared_vocab_only]


def _reference(pair: wanspec.Pair, prompt: str, new_tokens: int = NEW_TOKENS) -> list[int]:
    ids = torch.tensor([pair.target_encode(prompt)])
    out = pair.target.model.generate(
        ids, max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(ids)
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
