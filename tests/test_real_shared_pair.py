"""Every lossless method at temperature 0 equals the target's own greedy `generate`, token for
token, on the real shared-vocabulary pair Qwen2.5-Coder-0.5B → 1.5B, in float32 and in bf16
invariant mode (`veryslow`: minutes each; WANSPEC_VERYSLOW=1, which `make test` sets). Kept in a
file of their own, apart from the heterogeneous pair's tests (test_real_pairs.py): under
`make test` one worker runs both, one after the other, so two 1.5B models are never in memory
at once. Models come from the registry (cached)."""

from __future__ import annotations

import pytest
import torch

import wanspec
from test_real_pairs import LINK, PROMPTS, _reference
from wanspec.protocols.registry import METHODS

pytestmark = pytest.mark.slow


@pytest.mark.veryslow
def test_shared_pair_greedy_equals_target_generate() -> None:
    pair = wanspec.load_pair(target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    assert pair.shared_vocab
    prompt = PROMPTS[0]
    ref = _reference(pair, prompt, 12)  # 12 tokens: each is a 1.5B fp32 pass per method
    for method in [n for n, m in METHODS.items() if m.lossless]:
        res = wanspec.generate(
            pair, prompt, method, temperature=0, gamma=4, max_new_tokens=len(ref), link=LINK
        )
        assert res.token_ids == ref, method


@pytest.mark.veryslow
def test_bf16_invariant_shared_pair_greedy_equals_target_generate() -> None:
    """In bf16 a verification pass and a one-token decode pick different argmaxes by default;
    in invariant mode they cannot, so greedy text equals transformers' own `generate` on the
    same bf16 target: checked for a verifying method (sd) and a pipeline whose drafts come from
    tree passes (acespec); a minute and more here, so two methods only."""
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
