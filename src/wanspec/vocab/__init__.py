"""Vocabulary alignment between a draft (edge) tokenizer and a target (cloud) tokenizer.

Heterogeneous drafting is exact only if both sides agree, token by token, on what text was
produced, so everything here compares tokens by the exact bytes they stand for:

- `pieces`: what bytes a vocabulary piece means (byte-level "Ġ", sentencepiece "▁", "<0xHH>").
- `tokens`: `TokenTable`, one tokenizer as id → (piece, bytes, kind), a byte-exact continuation
  encoder, and the tokenizer `fingerprint` for the handshake.
- `pairing`: the common vocabulary C (`common_pairs`) and `check_pair` (tokenizer vs. model).
- `alignment`: `VocabAlignment`, the draft ↔ target maps and the TLI projection.
- `retokenize`: `DraftRetokenizer`, the edge's byte-exact sync after LLM-only tokens.
"""

from wanspec.vocab.alignment import NoCommonMassError, VocabAlignment, VocabStats
from wanspec.vocab.pairing import check_pair, common_pairs
from wanspec.vocab.pieces import Kind
from wanspec.vocab.retokenize import DraftRetokenizer, incomplete_utf8_tail
from wanspec.vocab.tokens import TokenTable, backend_of, fingerprint

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
