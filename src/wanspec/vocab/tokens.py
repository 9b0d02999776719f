"""One tokenizer as a table of id → (piece, bytes, kind), and a byte-exact text encoder.

Both sides of a heterogeneous pair need the same view of a tokenizer: which ids exist, what exact
bytes each stands for (see `pieces`), and, on the edge, an encoder that continues a context
without inventing bytes (no dummy prefix, no leading space). `fingerprint` condenses the view into
a hash so edge and cloud can check they read token ids identically.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from wanspec.vocab.pieces import Kind, detect_scheme, piece_bytes


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
        self.scheme = detect_scheme(backend)
        vocab = backend.get_vocab(with_added_tokens=False)
        added = backend.get_added_tokens_decoder()
        self.size = max([*vocab.values(), *added.keys()], default=-1) + 1
        self.pieces: list[str | None] = [None] * self.size
        self.token_bytes: list[bytes | None] = [None] * self.size
        self.kinds = np.zeros(self.size, dtype=np.int8)
        for piece, idx in vocab.items():
            self.pieces[idx] = piece
            self.token_bytes[idx], self.kinds[idx] = piece_bytes(piece, self.scheme)
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
    table = as_table(tokenizer)
    digest = hashlib.sha256(table.scheme.name.encode())
    digest.update(json.dumps(table.pieces, ensure_ascii=False).encode("utf-8"))  # id order
    digest.update(table.kinds.tobytes())
    return digest.hexdigest()


def as_table(tokenizer: Any) -> TokenTable:
    """`tokenizer` as a TokenTable (a table is returned as is, so callers can pass either)."""
    return tokenizer if isinstance(tokenizer, TokenTable) else TokenTable(tokenizer)
