"""The draft's proposal law at one position, computed over its top candidates, not the vocabulary.

The draft may propose from any law it reports exactly (the exactness contract). wanspec's draft
proposes from its warped distribution over its CANDIDATES: the `MAX_CANDIDATES` most likely
tokens of its row (more when the request's top-k or a tree's fan-out asks for more) that it may
propose (TLI: those in the common vocabulary). One top-k over the row finds them; the warps, the
softmax and the 16-bit rounding then run over a few hundred numbers, so a drafted token costs
one pass over the row where the full-width law cost a dozen. On SmolLM2-135M's code rows at T = 1
the top 256 hold 99.97 % of the mass (median; 98.5 % at the 10th percentile). The full-width p̃
is built only where a decision needs it (a rejection, a method that uploads p̃): `DraftRow.dense`.

Alternatives for a tree are ranked from the same candidates when there are enough of them: a
token outside them has a logit no higher than any candidate, so their top-F is the row's top-F.
With too few allowed candidates, the row is kept and ranked with one more top-k, on demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from wanspec.sampling.quant import PROB_SCALE, Counts, dequantize, quantize_rows, sample
from wanspec.sampling.warps import SamplingParams, warp_probs

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
    source: torch.Tensor | None = None
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
            values_t, index = torch.topk(self.source, min(limit + 1, self.source.shape[-1]))
            values, ids = values_t.numpy(), _as_ids(index.numpy(), self.to_ids)
        ranked = [int(i) for v, i in zip(values, ids, strict=True) if v > -np.inf and i != exclude]
        return ranked[:limit]


def draft_row(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    allowed: np.ndarray | None = None,
    to_ids: np.ndarray | None = None,
    width: int | None = None,
    ranks: int = 0,
) -> DraftRow:
    """p̃ at one position from a 1-D row of draft logits: `draft_rows` of one row, so a token
    drafted alone and the same row drafted inside a tree pass get the same law bit for bit."""
    rows = logits.detach().reshape(1, -1)
    return draft_rows(rows, params, allowed=allowed, to_ids=to_ids, width=width, ranks=ranks)[0]


def draft_rows(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    allowed: np.ndarray | None = None,
    to_ids: np.ndarray | None = None,
    width: int | None = None,
    ranks: int = 0,
) -> list[DraftRow]:
    """p̃ at each row of a [rows, V] block of draft logits (a tree pass's nodes), in one top-k,
    one warp and one rounding over the whole block.

    `allowed` marks the row indices the draft may propose (None: all), `to_ids` maps a row index
    to the id the protocol speaks (the draft → target map across vocabularies; None when they
    are the same) and `width` is that id space's width. `ranks`: how many alternatives `ranked`
    may be asked for (the candidates then number at least `ranks` + 1 when the row allows).
    Each row's numbers depend on that row alone, never on the others in the block."""
    block = logits.detach().to(torch.float32)
    if block.ndim != 2 or block.shape[0] == 0:
        raise ValueError(f"draft_rows expects logits [rows, V], got {tuple(block.shape)}")
    wanted = min(max(MAX_CANDIDATES, params.top_k, ranks + 1), block.shape[1])
    values, index_np, keep = _candidates(block, wanted, allowed)
    probs = warp_probs(values.masked_fill(torch.from_numpy(~keep), -math.inf), params).numpy()
    ids = _as_ids(index_np, to_ids)
    # every row's candidates in ascending id order, the dropped ones after them
    order = np.argsort(np.where(keep, ids, np.iinfo(np.int64).max), axis=1, kind="stable")
    ids, probs, keep = (np.take_along_axis(a, order, axis=1) for a in (ids, probs, keep))
    counts = quantize_rows(np.where(keep, probs, 0.0), PROB_SCALE)
    raw = np.take_along_axis(values.numpy(), order, axis=1).astype(np.float64)
    kept = keep.sum(axis=1)
    full = block.shape[1] if width is None else width
    out = []
    for i, n in enumerate(kept.tolist()):
        source = None
        if n <= ranks:
            source = block[i] if allowed is None else _masked(block[i], allowed)
        out.append(DraftRow(ids[i, :n], counts[i, :n], raw[i, :n], full, source, to_ids))
    return out


def _candidates(
    block: torch.Tensor, wanted: int, allowed: np.ndarray | None
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Each row's `wanted` largest logits, their row indices, and which of them the draft may
    propose (finite, and allowed: TLI); a row with none gets its best allowed ones instead."""
    values, index = torch.topk(block, wanted)
    index_np = index.numpy()
    keep = np.isfinite(values.numpy())
    if allowed is not None:
        keep &= allowed[index_np]
    for i in np.flatnonzero(~keep.any(axis=1)):
        values[i], index[i], keep[i] = _top_allowed(block[i], wanted, allowed)
        index_np[i] = index[i].numpy()
    return values, index_np, keep


def _top_allowed(
    row: torch.Tensor, wanted: int, allowed: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The `wanted` largest allowed logits of a row none of whose top candidates is allowed."""
    if allowed is None:
        raise EmptyDraftRowError("the draft row has no finite logit")
    values, index = torch.topk(_masked(row, allowed), wanted)
    keep = np.isfinite(values.numpy()) & allowed[index.numpy()]
    if not keep.any():
        raise EmptyDraftRowError("the draft row has no finite logit on a token it may propose")
    return values, index, keep


def _masked(row: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
    return row.masked_fill(~torch.from_numpy(np.array(allowed, dtype=bool)), float("-inf"))


def _as_ids(index: np.ndarray, to_ids: np.ndarray | None) -> np.ndarray:
    return index.astype(np.int64) if to_ids is None else to_ids[index]
