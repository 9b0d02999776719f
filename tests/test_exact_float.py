"""Exact with respect to the target's FLOAT q.

The cloud decides with the float q and the draft's exactly reported p̃; a method that ships q
rounds it to `q_bits`-bit counts and is exact with respect to that q̂. The primitives are checked
directly; end to end, a heavy-tailed synthetic target (30,000 tokens, most of its tail below
1/65535 per token) makes the difference visible: 16-bit rounding moves ~11 % of the mass per
token, which the tests show exactly (by enumeration) and by a run at q_bits=16, while every
lossless method at the default precision follows the float law.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from exact_rng import exact_law
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec
from wanspec.protocols.registry import METHODS
from wanspec.protocols.settings import GenerationSettings
from wanspec.sampling import (
    PROB_SCALE,
    Q_BITS,
    dequantize,
    hybrid_bins,
    pick,
    quantize,
    round_probs,
    target_probs,
)
from worlds import PROMPT_IDS, World

LOSSLESS = [name for name, m in METHODS.items() if m.lossless]
# lossless methods that ship q (xcosd-auto in its HR rounds: it tries HR after 16 rejections;
# deepspec-tree in the chains it sends without their p̃, the first one always)
SHIPS_Q = [
    *("naive", "cosd", "xcosd", "xcosd-auto"),
    *("picospec", "acespec", "deepspec", "deepspec-tree"),
]

# ----------------------------------------------------------------------------- primitives


def test_pick_is_the_inverse_cdf_of_one_float_uniform() -> None:
    weights = np.array([0.25, 0.0, 0.75])
    for seed in range(20):
        u = np.random.default_rng(seed).random()
        assert pick(weights, np.random.default_rng(seed)) == (0 if u < 0.25 else 2)
    law = exact_law(lambda rng: pick(np.array([0.1, 0.0, 0.2]), rng))
    assert law == {0: Fraction(0.1) / (Fraction(0.1) + Fraction(0.2)), 2: law[2]}


@pytest.mark.parametrize(
    ("weights", "message"),
    [(np.zeros(3), "not all zero"), (np.array([0.5, -0.1]), "non-negative"),
     (np.array([np.inf, 1.0]), "finite"), (np.array([]), "non-empty")],
)  # fmt: skip
def test_pick_refuses_what_is_not_a_distribution(weights: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pick(weights, np.random.default_rng(0))


def heavy_tail(vocab: int, tail_units: float = 0.4, head: int = 5, zeros: int = 5) -> np.ndarray:
    """A float q: `head` tokens with weights 5:4:…, `zeros` tokens at 0, every other token at
    `tail_units`/65535 (below one 16-bit count, so 16-bit rounding must drop most of them)."""
    q = np.full(vocab, tail_units / PROB_SCALE)
    q[head : head + zeros] = 0.0
    weights = np.arange(head, 0, -1, dtype=np.float64)
    q[:head] = (1.0 - q.sum() + q[:head].sum()) * weights / weights.sum()
    return q


@pytest.mark.parametrize("bits", Q_BITS)
def test_rounding_sums_to_the_scale_and_reports_its_exact_tv(bits: int) -> None:
    q = heavy_tail(3000)
    rounded = round_probs(q, bits)
    assert rounded.counts.sum() == (1 << bits) - 1 and rounded.bits == bits
    assert rounded.tv == pytest.approx(0.5 * np.abs(dequantize(rounded.counts, bits) - q).sum())
    assert np.array_equal(rounded.probs, rounded.counts / ((1 << bits) - 1))


def test_rounding_error_falls_with_the_precision_and_16_bits_drops_the_tail() -> None:
    q = heavy_tail(3000)
    tvs = [round_probs(q, bits).tv for bits in Q_BITS]
    assert tvs[0] > 1e-2 and tvs[0] > tvs[1] > tvs[2] and tvs[2] < 1e-5
    dropped = (round_probs(q, 16).counts == 0) & (q > 0)
    assert q[dropped].sum() > 0.01  # 60 % of 2990 tail tokens at 0.4/65535 each


def test_hybrid_bins_are_q_on_c_then_the_mass_on_o() -> None:
    q = np.array([0.1, 0.2, 0.3, 0.4])
    common = np.array([True, False, True, False])
    assert hybrid_bins(q, common, np.array([2, 0])).tolist() == pytest.approx([0.3, 0.1, 0.6])


# ----------------------------------------------------------------------------- heavy-tailed world

TAIL_UNITS = 0.4  # each tail token's q, in 16-bit counts
WIDTH = 30_000


@dataclass(frozen=True)
class HeavyTailSpec(SyntheticSpec):
    """SyntheticSpec whose target also spreads mass over every other token, each below one
    16-bit count (A: head, B: draft-only, the rest: tail); the draft is α·q + (1 − α)·U(B)."""

    def probs(self, context, role):  # type: ignore[override]
        a, b = self.supports(context)
        q = np.full(self.vocab_size, TAIL_UNITS / PROB_SCALE)
        q[a], q[b] = 0.0, 0.0
        q[a] = (1.0 - q.sum()) * self.target_weights
        if role == "target":
            return q
        p = self.alpha * q
        p[b] = (1.0 - self.alpha) / self.draft_extra
        return p


def byte_level_tokenizer(size: int):
    """A byte-level tokenizer with `size` ids (byte pieces, then "Ġt<i>" pieces, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    vocab.update({f"Ġt{i}": len(vocab) + i for i in range(size - len(vocab))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


class HeavyTailWorld(World):
    """World's simulator runs, on a shared 30,000-token vocabulary with a heavy-tailed target."""

    def __init__(self) -> None:  # not World.__init__, which builds tiny tokenizers
        from wanspec.vocab import VocabAlignment

        tokenizer = byte_level_tokenizer(WIDTH)
        self.alignment = VocabAlignment.build(tokenizer, tokenizer)
        spec = HeavyTailSpec(0.6, vocab_size=WIDTH, seed=1)
        self.target, self.draft = SyntheticLM(spec, "target"), SyntheticLM(spec, "draft")

    def position_laws(self, tokens: list[int]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """For each generated token: its class, and the float and 16-bit laws of the classes
        at its position (rows in CLASSES order)."""
        params = GenerationSettings().sampling
        valid = self.alignment.target_valid
        names, float_laws, q16_laws = [], [], []
        for k, token in enumerate(tokens):
            logits = self.target.rows([[*PROMPT_IDS, *tokens[:k]]])[0]
            q = target_probs(logits, params, valid)
            q16 = dequantize(quantize(q))
            head = np.argsort(-q, kind="stable")[:5]
            labels = np.where(q16 > 0, "kept", "dropped").astype(object)
            labels[q == 0] = "zero"
            labels[head] = [f"head{r}" for r in range(5)]
            names.append(labels[token])
            float_laws.append([q[labels == c].sum() for c in CLASSES])
            q16_laws.append([q16[labels == c].sum() for c in CLASSES])
        return names, np.array(float_laws), np.array(q16_laws)


CLASSES = ("head0", "head1", "head2", "head3", "head4", "kept", "dropped", "zero")
TOKENS = 500  # ≈ 55 expected "dropped" tokens, which 16-bit rounding never emits
METHOD_TOKENS = 300  # per lossless method: 16-bit rounding would sit ≈ 6 sd off


def z_scores(names: list[str], laws: np.ndarray) -> np.ndarray:
    """Per class: (observed − expected) / sd, expected from each position's own law (a
    martingale sum, so exact laws make every z ≈ N(0, 1) whatever the dependence)."""
    observed = np.array([[n == c for c in CLASSES] for n in names], dtype=np.float64).sum(0)
    expected, variance = laws.sum(0), (laws * (1 - laws)).sum(0)
    return (observed - expected) / np.sqrt(np.maximum(variance, 1e-12))


@pytest.fixture(scope="module")
def heavy_world() -> HeavyTailWorld:
    return HeavyTailWorld()


@pytest.mark.slow
def test_sixteen_bit_rounding_would_fail_the_float_law_test(heavy_world: HeavyTailWorld) -> None:
    """Exactly, without sampling: over the positions of a run the 16-bit law expects no
    "dropped" token where the float law expects ~55, far beyond the 5-sd bound used below."""
    sim, _, _ = heavy_world.run("ar", seed=0, max_new_tokens=TOKENS)
    _, float_laws, q16_laws = heavy_world.position_laws(sim.tokens)
    used = [CLASSES.index("dropped"), CLASSES.index("kept")]  # the others may have no variance
    sd = np.sqrt((float_laws * (1 - float_laws)).sum(0))[used]
    gap = np.abs(q16_laws.sum(0) - float_laws.sum(0))[used] / sd
    assert (gap > 7).all(), gap


@pytest.mark.slow
@pytest.mark.parametrize("method", LOSSLESS)
def test_every_lossless_method_samples_the_float_law(
    heavy_world: HeavyTailWorld, method: str
) -> None:
    sim, _, cloud = heavy_world.run(
        method, seed=1, max_new_tokens=METHOD_TOKENS, gamma=3, srdv_k=1, srdv_m=1, tree_budget=4
    )
    names, float_laws, _ = heavy_world.position_laws(sim.tokens)
    z = z_scores(names, float_laws)
    assert len(names) == METHOD_TOKENS and "zero" not in names
    assert np.all(np.abs(z) < 5), dict(zip(CLASSES, z.round(2), strict=True))
    tv = cloud.counters.get("tv_bound", 0.0)
    assert (tv > 0) == (method in SHIPS_Q) and tv < 1e-5 * METHOD_TOKENS


@pytest.mark.slow
def test_a_method_shipping_16_bit_q_fails_the_same_test(heavy_world: HeavyTailWorld) -> None:
    sim, _, cloud = heavy_world.run("naive", seed=1, max_new_tokens=TOKENS, gamma=3, q_bits=16)
    names, float_laws, _ = heavy_world.position_laws(sim.tokens)
    dropped = CLASSES.index("dropped")
    assert z_scores(names, float_laws)[dropped] < -5
    # only bonus tokens (drawn from the float q, ~1 position in 9 here) reach that tail
    assert names.count("dropped") < 0.3 * float_laws[:, dropped].sum()
    assert cloud.counters["tv_bound"] > 0.05 * TOKENS
