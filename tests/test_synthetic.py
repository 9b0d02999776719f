"""The synthetic draft/target pair: interface behaviour and its exact acceptance rate α."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wanspec.models.lm import LanguageModel
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec, synthetic_pair
from wanspec.sampling import quantize, sample, sample_residual, verify_chain


def probs(logits: torch.Tensor) -> np.ndarray:
    """Row-wise softmax in float64 (numpy: no thread-pool overhead on tiny tensors)."""
    x = logits.numpy().astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_interface_and_determinism() -> None:
    draft, target = synthetic_pair(0.7, vocab_size=300, seed=4)
    assert isinstance(target, LanguageModel) and target.vocab_size == 300
    assert target.eos_token_ids == () and target.tokenizer is None
    a = target.prefill([1, 2, 3, 4])
    assert a.shape == (4, 300) and a.dtype == torch.float32 and target.length == 4
    b = SyntheticLM(SyntheticSpec(0.7, vocab_size=300, seed=4), "target").prefill([1, 2, 3, 4])
    other = SyntheticLM(SyntheticSpec(0.7, vocab_size=300, seed=5), "target").prefill([1, 2, 3, 4])
    assert torch.equal(a, b)
    assert not torch.equal(a, other)
    assert draft.prefill([1, 2, 3, 4]).shape == (4, 300)


def test_extend_matches_prefill_and_truncate_rolls_back() -> None:
    _, target = synthetic_pair(0.5, vocab_size=200, seed=1)
    whole = target.prefill([5, 6, 7, 8, 9])
    target.prefill([5, 6])
    step = torch.cat([target.extend([7]), target.extend([8, 9])])
    assert torch.equal(step, whole[2:])
    target.truncate(3)
    assert target.length == 3 and target.ids == (5, 6, 7)
    assert torch.equal(target.extend([8]), whole[3:4])
    assert target.extend([]).shape == (0, 200)


def test_tree_forward_equals_extending_each_path_and_keep_path_commits_it() -> None:
    _, target = synthetic_pair(0.5, vocab_size=100, seed=2)
    target.prefill([10, 11, 12])
    # 0:a -> 1:b -> 2:c ; 3:d attached to node 0 ; 4:e branching from the cached token 11
    tree = target.tree_forward([20, 21, 22], [-1, 0, 1])
    more = target.tree_forward([23, 24], [0, -2])
    assert target.length == 3 and target.pending_tree_size == 5
    reference = SyntheticLM(target.spec, "target")
    expected = {
        0: [10, 11, 12, 20],
        1: [10, 11, 12, 20, 21],
        2: [10, 11, 12, 20, 21, 22],
        3: [10, 11, 12, 20, 23],
        4: [10, 11, 24],
    }
    rows = torch.cat([tree, more])
    for node, path in expected.items():
        assert torch.equal(rows[node], reference.prefill(path)[-1]), node
    with pytest.raises(RuntimeError, match="pending"):
        target.extend([1])
    target.keep_tree_path([0, 3])
    assert target.ids == (10, 11, 12, 20, 23) and target.pending_tree_size == 0
    assert torch.equal(target.extend([30]), reference.prefill([10, 11, 12, 20, 23, 30])[-1:])
    target.tree_forward([40], [-3])
    target.keep_tree_path([0])
    assert target.ids == (10, 11, 12, 20, 40)
    target.tree_forward([41], [-1])
    target.keep_tree_path([])
    assert target.ids == (10, 11, 12, 20, 40)


def test_tree_and_input_errors() -> None:
    _, target = synthetic_pair(0.5, vocab_size=50)
    target.prefill([1, 2])
    with pytest.raises(ValueError, match="outside"):
        target.extend([50])
    with pytest.raises(ValueError, match="parent 0 of node 0"):
        target.tree_forward([3], [0])
    with pytest.raises(ValueError, match="cache offset"):
        target.tree_forward([3], [-4])
    with pytest.raises(RuntimeError, match="needs pending"):
        target.keep_tree_path([0])
    target.tree_forward([3, 4, 5], [-1, 0, -1])
    with pytest.raises(ValueError, match="not a child"):
        target.keep_tree_path([0, 2])
    with pytest.raises(ValueError, match="start at a root"):
        target.keep_tree_path([1])
    with pytest.raises(ValueError, match="truncate length"):
        target.truncate(3)
    with pytest.raises(TypeError, match="integers"):
        target.extend([1.5])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 1.5},
        {"alpha": 0.5, "vocab_size": 8},
        {"alpha": 0.5, "target_support": 0},
        {"alpha": 0.5, "eos_token_ids": (1000,)},
        {"alpha": 0.5, "alpha_alt": -0.1},
        {"alpha": 0.5, "alpha_alt": 0.9, "regime_tokens": 0},
    ],
)
def test_bad_specs_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SyntheticSpec(**kwargs)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
def test_overlap_is_alpha_at_every_position_even_quantised(alpha: float) -> None:
    draft, target = synthetic_pair(alpha, vocab_size=500, seed=3)
    ids = list(np.random.default_rng(0).integers(0, 500, size=40))
    p, q = probs(draft.prefill(ids)), probs(target.prefill(ids))
    overlap = np.minimum(p, q).sum(axis=1)
    assert np.allclose(overlap, alpha, atol=1e-6)
    for row_p, row_q in zip(p, q, strict=True):
        qp, qq = quantize(row_p), quantize(row_q)
        assert abs(np.minimum(qp, qq).sum() / 65535 - alpha) < 1e-3 * max(alpha, 0.01)
        assert np.count_nonzero(np.isclose(row_q, row_q.max())) == 1  # unique greedy token


def test_two_regimes_set_the_overlap_per_stretch_of_positions() -> None:
    # a long context, so that many stretches of 4 positions are covered
    draft, target = synthetic_pair(0.9, vocab_size=500, seed=3, alpha_alt=0.4, regime_tokens=4)
    ids = list(np.random.default_rng(0).integers(0, 500, size=80))
    p, q = probs(draft.prefill(ids)), probs(target.prefill(ids))
    overlap = np.minimum(p, q).sum(axis=1)
    # position of the token predicted by row i is i + 1 (row 0 predicts after one token)
    expected = [draft.spec.alpha_at(i + 1) for i in range(len(ids))]
    assert np.allclose(overlap, expected, atol=1e-6)
    assert set(np.round(overlap, 6)) == {0.9, 0.4}  # both regimes occur
    for start in range(0, 80, 4):  # one regime per stretch
        assert len({draft.spec.alpha_at(i) for i in range(start, start + 4)}) == 1
    # the target is the same whatever the draft's regime
    _, plain = synthetic_pair(0.9, vocab_size=500, seed=3)
    assert np.array_equal(q, probs(plain.prefill(ids)))
    assert "0.4" in draft.name and "0.4" not in plain.name


def speculative_rounds(alpha: float, gamma: int, rounds: int, seed: int) -> tuple[int, int, int]:
    """Speculative sampling at temperature 1 with wanspec's own sampling floor: quantised p and q,
    `sample` for drafts, `verify_chain` for the acceptance tests, the residual or the bonus after.
    Returns (tokens tested, tokens accepted, rounds accepted in full)."""
    draft, target = synthetic_pair(alpha, vocab_size=400, seed=seed)
    rng = np.random.default_rng(seed)
    p_next = quantize(probs(draft.prefill([1, 2, 3]))[-1])  # after the committed prefix
    q_next = quantize(probs(target.prefill([1, 2, 3]))[-1])
    tested = accepted = full = 0
    for _ in range(rounds):
        start = draft.length
        p_rows, tokens = [p_next], []
        for _ in range(gamma):
            tokens.append(sample(p_rows[-1], rng))
            p_rows.append(quantize(probs(draft.extend(tokens[-1:]))[0]))
        q_rows = [q_next, *(quantize(row) for row in probs(target.extend(tokens)))]
        draft_counts = [int(row[x]) for row, x in zip(p_rows, tokens, strict=False)]
        n_ok = verify_chain(tokens, draft_counts, q_rows, rng)
        tested += min(n_ok + 1, gamma)
        accepted += n_ok
        full += n_ok == gamma
        if n_ok == gamma:
            extra = sample(q_rows[gamma], rng)
        else:
            extra = sample_residual(q_rows[n_ok], p_rows[n_ok], rng)
        keep = [*tokens[:n_ok], extra]
        draft.truncate(start)
        p_next = quantize(probs(draft.extend(keep))[-1])
        target.truncate(start)
        q_next = quantize(probs(target.extend(keep))[-1])
    return tested, accepted, full


@pytest.mark.parametrize("alpha", [0.4, 0.75])
def test_empirical_acceptance_rate_is_alpha(alpha: float) -> None:
    gamma, rounds = 4, 1500
    tested, accepted, full = speculative_rounds(alpha, gamma, rounds, seed=int(alpha * 100))
    # every acceptance test is a Bernoulli(α) trial: the overlap of p and q is α at each position
    rate = accepted / tested
    assert abs(rate - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / tested)
    p_full = alpha**gamma
    assert abs(full / rounds - p_full) < 4 * math.sqrt(p_full * (1 - p_full) / rounds)
    expected_len = (1 - alpha**gamma) / (1 - alpha) * alpha  # E[accepted] = Σ_{k=1..γ} α^k
    assert abs(accepted / rounds - expected_len) < 0.1
