"""The common vocabulary C: which target and draft tokens mean the same thing (SPEC, Notation).

Exactness needs every pair in C to be interchangeable in both directions, so a pair is made only
when the bytes alone decide it:

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

`check_pair` guards the other pairing a run depends on: a tokenizer with the model it belongs to.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wanspec.vocab.pieces import Kind
from wanspec.vocab.tokens import TokenTable, as_table


def check_pair(
    tokenizer: Any, width: int, *, role: str = "model", max_padding: int | None = None
) -> None:
    """Raise a clear error when `tokenizer` cannot belong to a model with `width` logits rows:
    ids beyond the rows, or far more padding rows than a model pads (default: max(1024, size/8))."""
    table = as_table(tokenizer)
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
