"""Lossless methods at temperature 0 equal the target's own greedy `generate`, token for token,
on the real shared-vocabulary pair Qwen2.5-Coder-0.5B → 1.5B (`veryslow`: minutes;
WANSPEC_VERYSLOW=1, which `make test` sets). Kept in a file of its own, apart from the
heterogeneous pair's tests (test_real_pairs.py), so that under `make test` one worker runs it.
Models come from the registry (cached)."""

from __future__ import annotations

import pytest

import wanspec
from test_real_pairs import LINK, PROMPTS, TABLES, _reference
from wanspec.models.replay import JobReplay
from wanspec.protocols.registry import METHODS

pytestmark = pytest.mark.slow

# Every method that needs a shared vocabulary (no other real pair runs them), and one of each
# cross-vocabulary family on the identity alignment of a real padded vocabulary (151,665 tokens,
# 151,936 logits rows): HR verification, the tree pipeline and the one with forks. The other
# cross-vocabulary methods share those code paths; each runs on the real heterogeneous pair
# (test_real_pairs.py) and, with a shared vocabulary, on the synthetic pair at three γ
# (test_protocols.py). Each distinct pass is a 1.5B fp32 pass (~2 s here); the methods share
# them through one replay store, as in test_real_pairs.py.
SHARED_PAIR_METHODS = [n for n, m in METHODS.items() if m.shared_vocab_only] + [
    "xcosd",
    "acespec-x",
    "deepspec-tree",
]


@pytest.mark.veryslow
def test_shared_pair_greedy_equals_target_generate() -> None:
    pair = wanspec.load_pair(target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    assert pair.shared_vocab
    prompt = PROMPTS[0]
    ref = _reference(pair, prompt, 12)
    store = JobReplay()
    for method in SHARED_PAIR_METHODS:
        assert METHODS[method].lossless
        res = wanspec.generate(
            pair,
            prompt,
            method,
            temperature=0,
            gamma=4,
            max_new_tokens=len(ref),
            link=LINK,
            reuse=store,
            **TABLES,
        )
        assert res.token_ids == ref, method
