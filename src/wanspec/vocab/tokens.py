"""Vocabulary alignment between a draft (edge) tokenizer and a target (cloud) tokenizer.

Every token is compared by the exact bytes it stands for, so "Ġhello" (byte-level BPE), "▁hello"
(sentencepiece / Metaspace) and " hello" all mean b" hello", and "<0x0A>" (byte fallback) and "Ċ"
(byte-level) both mean b"\\n". Rules for the common vocabulary C (SPEC, Notation):

- A target token t and a draft token d are paired when they are the only tokens with those bytes
  on their sides (one-to-one) and their kinds agree: ordinary vocabulary tokens (incl. byte
  fallback) pair with ordinary tokens; an added token pairs only with an added token of the same
  `special` flag (e.g. "<|endoftext|>" special on both sides). Added and special tokens stand
  for their literal content.
- Ambiguous bytes (several tokens on one side) are excluded, with two exceptions that keep exact
  meaning: (a) when both sides hold the very same entries (same pieces and kinds, e.g. the same
  tokenizer) they pair piece by piece; (b) a byte-fallback token "<0xHH>" is shadowed by an
  ordinary token with the same bytes (its tokenizer never emits it then).
- Tokens with no byte meaning (empty, or not decodable) and padding rows beyond the tokenizer
  (logits width > tokenizer size) are never in C; padding rows are also not valid target tokens.

LLM-only tokens travel as their vocabulary piece (`target_piece`) and the edge turns finalised
target tokens into draft ids with `DraftRetokenizer`: byte-exact, incremental, new text only.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import torch
from tokenizers import Tokenizer

__all__ = [
    "DraftRetokenizer",
    "Kind",
    "NoCommonMassError",
    "TokenTable",
    "VocabAlignment",
    "VocabStats",
    "backend_of",
    "check_pair",
    "common_pairs",
    "fingerprint",
    "incomplete_utf8_tail",
]

MIN_COMMON_WARN = 100
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


class NoCommonMassError(ValueError):
    """The draft distribution puts no mass on the common vocabulary: TLI cannot draft here."""


class Kind(IntEnum):
    """What an id is in its tokenizer; only ids of compatible kinds can pair."""

    ABSENT = 0  # padding row: no token
    REGULAR = 1
    BYTE = 2  # byte-fallback "<0xHH>"
    ADDED = 3  # added, not special
    SPECIAL = 4


def _byte_level_chars() -> dict[str, int]:
    """The byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the other bytes
    take the code points 256, 257, ... in byte order (so every byte gets a visible character)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    chars.update({chr(256 + i): b for i, b in enumerate(others)})
    return chars


_BYTE_LEVEL_CHARS = _byte_level_chars()
# str.translate table: byte-level char -> the Latin-1 char of its byte; any other char below 256
# -> a code point that Latin-1 cannot encode, so pieces with foreign characters are rejected.
_BYTE_LEVEL_TRANSLATE = {c: 0x10FFFF for c in range(256)} | {
    ord(c): b for c, b in _BYTE_LEVEL_CHARS.items()
}


def backend_of(tokenizer: Any) -> Tokenizer:
    """The `tokenizers.Tokenizer` behind a Hugging Face fast tokenizer (or the object itself)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(
            f"expected a fast tokenizer (tokenizers.Tokenizer or PreTrainedTokenizerFast), "
            f"got {type(tokenizer).__name__}"
        )
    return backend


@dataclass(frozen=True)
class _Scheme:
    """How vocabulary pieces spell bytes, read off the tokenizer's decoder."""

    byte_level: bool
    space_marker: str | None  # Metaspace replacement ("▁") when not byte-level
    byte_fallback: bool

    @property
    def name(self) -> str:
        return "byte_level" if self.byte_level else "metaspace"


def _decoder_parts(node: dict | None) -> list[dict]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [part for sub in node.get("decoders", []) for part in _decoder_parts(sub)]
    return [node]


def _detect_scheme(backend: Tokenizer) -> _Scheme:
    decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else None
    parts = _decoder_parts(decoder)
    types = {part.get("type") for part in parts}
    fallback = "ByteFallback" in types or bool(getattr(backend.model, "byte_fallback", False))
    if "ByteLevel" in types:
        return _Scheme(byte_level=True, space_marker=None, byte_fallback=False)
    for part in parts:
        if part.get("type") == "Metaspace":
            return _Scheme(False, part.get("replacement", "▁"), fallback)
        if part.get("type") == "Replace" and part.get("content") == " ":
            return _Scheme(False, (part.get("pattern") or {}).get("String"), fallback)
    raise ValueError(
        f"unsupported tokenizer decoder {sorted(t for t in types if t)}: wanspec.vocab needs "
        "byte-level BPE (Ġ) or sentencepiece-style (▁, Metaspace/Replace) tokenizers"
    )


def _piece_bytes(piece: str, scheme: _Scheme) -> tuple[bytes | None, Kind]:
    """Bytes an ordinary vocabulary piece stands for, and whether it is a byte-fallback token."""
    if scheme.byte_level:
        try:
            return piece.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1"), Kind.REGULAR
        except UnicodeEncodeError:
            return None, Kind.REGULAR
    match = _BYTE_FALLBACK.match(piece) if scheme.byte_fallback else None
    if match:
        return bytes([int(match.group(1), 16)]), Kind.BYTE
    text = piece.replace(scheme.space_marker, " ") if scheme.space_marker else piece
    return text.encode("utf-8"), Kind.REGULAR


def _without_prepend(node: dict | None) -> dict | None:
    """Drop sentencepiece's dummy-prefix normaliser (Prepend "▁") from a normaliser tree."""
    if node is None or node.get("type") == "Prepend":
        return None
    if node.get("type") == "Sequence":
        subs = [_without_prepend(sub) for sub in node.get("normalizers", [])]
        return {**node, "normalizers": [sub for sub in subs if sub is not None]}
    return node


def _without_prefix_space(node: dict | None) -> dict | None:
    """Turn off the leading-space injection of Metaspace / ByteLevel pre-tokenisers."""
    if node is None:
        return None
    node = dict(node)
    if node.get("type") == "Sequence":
        node["pretokenizers"] = [_without_prefix_space(sub) for sub in node["pretokenizers"]]
    elif node.get("type") == "Metaspace":
        node["prepend_scheme"] = "never"
        if "add_prefix_space" in node:
            node["add_prefix_space"] = False
    elif node.get("type") == "ByteLevel":
        node["add_prefix_space"] = False
    return node


def _state(component: Any) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _continuation_encoder(backend: Tokenizer) -> Tokenizer:
    """A copy of `backend` for text that continues a context: no dummy prefix (no leading "▁"
    or space injected), no truncation/padding, and special-token strings in the text stay text.
    (BOS/EOS templates are off anyway: callers pass add_special_tokens=False.)"""
    normalizer, pre_tokenizer = _state(backend.normalizer), _state(backend.pre_tokenizer)
    changed = _without_prepend(normalizer), _without_prefix_space(pre_tokenizer)
    text = backend.to_str()
    if changed != (normalizer, pre_tokenizer):  # the JSON round trip costs ~1 s for 150k merges
        config = json.loads(text)
        config["normalizer"], config["pre_tokenizer"] = changed
        text = json.dumps(config)
    encoder = Tokenizer.from_str(text)
    encoder.no_truncation()
    encoder.no_padding()
    encoder.encode_special_tokens = True
    return encoder


class TokenTable:
    """One tokenizer seen as id → (piece, bytes, kind), plus a byte-exact continuation encoder."""

    def __init__(self, tokenizer: Any) -> None:
        backend = backend_of(tokenizer)
        self._backend = backend
        self.scheme = _detect_scheme(backend)
        vocab = backend.get_vocab(with_added_tokens=False)
        added = backend.get_added_tokens_decoder()
        self.size = max([*vocab.values(), *added.keys()], default=-1) + 1
        self.pieces: list[str | None] = [None] * self.size
        self.token_bytes: list[bytes | None] = [None] * self.size
        self.kinds = np.zeros(self.size, dtype=np.int8)
        for piece, idx in vocab.items():
            self.pieces[idx] = piece
            self.token_bytes[idx], self.kinds[idx] = _piece_bytes(piece, self.scheme)
        for idx, token in added.items():
            self.pieces[idx] = token.content
            self.token_bytes[idx] = token.content.encode("utf-8")
            self.kinds[idx] = Kind.SPECIAL if token.special else Kind.ADDED
        self.piece_to_id = {p: i for i, p in enumerate(self.pieces) if p is not None}
        self.unk_id: int | None = self.piece_to_id.get(getattr(backend.model, "unk_token", None))
        self.kinds.setflags(write=False)

    @cached_property
    def encoder(self) -> Tokenizer:
        """The continuation encoder (built on first use: only the draft side needs one)."""
        return _continuation_encoder(self._backend)

    @property
    def count(self) -> int:
        """Number of real tokens (ids that exist)."""
        return int(np.count_nonzero(self.kinds))

    def valid_mask(self, width: int) -> np.ndarray:
        mask = np.zeros(width, dtype=bool)
        mask[: self.size] = self.kinds != Kind.ABSENT
        return mask

    def check_id(self, idx: int) -> int:
        if not 0 <= idx < self.size or self.kinds[idx] == Kind.ABSENT:
            raise ValueError(f"token id {idx} is not a token of this tokenizer (size {self.size})")
        return int(idx)

    def bytes_of(self, ids: Iterable[int]) -> bytes:
        """The exact bytes a sequence of ids stands for (no leading-space stripping)."""
        out = bytearray()
        for idx in ids:
            data = self.token_bytes[self.check_id(idx)]
            if data is None:
                raise ValueError(f"token {idx} ({self.pieces[idx]!r}) has no byte meaning")
            out += data
        return bytes(out)

    def encode_text(self, text: str, *, strict: bool = True) -> list[int]:
        """Ids whose bytes are exactly `text`: the continuation encoder when it round-trips (it
        may not, e.g. under NFC normalisation or <unk>), else greedy longest byte match."""
        ids = self.encoder.encode(text, add_special_tokens=False).ids
        data = text.encode("utf-8")
        try:
            if self.bytes_of(ids) == data:
                return ids
        except ValueError:
            pass
        return self.encode_raw_bytes(data, strict=strict)

    def encode_bytes(self, data: bytes, *, strict: bool = True) -> list[int]:
        """Ids for arbitrary bytes: text when they are valid UTF-8, byte tokens otherwise."""
        try:
            return self.encode_text(data.decode("utf-8"), strict=strict)
        except UnicodeDecodeError:
            return self.encode_raw_bytes(data, strict=strict)

    @cached_property
    def _ordinary_by_bytes(self) -> tuple[dict[bytes, int], int]:
        table: dict[bytes, int] = {}
        for idx in np.flatnonzero((self.kinds == Kind.REGULAR) | (self.kinds == Kind.BYTE)):
            data = self.token_bytes[idx]
            if not data:
                continue
            best = table.get(data)
            if best is None or self.kinds[idx] < self.kinds[best]:  # prefer REGULAR over BYTE
                table[data] = int(idx)
        return table, max(map(len, table), default=0)

    def _longest_match(self, data: bytes, pos: int) -> tuple[int | None, int]:
        table, longest = self._ordinary_by_bytes
        for size in range(min(longest, len(data) - pos), 0, -1):
            idx = table.get(data[pos : pos + size])
            if idx is not None:
                return idx, size
        return None, 1

    def encode_raw_bytes(self, data: bytes, *, strict: bool = True) -> list[int]:
        """Greedy longest-match segmentation over ordinary tokens (always complete for byte-level
        and byte-fallback vocabularies). A byte no token spells raises when `strict`; otherwise
        each run of such bytes becomes one unk token (or is dropped when there is none)."""
        ids: list[int] = []
        pos, in_gap = 0, False
        while pos < len(data):
            idx, size = self._longest_match(data, pos)
            if idx is None and strict:
                raise ValueError(f"the vocabulary cannot spell byte {data[pos]:#04x}")
            if idx is None and not in_gap and self.unk_id is not None:
                ids.append(self.unk_id)
            if idx is not None:
                ids.append(idx)
            pos, in_gap = pos + size, idx is None
        return ids


def fingerprint(tokenizer: Any) -> str:
    """sha256 over the vocabulary, the added/special tokens and the piece scheme: equal
    fingerprints mean both sides read token ids identically (for the wire hello)."""
    table = tokenizer if isinstance(tokenizer, TokenTable) else TokenTable(tokenizer)
    digest = hashlib.sha256(table.scheme.name.encode())
    digest.update(json.dumps(table.pieces, ensure_ascii=False).encode("utf-8"))  # id order
    digest.update(table.kinds.tobytes())
    return digest.hexdigest()


def check_pair(
    tokenizer: Any, width: int, *, role: str = "model", max_padding: int | None = None
) -> None:
    """Raise a clear error when `tokenizer` cannot belong to a model with `width` logits rows:
    ids beyond the rows, or far more padding rows than a model pads (default: max(1024, size/8))."""
    table = tokenizer if isinstance(tokenizer, TokenTable) else TokenTable(tokenizer)
    if isinstance(width, bool) or not isinstance(width, int | np.integer) or width <= 0:
        raise ValueError(f"{role} width must be a positive int, got {width!r}")
    if table.size > width:
        raise ValueError(
            f"tokenizer has ids up to {table.size - 1} but the {role} has only {width} "
            "embedding/logit rows: wrong tokenizer for this model?"
        )
    limit = max(1024, table.size // 8) if max_padding is None else max_padding
    if width - table.size > limit:
        raise ValueError(
            f"the {role} has {width} rows but its tokenizer only {table.size} ids "
            f"({width - table.size} padding rows > {limit}): wrong tokenizer for this model?"
        )


def _compatible(a: int, b: int) -> bool:
    """Ordinary (REGULAR/BYTE) pairs with ordinary; added/special only with the same kind."""
    a, b = int(a), int(b)
    return (a <= Kind.BYTE and b <= Kind.BYTE) or a == b


def _groups(table: TokenTable) -> dict[bytes | tuple, list[int]]:
    """Ids by the bytes they stand for. Tokens without byte meaning (empty, undecodable) can only
    meet the very same piece of the same kind under the same scheme (e.g. the same tokenizer)."""
    groups: dict[bytes | tuple, list[int]] = {}
    for idx in np.flatnonzero(table.kinds != Kind.ABSENT).tolist():
        data = table.token_bytes[idx]
        key = data or (table.scheme.name, table.pieces[idx], int(table.kinds[idx]))
        groups.setdefault(key, []).append(idx)
    return groups


def _unshadowed(table: TokenTable, ids: list[int]) -> list[int]:
    """Byte-fallback tokens never get emitted when an ordinary token has the same bytes."""
    ordinary = [i for i in ids if table.kinds[i] != Kind.BYTE]
    return ordinary if ordinary and len(ordinary) < len(ids) else ids


def _pair_group(
    target: TokenTable, tids: list[int], draft: TokenTable, dids: list[int]
) -> list[tuple[int, int]]:
    """Pairs among the tokens that stand for the same bytes (see module docstring)."""
    if len(tids) > 1 or len(dids) > 1:
        tkeys = {(target.pieces[i], int(target.kinds[i])): i for i in tids}
        dkeys = {(draft.pieces[i], int(draft.kinds[i])): i for i in dids}
        if tkeys.keys() == dkeys.keys():
            return [(tkeys[k], dkeys[k]) for k in tkeys]
        tids, dids = _unshadowed(target, tids), _unshadowed(draft, dids)
    one_to_one = len(tids) == 1 and len(dids) == 1
    if one_to_one and _compatible(target.kinds[tids[0]], draft.kinds[dids[0]]):
        return [(tids[0], dids[0])]
    return []


def common_pairs(target: TokenTable, draft: TokenTable) -> list[tuple[int, int]]:
    """(target id, draft id) pairs of the common vocabulary C, sorted by target id."""
    draft_groups = _groups(draft)
    pairs: list[tuple[int, int]] = []
    for data, tids in _groups(target).items():
        if data in draft_groups:
            pairs.extend(_pair_group(target, tids, draft, draft_groups[data]))
    return sorted(pairs)


@dataclass(frozen=True)
class VocabStats:
    common: int  # |C|
    draft_vocab: int  # |V_S| (real tokens, padding rows not counted)
    target_vocab: int  # |V_L|
    draft_width: int
    target_width: int

    @property
    def llm_only(self) -> int:
        """|O| = |V_L \\ C|."""
        return self.target_vocab - self.common

    @property
    def common_share(self) -> float:
        """|C| / |V_L|."""
        return self.common / self.target_vocab


def _map_arrays(
    t_ids: np.ndarray, d_ids: np.ndarray, target_width: int, draft_width: int
) -> dict[str, np.ndarray]:
    draft_to_target = np.full(draft_width, -1, dtype=np.int64)
    target_to_draft = np.full(target_width, -1, dtype=np.int64)
    draft_to_target[d_ids], target_to_draft[t_ids] = t_ids, d_ids
    return {
        "draft_to_target": draft_to_target,
        "target_to_draft": target_to_draft,
        "in_common": target_to_draft >= 0,
        "draft_in_common": draft_to_target >= 0,
        "common_target_ids": t_ids.copy(),
        "common_draft_ids": d_ids.copy(),
    }


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class VocabAlignment:
    """Immutable draft ↔ target token maps over the full logits widths (padding rows included).

    `in_common[t]` / `draft_in_common[d]` mark C; `target_to_draft` / `draft_to_target` are −1
    outside C; `target_valid` / `draft_valid` are False on padding rows.
    """

    draft: TokenTable
    target: TokenTable
    draft_width: int
    target_width: int
    draft_valid: np.ndarray
    target_valid: np.ndarray
    draft_to_target: np.ndarray
    target_to_draft: np.ndarray
    in_common: np.ndarray
    draft_in_common: np.ndarray
    common_target_ids: np.ndarray  # C in target ids, ascending
    common_draft_ids: np.ndarray  # the paired draft ids, same order
    _torch_index: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        draft_tokenizer: Any,
        target_tokenizer: Any,
        *,
        draft_width: int | None = None,
        target_width: int | None = None,
    ) -> VocabAlignment:
        """Align two tokenizers; widths are the models' logits rows (default: tokenizer sizes)."""
        draft = _table(draft_tokenizer)
        target = draft if target_tokenizer is draft_tokenizer else _table(target_tokenizer)
        draft_width = draft.size if draft_width is None else draft_width
        target_width = target.size if target_width is None else target_width
        check_pair(draft, draft_width, role="draft model")
        check_pair(target, target_width, role="target model")
        pairs = np.array(common_pairs(target, draft), dtype=np.int64).reshape(-1, 2)
        if len(pairs) < MIN_COMMON_WARN:
            warnings.warn(
                f"common vocabulary has only {len(pairs)} tokens: TLI drafting will rarely match",
                stacklevel=2,
            )
        arrays = _map_arrays(pairs[:, 0], pairs[:, 1], target_width, draft_width)
        arrays["draft_valid"] = draft.valid_mask(draft_width)
        arrays["target_valid"] = target.valid_mask(target_width)
        arrays = {name: _frozen(array) for name, array in arrays.items()}
        return cls(draft, target, draft_width, target_width, **arrays)

    @classmethod
    def identity(cls, tokenizer: Any, width: int | None = None) -> VocabAlignment:
        """Shared vocabulary: the same tokenizer on both sides, so C = every valid token."""
        table = _table(tokenizer)
        alignment = cls.build(table, table, draft_width=width, target_width=width)
        if not alignment.is_identity:  # cannot happen: every entry meets itself
            raise RuntimeError("identity alignment does not cover the whole vocabulary")
        return alignment

    def __repr__(self) -> str:
        return f"VocabAlignment({self.stats()})"

    @property
    def is_identity(self) -> bool:
        """True when C is every valid target token and every map is the identity."""
        ids = np.flatnonzero(self.target_valid)
        return (
            self.draft_width == self.target_width
            and np.array_equal(ids, self.common_target_ids)
            and np.array_equal(ids, self.common_draft_ids)
        )

    @property
    def llm_only(self) -> np.ndarray:
        """Boolean mask over the target width of O = V_L \\ C (padding rows excluded)."""
        return self.target_valid & ~self.in_common

    def stats(self) -> VocabStats:
        return VocabStats(
            common=len(self.common_target_ids),
            draft_vocab=self.draft.count,
            target_vocab=self.target.count,
            draft_width=self.draft_width,
            target_width=self.target_width,
        )

    def _indices(self, like: ArrayT) -> tuple[ArrayT, ArrayT]:
        if isinstance(like, np.ndarray):
            return self.common_draft_ids, self.common_target_ids
        key = str(like.device)
        if key not in self._torch_index:
            self._torch_index[key] = (
                torch.tensor(self.common_draft_ids, device=like.device),
                torch.tensor(self.common_target_ids, device=like.device),
            )
        return self._torch_index[key]

    def _check_width(self, array: ArrayT, width: int, what: str) -> None:
        if array.ndim < 1 or array.shape[-1] != width:
            raise ValueError(f"{what} must have last dimension {width}, got {tuple(array.shape)}")

    def project_draft_logits(self, logits: ArrayT) -> ArrayT:
        """Draft logits (..., draft_width) → target-width logits, −inf outside C.

        Warping these (temperature, top-k, top-p over C only) is restrict-then-warp; the SPEC's
        order, warp-then-restrict, is `project_draft(warp(draft probs))`. Both are exact (p is
        only the proposal); restrict-then-warp never loses all mass to tokens outside C."""
        self._check_width(logits, self.draft_width, "draft logits")
        d_idx, t_idx = self._indices(logits)
        shape = (*logits.shape[:-1], self.target_width)
        if isinstance(logits, np.ndarray):
            out = np.full(shape, -np.inf, dtype=np.result_type(logits.dtype, np.float32))
            finite = np.isfinite(logits[..., d_idx]).any(axis=-1)
        else:
            out = torch.full(shape, float("-inf"), dtype=logits.dtype, device=logits.device)
            finite = torch.isfinite(logits[..., d_idx]).any(dim=-1)
        if not bool(finite.all()):
            raise NoCommonMassError("draft logits are −inf on every common-vocabulary token")
        out[..., t_idx] = logits[..., d_idx]
        return out

    def project_draft(self, draft_probs: ArrayT) -> ArrayT:
        """TLI: draft probs (..., draft_width) → target-width probs ∝ p_S on C, 0 elsewhere.

        Raises NoCommonMassError (no fallback) when a row has no mass on C, e.g. after a top-k
        warp that kept only LLM-only tokens; the caller then stops drafting for that step."""
        self._check_width(draft_probs, self.draft_width, "draft probabilities")
        d_idx, t_idx = self._indices(draft_probs)
        shape = (*draft_probs.shape[:-1], self.target_width)
        if isinstance(draft_probs, np.ndarray):
            out = np.zeros(shape, dtype=np.result_type(draft_probs.dtype, np.float32))
        else:
            out = draft_probs.new_zeros(shape)
        out[..., t_idx] = draft_probs[..., d_idx]
        mass = out.sum(-1, keepdims=True) if isinstance(out, np.ndarray) else out.sum(-1, True)
        if not bool((mass > 0).all()):
            raise NoCommonMassError("the draft distribution puts no mass on the common vocabulary")
        return out / mass

    def target_mass_covered(self, q: ArrayT) -> float | ArrayT:
        """Share of a target distribution's mass (over valid tokens) that lies on C."""
        self._check_width(q, self.target_width, "target distribution")
        if isinstance(q, np.ndarray):
            common, valid = self.in_common, self.target_valid
        else:
            common = torch.tensor(self.in_common, device=q.device)
            valid = torch.tensor(self.target_valid, device=q.device)
        share = (q * common).sum(-1) / (q * valid).sum(-1)
        return float(share) if share.ndim == 0 else share

    def target_piece(self, token_id: int) -> str:
        """The target vocabulary piece (e.g. "Ġhello"): unique per id, what travels on the wire."""
        return self.target.pieces[self.target.check_id(token_id)]  # type: ignore[return-value]

    def target_id_from_piece(self, piece: str) -> int:
        try:
            return self.target.piece_to_id[piece]
        except KeyError:
            raise ValueError(f"{piece!r} is not a piece of the target vocabulary") from None

    def draft_piece(self, token_id: int) -> str:
        return self.draft.pieces[self.draft.check_id(token_id)]  # type: ignore[return-value]

    def retokenize_for_draft(
        self, target: str | Sequence[int], *, strict: bool = False
    ) -> list[int]:
        """Draft ids spelling exactly the same bytes as `target` (text, or finalised target ids;
        an incomplete UTF-8 tail is spelled with byte tokens). Bytes the draft vocabulary cannot
        spell at all raise when `strict`, else become its unk token (see DraftRetokenizer)."""
        if isinstance(target, str):
            return self.draft.encode_text(target, strict=strict)
        retokenizer = DraftRetokenizer(self, strict=strict)
        ids = [d for t in target for d in retokenizer.push(t)]
        return ids + retokenizer.flush()


def _table(tokenizer: Any) -> TokenTable:
    return tokenizer if isinstance(tokenizer, TokenTable) else TokenTable(tokenizer)


def incomplete_utf8_tail(data: bytes) -> int:
    """Index where a trailing, still incomplete UTF-8 sequence starts (len(data) if none)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        lead = data[end - back]
        if lead & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4
        need = need if 0xC2 <= lead <= 0xF4 else 1
        return end - back if need > back else end
    return end


class DraftRetokenizer:
    """Keeps the draft context byte-identical to the target context, one finalised target token
    at a time (the edge's sync after an LLM-only or resampled token).

    A common token maps straight to its draft id. Anything else is turned into bytes and only the
    NEW text is retokenised with the draft's continuation encoder (no BOS, no dummy prefix,
    leading spaces kept), so draft segmentation may differ from a fresh tokenisation of the whole
    text; the bytes never do, which is all exactness needs (it concerns target tokens only). A
    trailing incomplete UTF-8 sequence waits in `pending` until completed or `flush()`ed.

    A draft vocabulary without byte coverage (no byte-level alphabet, no byte fallback) cannot
    spell everything: unless `strict`, such bytes become its unk token (or are dropped) and are
    counted in `lost_bytes`; the draft then only predicts worse, exactness is untouched.
    """

    def __init__(self, alignment: VocabAlignment, *, strict: bool = False) -> None:
        self.alignment = alignment
        self.strict = strict
        self.lost_bytes = 0
        self._pending = bytearray()

    @property
    def pending(self) -> bytes:
        return bytes(self._pending)

    def push(self, target_id: int) -> list[int]:
        """Feed one finalised target token; returns the draft ids that can be appended now."""
        target_id = self.alignment.target.check_id(int(target_id))
        if not self._pending and self.alignment.in_common[target_id]:
            return [int(self.alignment.target_to_draft[target_id])]
        data = self.alignment.target.token_bytes[target_id]
        if data is None:
            raise ValueError(f"target token {target_id} has no byte meaning")
        return self.push_bytes(data)

    def push_piece(self, piece: str) -> list[int]:
        """Feed an LLM-only token as it travels on the wire (its target piece)."""
        return self.push(self.alignment.target_id_from_piece(piece))

    def push_bytes(self, data: bytes) -> list[int]:
        self._pending += data
        cut = incomplete_utf8_tail(bytes(self._pending))
        ready = bytes(self._pending[:cut])
        del self._pending[:cut]
        return self._spelled(ready, self.alignment.draft.encode_bytes) if ready else []

    def flush(self) -> list[int]:
        """Spell any pending incomplete UTF-8 bytes with draft byte tokens now."""
        ready, self._pending = bytes(self._pending), bytearray()
        return self._spelled(ready, self.alignment.draft.encode_raw_bytes) if ready else []

    def _spelled(self, data: bytes, encode: Any) -> list[int]:
        ids = encode(data, strict=self.strict)
        draft = self.alignment.draft
        self.lost_bytes += len(data) - len(draft.bytes_of(i for i in ids if i != draft.unk_id))
        return ids
