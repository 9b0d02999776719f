"""What bytes a vocabulary piece stands for, read off the tokenizer's own decoder.

Alignment compares tokens by the exact bytes they mean, so the spelling conventions have to be
undone first: "Ġhello" (byte-level BPE), "▁hello" (sentencepiece / Metaspace) and " hello" all
mean b" hello", and "<0x0A>" (byte fallback) and "Ċ" (byte-level) both mean b"\\n". The decoder
says which convention a tokenizer uses; anything else is refused rather than guessed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import IntEnum

from tokenizers import Tokenizer

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


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


# str.translate table: byte-level char -> the Latin-1 char of its byte; any other char below 256
# -> a code point that Latin-1 cannot encode, so pieces with foreign characters are rejected.
_BYTE_LEVEL_TRANSLATE = {c: 0x10FFFF for c in range(256)} | {
    ord(c): b for c, b in _byte_level_chars().items()
}


@dataclass(frozen=True)
class PieceScheme:
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


def detect_scheme(backend: Tokenizer) -> PieceScheme:
    """The piece scheme of a `tokenizers.Tokenizer`; ValueError for an unsupported decoder."""
    decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else None
    parts = _decoder_parts(decoder)
    types = {part.get("type") for part in parts}
    fallback = "ByteFallback" in types or bool(getattr(backend.model, "byte_fallback", False))
    if "ByteLevel" in types:
        return PieceScheme(byte_level=True, space_marker=None, byte_fallback=False)
    for part in parts:
        if part.get("type") == "Metaspace":
            return PieceScheme(False, part.get("replacement", "▁"), fallback)
        if part.get("type") == "Replace" and part.get("content") == " ":
            return PieceScheme(False, (part.get("pattern") or {}).get("String"), fallback)
    raise ValueError(
        f"unsupported tokenizer decoder {sorted(t for t in types if t)}: wanspec.vocab needs "
        "byte-level BPE (Ġ) or sentencepiece-style (▁, Metaspace/Replace) tokenizers"
    )


def piece_bytes(piece: str, scheme: PieceScheme) -> tuple[bytes | None, Kind]:
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
