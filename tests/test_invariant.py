"""Pass-shape invariance: a position's logits are bitwise the same in any pass that computes it.

Checked on tiny models of the three families in float32 and bfloat16: one-token decodes, 5-row
extends (a γ+1 verification), one whole prefill and tree passes (branches, a root hung inside the
cache) must agree bit for bit; and the invariant model must still compute the model (close to
transformers' own attention and linear layers), or invariance would be trivially satisfiable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from wanspec.models.invariant import (
    InvariantLinear,
    invariant_attention,
    make_batch_invariant,
)
from wanspec.models.lm import HFLanguageModel, load_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PREFIX, NEW = 150, 20  # the prefix spans several key blocks


@pytest.fixture(scope="module")
def invariant_lms(tiny_models: dict[str, Path]) -> dict[tuple[str, str], HFLanguageModel]:
    out = {}
    for family, path in tiny_models.items():
        for name, dtype in DTYPES.items():
            lm = load_model(path, dtype=dtype)
            make_batch_invariant(lm.model)
            out[family, name] = lm
    return out


def token_ids(lm: HFLanguageModel, n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, lm.vocab_size, (n,), generator=gen).tolist()


def decodes(lm: HFLanguageModel, prefix: list[int], ids: list[int]) -> torch.Tensor:
    lm.prefill(prefix)
    return torch.cat([lm.extend([t]) for t in ids])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_extend_prefill_and_tree_equal_one_token_decodes(
    invariant_lms: dict, family: str, dtype: str
) -> None:
    lm = invariant_lms[family, dtype]
    ids = token_ids(lm, PREFIX + NEW, seed=3)
    prefix, new = ids[:PREFIX], ids[PREFIX:]
    one_by_one = decodes(lm, prefix, new)
    lm.prefill(prefix)
    by_fives = torch.cat([lm.extend(new[i : i + 5]) for i in range(0, NEW, 5)])
    assert torch.equal(by_fives, one_by_one)
    assert torch.equal(lm.prefill(ids)[PREFIX:], one_by_one)
    # a tree: the first 12 new tokens as one branch, a side branch off node 3, and a root hung
    # after cached position PREFIX - 3 (it sees the cache only up to there)
    side = token_ids(lm, 3, seed=4)
    tokens = [*new[:12], *side, side[0]]
    parents = [-1, *range(11), 3, 12, 13, -3]
    lm.prefill(prefix)
    tree = lm.tree_forward(tokens, parents)
    assert torch.equal(tree[:12], one_by_one[:12])
    assert torch.equal(tree[12:15], decodes(lm, prefix + new[:4], side))
    assert torch.equal(tree[15:], decodes(lm, prefix[: PREFIX - 2], side[:1]))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_invariant_model_still_computes_the_model(
    invariant_lms: dict, tiny_models: dict, family: str
) -> None:
    """fp32: within float rounding of transformers' eager attention and stock linear layers;
    bf16 (attention runs in fp32 here, in bf16 there): the same next token almost everywhere."""
    stock = load_model(tiny_models[family], attn_implementation="eager", fast_linear=False)
    ids = token_ids(stock, 40, seed=5)
    reference = stock.prefill(ids)
    assert (invariant_lms[family, "fp32"].prefill(ids) - reference).abs().max() < 1e-4
    bf16 = invariant_lms[family, "bf16"].prefill(ids)
    agree = (bf16.argmax(-1) == reference.argmax(-1)).float().mean()
    assert agree >= 0.9 and (bf16 - reference).abs().max() < 0.5


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_bf16_generate_equals_one_pass_greedy_verification(
    invariant_lms: dict, family: str
) -> None:
    """transformers' own greedy `generate` (prefill, then one token at a time) on the invariant
    bf16 model picks exactly the tokens a single verification pass over its output would pick."""
    lm = invariant_lms[family, "bf16"]
    checked = 0
    for seed in range(2):
        prompt = token_ids(lm, 6, seed=10 + seed)
        with torch.inference_mode():
            out = lm.model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=24,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        lm.prefill(prompt[:-1])
        verified = lm.extend([prompt[-1], *out[:-1]]).argmax(dim=-1).tolist()
        assert verified == out
        checked += len(out)
    assert checked >= 24  # generate did not stop at an end token right away


def test_linear_rows_do_not_depend_on_the_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(96, 200)
    layer.__class__ = InvariantLinear
    x = torch.randn(21, 96, generator=gen)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(21)])
    for n in (2, 5, 8, 9, 21):
        assert torch.equal(layer(x[:n]), alone[:n])
    assert torch.allclose(alone, F.linear(x, layer.weight, layer.bias), atol=1e-5)
    assert layer(x[None, :3]).shape == (1, 3, 200)


class _Heads(torch.nn.Module):
    head_dim = 64


@pytest.mark.parametrize("q_len", [1, 7, 13])
def test_attention_matches_sdpa_and_is_row_invariant(q_len: int) -> None:
    """700 keys: long enough that plain matmuls change their summation order with the number
    of queries and of keys (they do here), so only the blocked form passes."""
    gen = torch.Generator().manual_seed(q_len)
    kv_len = 700  # the queries are the last q_len positions, the cache comes before
    q = torch.randn(1, 4, q_len, 64, generator=gen)
    k = torch.randn(1, 2, kv_len, 64, generator=gen)
    v = torch.randn(1, 2, kv_len, 64, generator=gen)
    out, _ = invariant_attention(_Heads(), q, k, v, None)
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    ref = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=causal, enable_gqa=True
    ).transpose(1, 2)
    assert (out.double() - ref).abs().max() < 1e-5
    # one query at a time, each seeing the keys up to itself, gives the very same rows
    for i in range(q_len):
        seen = kv_len - q_len + i + 1
        row, _ = invariant_attention(
            _Heads(), q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen], None
        )
        assert torch.equal(row[:, 0], out[:, i])
    # a boolean mask and the equivalent additive one agree
    additive = torch.zeros(causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
    by_bool, _ = invariant_attention(_Heads(), q, k, v, causal[None, None])
    by_bias, _ = invariant_attention(_Heads(), q, k, v, additive[None, None])
    assert torch.equal(by_bool, out) and torch.equal(by_bias, out)


def test_make_batch_invariant_swaps_every_linear_once(tiny_models: dict) -> None:
    lm = load_model(tiny_models["llama"])  # its linears are already lm._SwappedLinear
    linears = sum(isinstance(m, torch.nn.Linear) for m in lm.model.modules())
    assert make_batch_invariant(lm.model) == linears
    assert make_batch_invariant(lm.model) == 0
    assert all(
        type(m) is InvariantLinear for m in lm.model.modules() if isinstance(m, torch.nn.Linear)
    )
    assert lm.model.config._attn_implementation == "wanspec_invariant"
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="row_chunk"):
            make_batch_invariant(lm.model, row_chunk=bad)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_models_verify_and_tree_equal_decodes(name: str, dtype: str) -> None:
    from wanspec.models.registry import resolve_model

    lm = load_model(resolve_model(name, progress=False), dtype=DTYPES[dtype])
    make_batch_invariant(lm.model)
    prompt = lm.tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n").input_ids
    new = token_ids(lm, 10, seed=7)
    one_by_one = decodes(lm, prompt, new)
    lm.prefill(prompt)
    assert torch.equal(torch.cat([lm.extend(new[:5]), lm.extend(new[5:])]), one_by_one)
    lm.prefill(prompt)
    assert torch.equal(lm.tree_forward(new, [-1, *range(9)]), one_by_one)
