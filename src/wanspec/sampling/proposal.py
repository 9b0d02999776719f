"""The draft's proposal at one position (`DraftRow`), as plain arrays.

`wanspec.sampling.draft` computes these from a block of draft logits (torch); a protocol machine
only holds, draws from and ranks them, so this module needs nothing but numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from wanspec.sampling.quant import PROB_SCALE, Counts, dequantize, quantize_rows, sample

MAX_CANDIDATES = 256  # the tokens a drafted position proposes from (unless a top-k asks for more)


class EmptyDraftRowError(ValueError):
    """The draft row has no finite logit on any token it may propose."""


@dataclass(frozen=True, eq=False)
class DraftRow:
    """p̃ at one drafted position: 16-bit `counts` over the candidate `ids` (ascending, in the
    ids the protocol speaks) and their raw draft `logits`; `source`, the row masked to what the
    draft may propose, is kept only when ranking may need more than the candidates."""

    ids: np.ndarray
    counts: Counts
    logits: np.ndarray
    width: int
    source: np.ndarray | None = None  # float32, −inf where the draft may not propose
    to_ids: np.ndarray | None = None  # row index → protocol id (None: the identity)

    def count(self, token: int) -> int:
        """p̃(token) in 16-bit counts (0 off the candidates)."""
        at = int(np.searchsorted(self.ids, token))
        return int(self.counts[at]) if at < len(self.ids) and self.ids[at] == token else 0

    def dense(self) -> Counts:
        """The full-width count array (sums to PROB_SCALE)."""
        out = np.zeros(self.width, dtype=np.int64)
        out[self.ids] = self.counts
        return out

    def probs(self) -> np.ndarray:
        """p̃ over the full width as the probabilities both sides decide with."""
        return dequantize(self.dense())

    def draw(self, rng: np.random.Generator) -> int:
        """A token drawn from p̃ (integer arithmetic, as `sample`)."""
        return int(self.ids[sample(self.counts, rng)])

    def ranked(self, limit: int, exclude: int) -> list[int]:
        """Up to `limit` tokens by decreasing draft logit, `exclude` left out (AceSpec's proxy
        for where a rejection's residual lies); never a token the draft may not propose."""
        if limit <= 0:
            return []
        if len(self.ids) > limit or self.source is None:
            order = np.argsort(-self.logits, kind="stable")
            ids, values = self.ids[order], self.logits[order]
        else:
            index = _top_indices(self.source, min(limit + 1, self.source.shape[-1]))
            values, ids = self.source[index], as_ids(index, self.to_ids)
        ranked = [int(i) for v, i in zip(values, ids, strict=True) if v > -np.inf and i != exclude]
        return ranked[:limit]

    def reshaped(self, top: int, factor: float) -> DraftRow:
        """This row with the counts of its `top` highest-logit candidates (ties: the lower id, as
        `ranked`) scaled by `factor` ∈ (0, 1] and renormalised, every nonzero count kept ≥ 1: a
        proposal that leaves the tokens a tree caches to the residual. Still a law the draft
        reports exactly; the ids, logits, support and ranking are this row's."""
        if isinstance(top, bool) or not isinstance(top, int | np.integer) or top < 1:
            raise ValueError(f"top must be an integer >= 1, got {top!r}")
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"factor must be in (0, 1], got {factor!r}")
        if factor == 1.0:
            return self
        weights = self.counts.astype(np.float64)
        weights[np.argsort(-self.logits, kind="stable")[:top]] *= factor
        support = self.counts > 0
        # one count held back for each token of the support, so that none rounds out of it
        spare = PROB_SCALE - int(support.sum())
        counts = quantize_rows(weights[None, :], spare)[0] + support
        return replace(self, counts=counts)


def _top_indices(row: np.ndarray, k: int) -> np.ndarray:
    """The indices of a row's `k` largest values, largest first (one partial selection)."""
    top = np.argpartition(-row, k - 1)[:k]
    return top[np.argsort(-row[top], kind="stable")]


def as_ids(index: np.ndarray, to_ids: np.ndarray | None) -> np.ndarray:
    """Row indices as the ids the protocol speaks (`to_ids`: the map, None for the identity)."""
    return index.astype(np.int64) if to_ids is None else to_ids[index]
