"""Vocabulary alignment: tiny hand-built tokenizers (exact, fast), then the real SmolLM2 ↔ Qwen2.5
pair (slow)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from wanspec.vocab import (
    DraftRetokenizer,
    NoCommonMassError,
    TokenTable,
    VocabAlignment,
    check_pair,
    fingerprint,
    incomplete_utf8_tail,
)

BYTE_CHAR = bytes_to_unicode()  # transformers' byte-level table: an independent reference

# Byte-level (Ġ) target: 256 byte tokens + these merges (every merge result is a piece).
BL_MERGES = [
    ("h", "e"), ("l", "l"), ("ll", "o"), ("he", "llo"), ("Ġ", "hello"), ("Ġ", "w"), ("o", "r"),
    ("l", "d"), ("Ġw", "or"), ("Ġwor", "ld"), ("ð", "Ł"), ("ðŁ", "ĺ"), ("Ġ", "h"), ("Ġh", "ey"),
    ("e", "y"), ("Ġ", "Ġ"), ("Ċ", "Ċ"), ("i", "n"), ("in", "g"),
]  # fmt: skip
# Metaspace (▁) draft with byte fallback: a few letters, "▁", these merges, and "▁the"/"world".
SP_LETTERS = "abdeghilnorswy"
SP_MERGES = [
    ("e", "y"), ("h", "ey"), ("▁", "hey"), ("h", "e"), ("l", "l"), ("ll", "o"), ("he", "llo"),
    ("▁", "hello"), ("▁", "w"), ("o", "r"), ("l", "d"), ("▁w", "or"), ("▁wor", "ld"), ("▁", "▁"),
    ("i", "n"), ("in", "g"),
]  # fmt: skip
SP_EXTRA = ["▁the", "world"]

# Hand-computed: the multi-byte members of C (target piece, draft piece). Not in C: Ġhey (a
# target added " hey" has the same bytes), ðŁ/ðŁĺ/ĊĊ/Ġh (draft lacks them), hey/▁hey/▁the/
# world (target lacks them), <pad> (special on the target, plain added on the draft), <s> etc.
EXPECTED_MULTIBYTE = {
    ("he", "he"), ("ll", "ll"), ("llo", "llo"), ("hello", "hello"), ("Ġhello", "▁hello"),
    ("Ġw", "▁w"), ("or", "or"), ("ld", "ld"), ("Ġwor", "▁wor"), ("Ġworld", "▁world"),
    ("ĠĠ", "▁▁"), ("ey", "ey"), ("in", "in"), ("ing", "ing"), ("<|endoftext|>", "<|endoftext|>"),
}  # fmt: skip
# Every byte has a target token and a draft token (letter, "▁" or <0xHH>): all 256 are in C.
EXPECTED_COMMON = 256 + len(EXPECTED_MULTIBYTE)
TARGET_PAD, DRAFT_PAD = 7, 3

TEXTS = [
    " hello world\n",
    "  two  spaces and\n\nnewlines ",
    "hello😀 world",
    "naïve café, Ελληνικά, 日本語",
    "def f(x):\n\treturn [x, 2]  # 🤖🎉\n",
    "\n",
]


def _bpe_pieces(base: list[str], merges: list[tuple[str, str]]) -> list[str]:
    pieces = list(base)
    for left, right in merges:
        if left + right not in pieces:
            pieces.append(left + right)
    return pieces


def byte_level_tokenizer(
    *, normalizer: normalizers.Normalizer | None = None, extra: tuple[str, ...] = ()
) -> Tokenizer:
    pieces = _bpe_pieces([BYTE_CHAR[b] for b in range(256)], BL_MERGES) + list(extra)
    tok = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, BL_MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.add_special_tokens(["<|endoftext|>", "<pad>"])
    tok.add_tokens([AddedToken(" hey", special=False)])
    return tok


def metaspace_tokenizer(*, byte_fallback: bool = True, letters: str = SP_LETTERS) -> Tokenizer:
    base = ["<unk>", "<s>", "</s>"]
    base += [f"<0x{b:02X}>" for b in range(256)] if byte_fallback else []
    base += ["▁", *letters]
    pieces = _bpe_pieces(base, SP_MERGES if byte_fallback else []) + SP_EXTRA
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = SP_MERGES if byte_fallback else []
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=byte_fallback))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>", "<|endoftext|>"])
    tok.add_tokens([AddedToken("<pad>", special=False)])
    return tok


@pytest.fixture(scope="module")
def target_tok() -> Tokenizer:
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def draft_tok() -> Tokenizer:
    return metaspace_tokenizer()


@pytest.fixture(scope="module")
def align(target_tok: Tokenizer, draft_tok: Tokenizer) -> VocabAlignment:
    return VocabAlignment.build(
        draft_tok,
        target_tok,
        draft_width=draft_tok.get_vocab_size() + DRAFT_PAD,
        target_width=target_tok.get_vocab_size() + TARGET_PAD,
    )


@pytest.fixture(scope="module")
def reverse(target_tok: Tokenizer, draft_tok: Tokenizer) -> VocabAlignment:
    """The other direction: sentencepiece-style target, byte-level draft."""
    return VocabAlignment.build(target_tok, draft_tok)


def _pairs(al: VocabAlignment) -> set[tuple[str, str]]:
    return {
        (al.target_piece(int(t)), al.draft_piece(int(d)))
        for t, d in zip(al.common_target_ids, al.common_draft_ids, strict=True)
    }


# --- the common vocabulary -------------------------------------------------------------------


def test_byte_level_table_matches_transformers(target_tok: Tokenizer) -> None:
    table = TokenTable(target_tok)
    for b in range(256):
        assert table.token_bytes[target_tok.token_to_id(BYTE_CHAR[b])] == bytes([b])
    assert table.token_bytes[target_tok.token_to_id("Ġworld")] == b" world"


def test_common_vocabulary_is_the_hand_computed_one(align: VocabAlignment) -> None:
    pairs = _pairs(align)
    assert len(pairs) == EXPECTED_COMMON == align.stats().common
    assert {p for p in pairs if len(align.target.bytes_of([align.target_id_from_piece(p[0])])) > 1
            or p[0].startswith("<|")} == EXPECTED_MULTIBYTE  # fmt: skip
    for byte_pair in [("Ġ", "▁"), ("Ċ", "<0x0A>"), ("ð", "<0xF0>"), ("a", "a"), ("!", "<0x21>")]:
        assert byte_pair in pairs


def test_shadowed_ambiguous_and_disagreeing_tokens_are_excluded(
    align: VocabAlignment, draft_tok: Tokenizer, target_tok: Tokenizer
) -> None:
    for piece in ["<0x61>", "<0x20>", "▁the", "world", "<pad>", "<s>", "<unk>"]:
        assert align.draft_to_target[draft_tok.token_to_id(piece)] == -1, piece
    for piece in ["Ġhey", " hey", "ðŁĺ", "ĊĊ", "<pad>"]:
        assert not align.in_common[target_tok.token_to_id(piece)], piece


def test_maps_are_mutual_inverses_on_c(align: VocabAlignment) -> None:
    t_in_c = np.flatnonzero(align.in_common)
    d_in_c = np.flatnonzero(align.draft_in_common)
    assert len(t_in_c) == len(d_in_c) == EXPECTED_COMMON
    assert np.array_equal(align.draft_to_target[align.target_to_draft[t_in_c]], t_in_c)
    assert np.array_equal(align.target_to_draft[align.draft_to_target[d_in_c]], d_in_c)
    assert np.all(align.target_to_draft[~align.in_common] == -1)
    assert np.all(align.draft_to_target[~align.draft_in_common] == -1)
    for t in t_in_c:  # paired tokens stand for the same bytes
        d = align.target_to_draft[t]
        assert align.target.token_bytes[t] == align.draft.token_bytes[d]


def test_padding_rows_are_invalid_and_never_common(
    align: VocabAlignment, target_tok: Tokenizer, draft_tok: Tokenizer
) -> None:
    stats = align.stats()
    assert stats.target_width == target_tok.get_vocab_size() + TARGET_PAD
    assert stats.target_vocab == target_tok.get_vocab_size()
    assert stats.draft_vocab == draft_tok.get_vocab_size()
    assert not align.target_valid[-TARGET_PAD:].any() and align.target_valid[:-TARGET_PAD].all()
    assert not align.draft_valid[-DRAFT_PAD:].any()
    assert not align.in_common[-TARGET_PAD:].any()
    assert align.llm_only.sum() == stats.llm_only == stats.target_vocab - EXPECTED_COMMON
    with pytest.raises(ValueError, match="not a token"):
        align.target_piece(align.target_width - 1)


def test_arrays_are_immutable(align: VocabAlignment) -> None:
    with pytest.raises(ValueError, match="read-only"):
        align.in_common[0] = False
    with pytest.raises(ValueError, match="read-only"):
        align.target_to_draft[0] = 5


def test_reverse_direction_is_the_same_pairing(
    align: VocabAlignment, reverse: VocabAlignment
) -> None:
    assert {(d, t) for t, d in _pairs(align)} == _pairs(reverse)


def test_transformers_fast_tokenizer_gives_the_same_alignment(
    target_tok: Tokenizer, draft_tok: Tokenizer, align: VocabAlignment
) -> None:
    wrapped = VocabAlignment.build(
        PreTrainedTokenizerFast(tokenizer_object=draft_tok),
        PreTrainedTokenizerFast(tokenizer_object=target_tok),
        draft_width=align.draft_width,
        target_width=align.target_width,
    )
    assert np.array_equal(wrapped.target_to_draft, align.target_to_draft)


def test_identity_covers_every_token_including_ambiguous_ones(
    draft_tok: Tokenizer, target_tok: Tokenizer
) -> None:
    for tok in (draft_tok, target_tok):
        width = tok.get_vocab_size() + 5
        ident = VocabAlignment.identity(tok, width)
        assert ident.is_identity and ident.stats().common == tok.get_vocab_size()
        valid = np.flatnonzero(ident.target_valid)
        assert np.array_equal(ident.target_to_draft[valid], valid)
        assert not ident.in_common[-5:].any()


def test_tokens_without_byte_meaning_pair_only_with_themselves(draft_tok: Tokenizer) -> None:
    odd = byte_level_tokenizer(extra=("a b",))  # a raw space is not a byte-level character
    odd_id = odd.token_to_id("a b")
    assert TokenTable(odd).token_bytes[odd_id] is None
    assert VocabAlignment.identity(odd).target_to_draft[odd_id] == odd_id
    assert not VocabAlignment.build(draft_tok, odd).in_common[odd_id]
    with pytest.raises(ValueError, match="no byte meaning"):
        DraftRetokenizer(VocabAlignment.build(draft_tok, odd)).push(odd_id)


def test_small_common_vocabulary_warns(target_tok: Tokenizer) -> None:
    tiny = metaspace_tokenizer(byte_fallback=False, letters="abc")
    with pytest.warns(UserWarning, match="common vocabulary has only"):
        al = VocabAlignment.build(tiny, target_tok)
    assert _pairs(al) == {("a", "a"), ("b", "b"), ("c", "c"), ("Ġ", "▁"),
                          ("<|endoftext|>", "<|endoftext|>")}  # fmt: skip


def test_unsupported_decoder_is_a_clear_error() -> None:
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="unsupported tokenizer decoder"):
        TokenTable(tok)
    with pytest.raises(TypeError, match="fast tokenizer"):
        TokenTable("not a tokenizer")


# --- wrong pairs, fingerprints -----------------------------------------------------------------


def test_check_pair_rejects_wrong_model_tokenizer_pairs(target_tok: Tokenizer) -> None:
    size = target_tok.get_vocab_size()
    check_pair(target_tok, size)
    check_pair(target_tok, size + 100)
    with pytest.raises(ValueError, match="only 200 embedding"):
        check_pair(target_tok, 200, role="target model")
    with pytest.raises(ValueError, match="padding rows"):
        check_pair(target_tok, size + 5000)
    with pytest.raises(ValueError, match="positive int"):
        check_pair(target_tok, 0)
    with pytest.raises(ValueError, match="draft model"):
        VocabAlignment.build(target_tok, target_tok, draft_width=10)


def test_fingerprint_identifies_the_vocabulary(target_tok: Tokenizer, draft_tok: Tokenizer) -> None:
    same = fingerprint(byte_level_tokenizer())
    assert same == fingerprint(target_tok) == fingerprint(PreTrainedTokenizerFast(
        tokenizer_object=target_tok))  # fmt: skip
    assert len(same) == 64 and same != fingerprint(draft_tok)
    grown = byte_level_tokenizer()
    grown.add_special_tokens(["<extra>"])
    assert fingerprint(grown) != same


# --- projection ----------------------------------------------------------------------------------


def test_project_draft_numpy_is_tli(align: VocabAlignment) -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(align.draft_width), size=3)
    out = align.project_draft(probs)
    assert out.shape == (3, align.target_width)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-12)
    assert np.all(out[:, ~align.in_common] == 0)
    ratio = out[:, align.common_target_ids] / probs[:, align.common_draft_ids]
    np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio), rtol=1e-10)
    np.testing.assert_allclose(1 / ratio[:, 0], probs[:, align.common_draft_ids].sum(-1))


def test_project_draft_torch_matches_numpy(align: VocabAlignment) -> None:
    probs = torch.softmax(
        torch.randn(align.draft_width, generator=torch.Generator().manual_seed(1)), 0
    )
    out = align.project_draft(probs)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_allclose(
        out.numpy(), align.project_draft(probs.numpy()), rtol=1e-5, atol=1e-9
    )


def test_no_mass_on_c_is_a_clear_error(align: VocabAlignment, draft_tok: Tokenizer) -> None:
    probs = np.zeros(align.draft_width)
    probs[draft_tok.token_to_id("▁the")] = 1.0
    with pytest.raises(NoCommonMassError, match="no mass on the common"):
        align.project_draft(probs)
    logits = np.full(align.draft_width, -np.inf)
    logits[draft_tok.token_to_id("▁the")] = 0.0
    with pytest.raises(NoCommonMassError):
        align.project_draft_logits(torch.as_tensor(logits))
    with pytest.raises(ValueError, match="last dimension"):
        align.project_draft(np.ones(align.target_width))


def test_logit_projection_then_softmax_equals_tli(align: VocabAlignment) -> None:
    logits = torch.randn(2, align.draft_width, generator=torch.Generator().manual_seed(2))
    projected = align.project_draft_logits(logits)
    assert projected.shape == (2, align.target_width)
    assert torch.all(projected[:, torch.as_tensor(~align.in_common)] == float("-inf"))
    torch.testing.assert_close(
        torch.softmax(projected, -1), align.project_draft(torch.softmax(logits, -1))
    )
    np_out = align.project_draft_logits(logits.numpy())
    np.testing.assert_array_equal(np_out, projected.numpy())


def test_target_mass_covered(align: VocabAlignment, target_tok: Tokenizer) -> None:
    uniform = align.target_valid / align.target_valid.sum()
    assert align.target_mass_covered(uniform) == pytest.approx(
        EXPECTED_COMMON / target_tok.get_vocab_size()
    )
    q = np.zeros((2, align.target_width))
    q[0, target_tok.token_to_id("ðŁĺ")] = 1.0
    q[1, target_tok.token_to_id("Ġworld")] = 0.25
    q[1, target_tok.token_to_id("Ġhey")] = 0.75
    np.testing.assert_allclose(align.target_mass_covered(q), [0.0, 0.25])
    assert float(align.target_mass_covered(torch.as_tensor(q[1]))) == pytest.approx(0.25)


# --- pieces and retokenisation ------------------------------------------------------------------


def test_pieces_round_trip(align: VocabAlignment, target_tok: Tokenizer) -> None:
    for piece in ["Ġhello", "ðŁĺ", " hey", "<pad>", "Ċ"]:
        t = align.target_id_from_piece(piece)
        assert t == target_tok.token_to_id(piece) and align.target_piece(t) == piece
    with pytest.raises(ValueError, match="not a piece"):
        align.target_id_from_piece("▁hello")


def _anchored_decode(tok: Tokenizer, ids: list[int]) -> str:
    """The tokenizer's own decoder, with an anchor token first so that its start-of-text
    space stripping cannot touch our text."""
    anchor = tok.token_to_id("a")
    return tok.decode([anchor, *ids], skip_special_tokens=False)[1:]


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_retokenisation_round_trips_text(
    text: str, align: VocabAlignment, reverse: VocabAlignment, target_tok: Tokenizer,
    draft_tok: Tokenizer,
) -> None:  # fmt: skip
    for al, tgt, dft in ((align, target_tok, draft_tok), (reverse, draft_tok, target_tok)):
        target_ids = tgt.encode(text, add_special_tokens=False).ids
        seen = _anchored_decode(tgt, target_ids)  # the sentencepiece target adds a dummy " "
        assert seen in (text, " " + text) and al.target.bytes_of(target_ids) == seen.encode()
        retok = DraftRetokenizer(al)
        draft_ids = [d for t in target_ids for d in retok.push(t)]
        assert retok.pending == b""
        assert al.draft.bytes_of(draft_ids) == seen.encode()
        assert _anchored_decode(dft, draft_ids) == seen
        assert al.retokenize_for_draft(target_ids) == draft_ids


def test_partial_utf8_target_token_waits_for_its_completion(
    align: VocabAlignment, target_tok: Tokenizer, draft_tok: Tokenizer
) -> None:
    target_ids = target_tok.encode("😀", add_special_tokens=False).ids
    assert [align.target_piece(t) for t in target_ids] == ["ðŁĺ", "Ģ"]
    retok = DraftRetokenizer(align)
    assert retok.push(target_ids[0]) == []
    assert retok.pending == "😀".encode()[:3]
    out = retok.push(target_ids[1])
    assert retok.pending == b"" and _anchored_decode(draft_tok, out) == "😀"
    assert retok.push_piece("ðŁĺ") == [] and retok.flush() == [
        draft_tok.token_to_id(f"<0x{b:02X}>") for b in "😀".encode()[:3]
    ]
    assert retok.pending == b"" and retok.flush() == []


def test_common_tokens_map_directly(align: VocabAlignment, draft_tok: Tokenizer) -> None:
    retok = DraftRetokenizer(align)
    assert retok.push_piece("Ġworld") == [draft_tok.token_to_id("▁world")]
    assert retok.push_piece("<|endoftext|>") == [draft_tok.token_to_id("<|endoftext|>")]
    assert retok.push_piece("Ġhey") == [draft_tok.token_to_id("▁hey")]  # LLM-only, retokenised


def test_text_retokenisation_adds_no_dummy_prefix_or_bos(
    align: VocabAlignment, draft_tok: Tokenizer
) -> None:
    naive = draft_tok.encode("hello").tokens
    assert naive[0] == "▁hello"  # what a plain encode does to a continuation
    assert align.draft.encoder.encode("hello world", add_special_tokens=False).tokens == [
        "hello",
        "▁world",
    ]  # the continuation encoder itself, not only the byte-exact fallback behind it
    assert [align.draft_piece(d) for d in align.retokenize_for_draft("hello")] == ["hello"]
    assert [align.draft_piece(d) for d in align.retokenize_for_draft(" hello")] == ["▁hello"]
    special = align.retokenize_for_draft("<|endoftext|>")
    assert draft_tok.token_to_id("<|endoftext|>") not in special
    assert align.draft.bytes_of(special) == b"<|endoftext|>"


def test_normalising_draft_falls_back_to_exact_bytes(draft_tok: Tokenizer) -> None:
    nfc_draft = byte_level_tokenizer(normalizer=normalizers.NFC())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        al = VocabAlignment.build(nfc_draft, draft_tok)
    text = "cafe\u0301 hello"  # decomposed é: NFC would change the bytes
    assert nfc_draft.encode(text).tokens != al.retokenize_for_draft(text)
    assert al.draft.bytes_of(al.retokenize_for_draft(text)) == text.encode()


def test_invalid_utf8_bytes_are_spelled_with_byte_tokens(align: VocabAlignment) -> None:
    retok = DraftRetokenizer(align)
    ids = retok.push_bytes(b"a\xff\xfe b")
    assert align.draft.bytes_of(ids) == b"a\xff\xfe b"


def test_draft_without_byte_coverage_gets_unk_or_strict_error(target_tok: Tokenizer) -> None:
    no_bytes = metaspace_tokenizer(byte_fallback=False)
    with pytest.raises(ValueError, match="cannot spell byte 0xff"):
        TokenTable(no_bytes).encode_raw_bytes(b"\xff")
    with pytest.warns(UserWarning):
        al = VocabAlignment.build(no_bytes, target_tok)
    unk = no_bytes.token_to_id("<unk>")
    retok = DraftRetokenizer(al)
    ids = [d for t in target_tok.encode("ab😀😀 ba").ids for d in retok.push(t)]
    a, b, space = (no_bytes.token_to_id(p) for p in "ab▁")
    assert ids == [a, b, unk, unk, space, b, a]  # one unk per emoji: each completes in one push
    assert retok.lost_bytes == 8 and retok.flush() == []
    with pytest.raises(ValueError, match="cannot spell byte 0xf0"):
        al.retokenize_for_draft("a😀", strict=True)


@pytest.mark.parametrize(
    ("data", "cut"),
    [(b"", 0), (b"ab", 2), ("é".encode()[:1], 0), ("😀".encode()[:3], 0), ("a😀".encode()[:2], 1),
     ("😀".encode(), 4), (b"a\x80", 2), (b"\xff", 1), ("日".encode()[:2] + b"", 0)],
)  # fmt: skip
def test_incomplete_utf8_tail(data: bytes, cut: int) -> None:
    assert incomplete_utf8_tail(data) == cut


# --- the real pair: SmolLM2-135M draft ↔ Qwen2.5 target (tokenizers from the registry) ----------

REAL_TEXTS = [
    "Hello, world!\n",
    " 你好，世界。これは日本語です。",
    "def f(x):\n    return x**2  # 🤖🎉👍🏽\n",
    "Ελληνικά и русский текст, naïve café",
    "\t\t  spaces   and\n\n\nnewlines",
    "emoji family 👨‍👩‍👧‍👦 flags 🇫🇷 <|im_end|>",
]
QWEN_WIDTH = 151_936


@pytest.fixture(scope="module")
def qwen() -> PreTrainedTokenizerFast:
    from wanspec.models.registry import load_tokenizer

    return load_tokenizer("qwen2.5")


@pytest.fixture(scope="module")
def smol() -> PreTrainedTokenizerFast:
    from wanspec.models.registry import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def real(smol: PreTrainedTokenizerFast, qwen: PreTrainedTokenizerFast) -> VocabAlignment:
    return VocabAlignment.build(smol, qwen, draft_width=49_152, target_width=QWEN_WIDTH)


def _plain_and_added(tok: PreTrainedTokenizerFast) -> tuple[dict[str, int], dict[str, tuple]]:
    added = tok.backend_tokenizer.get_added_tokens_decoder()
    plain = {p: i for p, i in tok.backend_tokenizer.get_vocab(False).items() if i not in added}
    return plain, {a.content: (i, a.special) for i, a in added.items()}


@pytest.mark.slow
def test_real_pair_common_vocabulary(
    real: VocabAlignment, smol: PreTrainedTokenizerFast, qwen: PreTrainedTokenizerFast
) -> None:
    """Both are byte-level BPE over the same alphabet, so C must be exactly the pieces the two
    vocabularies share, plus the special tokens both declare special."""
    (q_plain, q_added), (s_plain, s_added) = _plain_and_added(qwen), _plain_and_added(smol)
    expected = {(q_plain[p], s_plain[p]) for p in q_plain.keys() & s_plain.keys()}
    expected |= {
        (q_added[c][0], s_added[c][0])
        for c in q_added.keys() & s_added.keys()
        if q_added[c][1] == s_added[c][1]
    }
    got = set(zip(real.common_target_ids.tolist(), real.common_draft_ids.tolist(), strict=True))
    assert got == expected
    stats = real.stats()
    assert (stats.draft_vocab, stats.target_vocab, stats.target_width) == (
        len(smol),
        len(qwen),
        QWEN_WIDTH,
    )
    assert not real.target_valid[len(qwen) :].any() and not real.in_common[len(qwen) :].any()
    t_in_c = np.flatnonzero(real.in_common)
    assert np.array_equal(real.draft_to_target[real.target_to_draft[t_in_c]], t_in_c)


@pytest.mark.slow
@pytest.mark.parametrize("text", REAL_TEXTS)
def test_real_llm_only_tokens_retokenise_to_the_same_text(
    text: str, real: VocabAlignment, smol: PreTrainedTokenizerFast, qwen: PreTrainedTokenizerFast
) -> None:
    target_ids = qwen.encode(text, add_special_tokens=False)
    assert any(not real.in_common[t] for t in target_ids)  # the O path is exercised
    retok, draft_ids = DraftRetokenizer(real), []
    for t in target_ids:  # as on the wire: common tokens by id, LLM-only ones by piece
        draft_ids += retok.push(t) if real.in_common[t] else retok.push_piece(real.target_piece(t))
    assert retok.pending == b""
    assert smol.decode(draft_ids, clean_up_tokenization_spaces=False) == text
    assert real.draft.bytes_of(draft_ids) == text.encode()


@pytest.mark.slow
def test_real_partial_utf8_target_token_is_held_back(real: VocabAlignment) -> None:
    retok = DraftRetokenizer(real)
    held = real.target_id_from_piece("ĠðŁĳ")  # " " + the first 3 bytes of 👍 (F0 9F 91 8D)
    assert not real.in_common[held]
    assert real.draft.bytes_of(retok.push(held)) == b" " and retok.pending == b"\xf0\x9f\x91"
    ids = retok.push(real.target_id_from_piece("į"))  # the last byte, 0x8D
    assert retok.pending == b"" and real.draft.bytes_of(ids) == "👍".encode()


@pytest.mark.slow
def test_real_reverse_direction_and_identity(
    smol: PreTrainedTokenizerFast, qwen: PreTrainedTokenizerFast, real: VocabAlignment
) -> None:
    reverse = VocabAlignment.build(qwen, smol, draft_width=QWEN_WIDTH)
    assert reverse.stats().common == real.stats().common
    for text in REAL_TEXTS:  # Qwen (NFC-normalising) as the draft still gets the exact bytes
        ids = reverse.retokenize_for_draft(smol.encode(text, add_special_tokens=False))
        assert qwen.decode(ids, clean_up_tokenization_spaces=False) == text
    ident = VocabAlignment.identity(qwen, QWEN_WIDTH)
    assert ident.is_identity and ident.stats().common == len(qwen)
    assert ident.target_valid.sum() == len(qwen) < QWEN_WIDTH


@pytest.mark.slow
def test_real_wrong_pairs_and_fingerprints(
    real: VocabAlignment, qwen: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(ValueError, match="only 49152 embedding"):
        check_pair(real.target, 49_152, role="draft model")
    with pytest.raises(ValueError, match="wrong tokenizer"):
        check_pair(real.draft, QWEN_WIDTH, role="target model")
    assert fingerprint(real.target) != fingerprint(real.draft)
    assert fingerprint(real.target) == fingerprint(qwen.backend_tokenizer)
