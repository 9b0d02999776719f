"""The language-model interface against plain, cache-free transformers forwards.

Every check compares what the KV cache / tree attention / compaction produce with a fresh forward
over the equivalent flat sequence, or with `model.generate`, on tiny models of the three families
(the Gemma3 one has an 8-token sliding window, shorter than the contexts used) and, slow-marked,
on the real registry models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from wanspec.models.lm import (
    HFLanguageModel,
    LanguageModel,
    _SwappedLinear,
    load_model,
    tree_bias,
)
from wanspec.models.profile import (
    bench_command,
    format_table,
    load_profile,
    measure_profile,
    median_ms,
    random_tree,
    save_profile,
)
from wanspec.models.tiny import FAMILIES, build_tokenizer, make_tiny_model

TOL = 1e-4


@pytest.fixture(scope="module")
def lms(tiny_models: dict[str, Path]) -> dict[str, HFLanguageModel]:
    return {family: load_model(path) for family, path in tiny_models.items()}


def fresh(lm: HFLanguageModel, ids: list[int]) -> torch.Tensor:
    """Reference logits: one cache-free forward over the whole sequence."""
    with torch.inference_mode():
        return lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def path_to(node: int, parents: list[int]) -> list[int]:
    """Tree indices from the root down to `node`."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def random_ids(rng: np.random.Generator, lm: LanguageModel, n: int) -> list[int]:
    return rng.integers(0, lm.vocab_size, n).tolist()


# -- plain extension, rollback ----------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_extend_equals_fresh_forward(lms: dict, family: str) -> None:
    lm, rng = lms[family], np.random.default_rng(0)
    ids = random_ids(rng, lm, 23)
    chunks = [lm.prefill(ids[:5]), lm.extend(ids[5:6]), lm.extend(ids[6:17]), lm.extend(ids[17:])]
    assert lm.length == 23
    logits = torch.cat(chunks)
    assert logits.dtype == torch.float32 and logits.shape == (23, lm.vocab_size)
    assert max_diff(logits, fresh(lm, ids)) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_truncate_then_extend_equals_fresh(lms: dict, family: str) -> None:
    lm, rng = lms[family], np.random.default_rng(1)
    ids, other = random_ids(rng, lm, 20), random_ids(rng, lm, 6)
    lm.prefill(ids)
    lm.truncate(9)
    assert lm.length == 9
    out = lm.extend(other)
    assert max_diff(out, fresh(lm, ids[:9] + other)[9:]) <= TOL
    lm.truncate(0)
    assert max_diff(lm.extend(other), fresh(lm, other)) <= TOL


# -- tree attention ---------------------------------------------------------------------------


def check_tree(
    lm: HFLanguageModel,
    context: list[int],
    tokens: list[int],
    parents: list[int],
    logits: torch.Tensor,
) -> None:
    """Each root-to-leaf branch's logits equal a fresh forward over context + branch."""
    leaves = set(range(len(tokens))) - set(parents)
    for leaf in leaves:
        path = path_to(leaf, parents)
        ref = fresh(lm, context + [tokens[i] for i in path])[len(context) :]
        assert max_diff(logits[path], ref) <= TOL, (leaf, path)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_forward_matches_each_branch(lms: dict, family: str, seed: int) -> None:
    lm, rng = lms[family], np.random.default_rng(seed)
    context = random_ids(rng, lm, 11)
    size = int(rng.integers(5, 20))
    tokens, parents = random_ids(rng, lm, size), random_tree(rng, size)
    lm.prefill(context)
    logits = lm.tree_forward(tokens, parents)
    assert logits.shape == (size, lm.vocab_size)
    assert lm.length == len(context) and lm.pending_tree_size == size
    check_tree(lm, context, tokens, parents, logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_deep_chain_tree_crosses_the_sliding_window(lms: dict, family: str) -> None:
    """A single 14-node chain is exactly an extension (Gemma3's window is 8)."""
    lm, rng = lms[family], np.random.default_rng(3)
    context, chain = random_ids(rng, lm, 10), random_ids(rng, lm, 14)
    lm.prefill(context)
    logits = lm.tree_forward(chain, [-1, *range(13)])
    assert max_diff(logits, fresh(lm, context + chain)[10:]) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_grown_over_several_calls(lms: dict, family: str) -> None:
    lm, rng = lms[family], np.random.default_rng(4)
    context = random_ids(rng, lm, 9)
    tokens, parents = random_ids(rng, lm, 12), random_tree(rng, 12)
    lm.prefill(context)
    parts = [
        lm.tree_forward(tokens[:4], parents[:4]),
        lm.tree_forward(tokens[4:5], parents[4:5]),
        lm.tree_forward(tokens[5:], parents[5:]),
    ]
    assert lm.pending_tree_size == 12
    check_tree(lm, context, tokens, parents, torch.cat(parts))


@pytest.mark.parametrize("family", FAMILIES)
def test_roots_attached_inside_the_cache(lms: dict, family: str) -> None:
    """Parent -k hangs a root after cached position length-k: it must not see later tokens."""
    lm, rng = lms[family], np.random.default_rng(5)
    context = random_ids(rng, lm, 12)
    tokens = random_ids(rng, lm, 5)
    lm.prefill(context)
    logits = lm.tree_forward(tokens, [-3, 0, -1, -13, 3])
    assert max_diff(logits[[0, 1]], fresh(lm, context[:10] + tokens[:2])[10:]) <= TOL
    assert max_diff(logits[2], fresh(lm, context + tokens[2:3])[12]) <= TOL
    assert max_diff(logits[[3, 4]], fresh(lm, tokens[3:5])) <= TOL


def test_empty_cache_tree_and_empty_calls(lms: dict) -> None:
    lm, rng = lms["llama"], np.random.default_rng(6)
    lm.reset()
    assert lm.extend([]).shape == (0, lm.vocab_size)
    tokens = random_ids(rng, lm, 6)
    parents = [-1, 0, 0, 1, -1, 4]
    check_tree(lm, [], tokens, parents, lm.tree_forward(tokens, parents))
    assert lm.tree_forward([], []).shape == (0, lm.vocab_size)


# -- compaction -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_keep_tree_path_then_continue(lms: dict, family: str, seed: int) -> None:
    lm, rng = lms[family], np.random.default_rng(10 + seed)
    context = random_ids(rng, lm, 10)
    tokens, parents = random_ids(rng, lm, 16), random_tree(rng, 16)
    lm.prefill(context)
    lm.tree_forward(tokens, parents)
    leaf = int(rng.choice(sorted(set(range(16)) - set(parents))))
    path = path_to(leaf, parents)
    lm.keep_tree_path(path)
    kept = context + [tokens[i] for i in path]
    assert lm.length == len(kept) and lm.pending_tree_size == 0
    more = random_ids(rng, lm, 4)
    assert max_diff(lm.extend(more), fresh(lm, kept + more)[len(kept) :]) <= TOL
    # the compacted sequence also rolls back and grows a new tree correctly
    lm.truncate(len(kept) - 1)
    again = lm.tree_forward(more, [-1, 0, 0, 2])
    check_tree(lm, kept[:-1], more, [-1, 0, 0, 2], again)


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_path_hanging_inside_the_cache(lms: dict, family: str) -> None:
    """AceSpec's hit: drop the rejected tail of the cached chain, splice in a drafted branch."""
    lm, rng = lms[family], np.random.default_rng(20)
    context, chain = random_ids(rng, lm, 8), random_ids(rng, lm, 5)
    branch = random_ids(rng, lm, 3)
    lm.prefill(context + chain)
    lm.tree_forward(random_ids(rng, lm, 2) + branch, [-1, -3, -4, 2, 3])
    lm.keep_tree_path([2, 3, 4])  # root hangs after chain[1]: drop chain[2:]
    kept = context + chain[:2] + branch
    assert lm.length == len(kept)
    more = random_ids(rng, lm, 3)
    assert max_diff(lm.extend(more), fresh(lm, kept + more)[len(kept) :]) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_a_branch_with_its_subtree_then_grow_it(lms: dict, family: str) -> None:
    """AceSpec continuing from a cached branch: keep the chain to a node AND the drafted tree
    below it (re-rooted), grow that subtree further; every logit equals a fresh forward."""
    lm, rng = lms[family], np.random.default_rng(30)
    context, tokens = random_ids(rng, lm, 7), random_ids(rng, lm, 9)
    parents = [-1, 0, 1, 1, 2, 4, -1, 6, 3]  # nodes 2..5 and 8 lie below node 1
    lm.prefill(context)
    lm.tree_forward(tokens, parents)
    lm.keep_tree_path([0, 1], keep_descendants=True)
    kept = context + tokens[:2]
    assert lm.length == len(kept) and lm.pending_tree_size == 5  # old 2, 3, 4, 5, 8
    below, below_parents = [tokens[i] for i in (2, 3, 4, 5, 8)], [-1, -1, 0, 2, 1]
    more = random_ids(rng, lm, 3)
    grown = lm.tree_forward(more, [3, 4, 5])  # under old 5, old 8 and the new node 5
    all_tokens, all_parents = below + more, [*below_parents, 3, 4, 5]
    for row, node in zip(grown, (5, 6, 7), strict=True):
        branch = [all_tokens[i] for i in path_to(node, all_parents)]
        assert max_diff(row, fresh(lm, kept + branch)[-1]) <= TOL, node
    lm.keep_tree_path([0, 2, 3, 5])  # old 2 → old 4 → old 5 → more[0]
    chain = [*kept, tokens[2], tokens[4], tokens[5], more[0]]
    tail = random_ids(rng, lm, 2)
    assert max_diff(lm.extend(tail), fresh(lm, chain + tail)[len(chain) :]) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_a_branch_with_the_trees_hanging_along_it(lms: dict, family: str) -> None:
    """A chain sent before its verdict has its own tree hanging from every node of the branch it
    continues: keeping the branch keeps them all, each child of the branch's k-th node now a root
    at that node's place in the cache; every logit still equals a fresh forward."""
    lm, rng = lms[family], np.random.default_rng(31)
    context, tokens = random_ids(rng, lm, 6), random_ids(rng, lm, 8)
    parents = [-1, 0, 1, 0, 1, 2, 3, -2]  # path 0 → 1 → 2; 3 and 6 below 0, 4 below 1, 5 below 2
    lm.prefill(context)
    lm.tree_forward(tokens, parents)
    lm.keep_tree_path([0, 1, 2], keep_descendants=True)
    kept = context + tokens[:3]
    assert lm.length == len(kept) and lm.pending_tree_size == 4  # old 3, 4, 5, 6; not 7
    below = {0: [*kept[:-2], tokens[3]], 1: [*kept[:-1], tokens[4]], 2: [*kept, tokens[5]],
             3: [*kept[:-2], tokens[3], tokens[6]]}  # fmt: skip
    more = random_ids(rng, lm, 4)
    grown = lm.tree_forward(more, [0, 1, 2, 3])
    for row, (node, branch) in zip(grown, below.items(), strict=True):
        assert max_diff(row, fresh(lm, [*branch, more[node]])[-1]) <= TOL, node
    lm.keep_tree_path([1, 5])  # old 4, then more[1]
    chain = [*kept[:-1], tokens[4], more[1]]
    tail = random_ids(rng, lm, 2)
    assert max_diff(lm.extend(tail), fresh(lm, chain + tail)[len(chain) :]) <= TOL


def test_synthetic_keeps_a_subtree_like_the_real_backend() -> None:
    from wanspec.models.synthetic import SyntheticLM, SyntheticSpec

    lm = SyntheticLM(SyntheticSpec(0.5, vocab_size=50, context_tokens=4), "target")
    lm.prefill([1, 2, 3])
    lm.tree_forward([10, 11, 12, 13, 14], [-1, 0, 1, 1, -1])
    lm.keep_tree_path([0, 1], keep_descendants=True)
    assert lm.ids == (1, 2, 3, 10, 11) and lm.pending_tree_size == 2
    rows = lm.tree_forward([20, 21], [0, 1])
    expected = lm.rows([[1, 2, 3, 10, 11, 12, 20], [1, 2, 3, 10, 11, 13, 21]])
    assert torch.equal(rows, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_truncate_and_empty_keep_drop_the_tree(lms: dict, family: str) -> None:
    lm, rng = lms[family], np.random.default_rng(21)
    context, more = random_ids(rng, lm, 9), random_ids(rng, lm, 3)
    for drop in (lambda: lm.truncate(lm.length), lambda: lm.keep_tree_path([])):
        lm.prefill(context)
        lm.tree_forward(random_ids(rng, lm, 7), random_tree(rng, 7))
        drop()
        assert lm.length == 9 and lm.pending_tree_size == 0
        assert max_diff(lm.extend(more), fresh(lm, context + more)[9:]) <= TOL


# -- greedy generation vs transformers --------------------------------------------------------


def greedy(lm: LanguageModel, prompt: list[int], new_tokens: int) -> list[int]:
    logits = lm.prefill(prompt)[-1]
    out: list[int] = []
    while len(out) < new_tokens:
        token = int(logits.argmax())
        out.append(token)
        if token in lm.eos_token_ids:
            break
        logits = lm.extend([token])[-1]
    return out


@contextmanager
def stock_linear(model: torch.nn.Module) -> Iterator[int]:
    """Temporarily put back transformers' own nn.Linear layers (undoing `fast_linear`)."""
    swapped = [m for m in model.modules() if isinstance(m, _SwappedLinear)]
    for module in swapped:
        module.__class__ = torch.nn.Linear
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            module.__class__ = _SwappedLinear


def hf_greedy(lm: HFLanguageModel, prompt: list[int], new_tokens: int) -> list[int]:
    """Stock transformers greedy decoding (its own cache, masks and linear layers)."""
    ids = torch.tensor([prompt])
    with torch.inference_mode(), stock_linear(lm.model):
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=0,
            pad_token_id=lm.eos_token_ids[0],
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_generate_tiny(lms: dict, family: str) -> None:
    lm = lms[family]
    for text in ("The quick brown fox", "def add(a, b):"):
        prompt = lm.tokenizer(text).input_ids
        mine = greedy(lm, prompt, 30)
        assert mine == hf_greedy(lm, prompt, 30)
        assert len(set(mine)) > 3, "tiny model output should not be one repeated token"


@pytest.mark.parametrize("family", FAMILIES)
def test_swapped_linear_matches_stock_layers(lms: dict, family: str) -> None:
    lm, rng = lms[family], np.random.default_rng(30)
    ids = random_ids(rng, lm, 12)
    fast = torch.cat([lm.prefill(ids[:9]), lm.extend(ids[9:10]), lm.extend(ids[10:])])
    with stock_linear(lm.model) as swapped:
        assert swapped >= 7 * lm.config.num_hidden_layers
        stock = fresh(lm, ids)
    assert max_diff(fast, stock) <= TOL
    plain = load_model(lm.model.name_or_path, fast_linear=False)
    assert not any(isinstance(m, _SwappedLinear) for m in plain.model.modules())
    assert max_diff(plain.prefill(ids), stock) <= TOL


# -- input checking ---------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(lms: dict) -> None:
    lm = lms["qwen2"]
    lm.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="outside"):
        lm.extend([lm.vocab_size])
    with pytest.raises(TypeError, match="integers"):
        lm.extend([1.5])
    with pytest.raises(ValueError, match="truncate"):
        lm.truncate(4)
    with pytest.raises(ValueError, match="parents"):
        lm.tree_forward([1, 2], [-1])
    with pytest.raises(ValueError, match="parent 1 of node 1"):
        lm.tree_forward([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="parent -5 of node 0"):
        lm.tree_forward([1], [-5])
    with pytest.raises(RuntimeError, match="pending"):
        lm.keep_tree_path([0])
    assert lm.length == 3 and lm.pending_tree_size == 0
    lm.tree_forward([4, 5, 6], [-1, 0, -1])
    with pytest.raises(RuntimeError, match="keep_tree_path"):
        lm.extend([7])
    with pytest.raises(ValueError, match="not a child"):
        lm.keep_tree_path([0, 2])
    with pytest.raises(ValueError, match="root"):
        lm.keep_tree_path([1])
    with pytest.raises(ValueError, match="pending tree indices"):
        lm.keep_tree_path([3])
    with pytest.raises(FileNotFoundError):
        load_model(Path("/nonexistent/model"))


def test_tree_bias_window_and_visibility() -> None:
    """Direct check of the mask: 3 cached tokens, nodes 0 -> 1 and a root 2 hung at cache pos 0."""
    attach = np.array([2, 2, 0])
    keys = np.array([0, 1, 2, 3, 4, 1])
    queries = np.array([3, 4, 1])
    ancestors = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=bool)
    full = tree_bias(3, attach, keys, queries, ancestors, None, torch.float32)[0, 0] == 0
    expected = [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 1]]
    assert full.tolist() == [[bool(v) for v in row] for row in expected]
    windowed = tree_bias(3, attach, keys, queries, ancestors, 2, torch.float32)[0, 0] == 0
    assert windowed.tolist()[1] == [False, False, False, True, True, False]


def test_model_metadata(lms: dict, tiny_models: dict) -> None:
    for family, lm in lms.items():
        assert lm.vocab_size == lm.model.get_input_embeddings().weight.shape[0]
        assert lm.vocab_size == len(lm.tokenizer)
        assert lm.eos_token_ids == (lm.tokenizer.eos_token_id,)
        assert lm.name == tiny_models[family].name == family
        assert lm.config.model_type in {"llama", "qwen2", "gemma3_text"}


# -- tiny models ------------------------------------------------------------------------------


def test_tiny_models_are_deterministic(tmp_path: Path) -> None:
    a = make_tiny_model("qwen2", tmp_path / "a", seed=7)
    b = make_tiny_model("qwen2", tmp_path / "b", seed=7)
    c = make_tiny_model("qwen2", tmp_path / "c", seed=8)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="family"):
        make_tiny_model("gpt2", tmp_path / "d")
    with pytest.raises(ValueError, match="alphabet"):
        build_tokenizer("bytelevel", 100)


def test_tiny_pairs(tiny_pair_shared: tuple, tiny_pair_hetero: tuple) -> None:
    draft, target = (load_model(p) for p in tiny_pair_shared)
    assert draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    # related models: the draft's argmax agrees with the target's on a good share of positions
    ids = np.random.default_rng(0).integers(0, target.vocab_size, 60).tolist()
    agree = (draft.prefill(ids).argmax(-1) == target.prefill(ids).argmax(-1)).float().mean()
    assert 0.3 < agree < 1.0
    draft, target = (load_model(p) for p in tiny_pair_hetero)
    dv, tv = draft.tokenizer.get_vocab(), target.tokenizer.get_vocab()
    assert draft.vocab_size < target.vocab_size
    assert any(t.startswith("▁") for t in dv) and not any(t.startswith("Ġ") for t in dv)
    assert any(t.startswith("Ġ") for t in tv) and not any(t.startswith("▁") for t in tv)
    text = "the quick brown fox"
    assert draft.tokenizer.decode(draft.tokenizer(text).input_ids) == text
    assert target.tokenizer.decode(target.tokenizer(text).input_ids) == text
    assert draft.tokenizer(text).input_ids != target.tokenizer(text).input_ids


# -- latency profiles -------------------------------------------------------------------------


def test_measure_profile_round_trip(lms: dict, tmp_path: Path) -> None:
    from wanspec.protocols.base import ComputeCost
    from wanspec.sim.profiles import load_profile as load_sim_profile

    lm = lms["llama"]
    prof = measure_profile(lm, ns=(1, 4), tree_sizes=(3, 8), context=8, repeats=2)
    assert set(prof["forward_ms"]) == {"1", "4"} and set(prof["tree_ms"]) == {"3", "8"}
    assert all(len(v) == 2 and min(v) > 0 for v in prof["forward_ms"].values())
    assert prof["model"] == "llama" and prof["threads"] == torch.get_num_threads()
    assert prof["fast_linear"] is True
    assert lm.length == 0
    path = save_profile(prof, tmp_path / "sub" / "p.json")
    assert load_profile(path) == prof
    sim = load_sim_profile(str(path))
    cost = sim.seconds(ComputeCost("forward", n=4))
    assert cost == pytest.approx(median_ms(prof, "forward_ms", 4) / 1000)
    assert "tree B=8" in format_table(prof)
    (tmp_path / "bad.json").write_text(json.dumps({"tree_ms": {}}))
    with pytest.raises(ValueError, match="forward_ms"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="ns"):
        measure_profile(lm, ns=(0,))


def test_bench_command_on_a_folder(tiny_models: dict, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WANSPEC_HOME", str(tmp_path))
    prof = bench_command(str(tiny_models["gemma3"]), out=None, repeats=1)
    printed = capsys.readouterr().out
    assert "forward n=64" in printed and "tree B=64" in printed
    written = tmp_path / "profiles" / f"{prof['name']}.json"
    assert load_profile(written)["tree_ms"].keys() == prof["tree_ms"].keys()


# -- real models (slow) -----------------------------------------------------------------------


def real(name: str) -> HFLanguageModel:
    from wanspec.models.registry import resolve_model

    return load_model(resolve_model(name, progress=False))


@pytest.fixture(scope="module")
def smollm() -> HFLanguageModel:
    return real("smollm2-135m")


@pytest.mark.slow
def test_smollm_tree_and_compaction(smollm: HFLanguageModel) -> None:
    lm, rng = smollm, np.random.default_rng(0)
    context = lm.tokenizer("def fibonacci(n):\n    if n < 2:\n        return").input_ids
    tokens, parents = random_ids(rng, lm, 12), random_tree(rng, 12)
    lm.prefill(context)
    check_tree(lm, context, tokens, parents, lm.tree_forward(tokens, parents))
    path = path_to(11, parents)
    lm.keep_tree_path(path)
    kept = context + [tokens[i] for i in path]
    more = random_ids(rng, lm, 3)
    assert max_diff(lm.extend(more), fresh(lm, kept + more)[len(kept) :]) <= TOL


PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The capital of France is",
)


@pytest.mark.slow
def test_smollm_greedy_equals_generate(smollm: HFLanguageModel) -> None:
    for text in PROMPTS:
        prompt = smollm.tokenizer(text).input_ids
        assert greedy(smollm, prompt, 24) == hf_greedy(smollm, prompt, 24)


# Qwen2.5-Coder-0.5B decoding through `extend` equals its own `generate` in test_real_pairs.py,
# where `ar` (the target decoding alone, one `extend` per token) must give generate's tokens.
