"""Draft ↔ target token maps over the models' full logits widths, and TLI projection.

The protocols work in the target's index space (SPEC, TLI): a draft distribution is moved onto
the common vocabulary C and renormalised there, and LLM-only target tokens travel as their
vocabulary piece. `VocabAlignment` holds the immutable maps both sides derive from the two
tokenizers, built once per pair; its `fingerprint` lets edge and cloud check they built the same.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from wanspec.vocab.pairing import check_pair, common_pairs
from wanspec.vocab.retokenize import DraftRetokenizer
from wanspec.vocab.tokens import TokenTable, as_table
from wanspec.vocab.tokens import fingerprint as tokenizer_fingerprint

MIN_COMMON_WARN = 100

# A numpy array, or a tensor on any device: a tensor is handled through its own methods
# (`new_tensor`, `new_full`, `isfinite`), so this module imports no tensor library.
ArrayT = TypeVar("ArrayT")


class NoCommonMassError(ValueError):
    """The draft distribution puts no mass on the common vocabulary: TLI cannot draft here."""


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
        draft = as_table(draft_tokenizer)
        target = draft if target_tokenizer is draft_tokenizer else as_table(target_tokenizer)
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
        table = as_table(tokenizer)
        alignment = cls.build(table, table, draft_width=width, target_width=width)
        if not alignment.is_identity:  # cannot happen: every entry meets itself
            raise RuntimeError("identity alignment does not cover the whole vocabulary")
        return alignment

    def __repr__(self) -> str:
        return f"VocabAlignment({self.stats()})"

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits naming the (draft tokenizer, target tokenizer, widths) this alignment was
        built from: equal on edge and cloud means equal maps, so a handshake compares one string.
        Built from the tokenizers' `fingerprint`s, so it is the same in every process."""
        draft = tokenizer_fingerprint(self.draft)
        target = draft if self.target is self.draft else tokenizer_fingerprint(self.target)
        key = f"{draft}:{target}:{self.draft_width}:{self.target_width}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @cached_property
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
            index = like.new_zeros(()).long().dtype  # the tensor library's int64
            self._torch_index[key] = (
                like.new_tensor(self.common_draft_ids, dtype=index),
                like.new_tensor(self.common_target_ids, dtype=index),
            )
        return self._torch_index[key]

    def _check_width(self, array: ArrayT, width: int, what: str) -> None:
        if array.ndim < 1 or array.shape[-1] != width:
            raise ValueError(f"{what} must have last dimension {width}, got {tuple(array.shape)}")

    def _onto_target(self, rows: ArrayT, fill: float, what: str) -> ArrayT:
        """Draft-width rows (..., draft_width) → (..., target_width): C copied, `fill` elsewhere."""
        self._check_width(rows, self.draft_width, what)
        d_idx, t_idx = self._indices(rows)
        shape = (*rows.shape[:-1], self.target_width)
        if isinstance(rows, np.ndarray):
            out = np.full(shape, fill, dtype=np.result_type(rows.dtype, np.float32))
        else:
            out = rows.new_full(shape, fill)
        out[..., t_idx] = rows[..., d_idx]
        return out

    def project_draft_logits(self, logits: ArrayT) -> ArrayT:
        """Draft logits (..., draft_width) → target-width logits, −inf outside C.

        Warping these (temperature, top-k, top-p over C only) is restrict-then-warp; the SPEC's
        order, warp-then-restrict, is `project_draft(warp(draft probs))`. Both are exact (p is
        only the proposal); restrict-then-warp never loses all mass to tokens outside C."""
        out = self._onto_target(logits, float("-inf"), "draft logits")
        finite = np.isfinite(out) if isinstance(out, np.ndarray) else out.isfinite()
        if not bool(finite.any(-1).all()):
            raise NoCommonMassError("draft logits are −inf on every common-vocabulary token")
        return out

    def project_draft(self, draft_probs: ArrayT) -> ArrayT:
        """TLI: draft probs (..., draft_width) → target-width probs ∝ p_S on C, 0 elsewhere.

        Raises NoCommonMassError (no fallback) when a row has no mass on C, e.g. after a top-k
        warp that kept only LLM-only tokens; the caller then stops drafting for that step."""
        out = self._onto_target(draft_probs, 0.0, "draft probabilities")
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
            common, valid = q.new_tensor(self.in_common), q.new_tensor(self.target_valid)
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
