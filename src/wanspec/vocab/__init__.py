"""Vocabulary alignment between a draft (edge) tokenizer and a target (cloud) tokenizer."""

from wanspec.vocab.tokens import (
    DraftRetokenizer,
    Kind,
    NoCommonMassError,
    TokenTable,
    VocabAlignment,
    VocabStats,
    backend_of,
    check_pair,
    common_pairs,
    fingerprint,
    incomplete_utf8_tail,
)

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
