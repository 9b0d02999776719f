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

from dataclasses import dataclass

import numpy as np
import torch

from wanspec.sampling.quant import PROB_SCALE, Counts, dequantize, quantize, sample
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
    """p̃ at one position from a 1-D row of draft logits.

    `allowed` marks the row indices the draft may propose (None: all), `to_ids` maps a row index
    to the id the protocol speaks (the draft → target map across vocabularies; None when they
    are the same) and `width` is that id space's width. `ranks`: how many alternatives `ranked`
    may be asked for (the candidates then number at least `ranks` + 1 when the row allows)."""
    row = logits.detach().to(torch.float32).reshape(-1)
    wanted = min(max(MAX_CANDIDATES, params.top_k, ranks + 1), row.shape[0])
    values, index = _top(row, wanted, allowed)
    source = None
    if len(index) <= ranks:
        source = row if allowed is None else _masked(row, allowed)
    probs = warp_probs(values.unsqueeze(0), params)[0].numpy()
    ids = _as_ids(index, to_ids)
    order = np.argsort(ids, kind="stable")
    return DraftRow(
        ids=ids[order],
        counts=quantize(probs[order], PROB_SCALE),
        logits=values.numpy()[order].astype(np.float64),
        width=row.shape[0] if width is None else width,
        source=source,
        to_ids=to_ids,
    )


def _top(
    row: torch.Tensor, wanted: int, allowed: np.ndarray | None
) -> tuple[torch.Tensor, np.ndarray]:
    """The candidates: the `wanted` largest logits of the row, those not allowed dropped (TLI);
    when none of them is allowed, the `wanted` largest allowed ones."""
    values, index = torch.topk(row, wanted)
    index_np = index.numpy()
    if allowed is not None:
        keep = allowed[index_np]
        if not keep.any():
            values, index = torch.topk(_masked(row, allowed), wanted)
            index_np = index.numpy()
            keep = allowed[index_np]
        values, index_np = values[torch.from_numpy(keep)], index_np[keep]
    finite = torch.isfinite(values)
    if not bool(finite.any()):
        raise EmptyDraftRowError("the draft row has no finite logit on a token it may propose")
    return values[finite], index_np[finite.numpy()]


def _masked(row: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
    return row.masked_fill(~torch.from_numpy(np.array(allowed, dtype=bool)), float("-inf"))


def _as_ids(index: np.ndarray, to_ids: np.ndarray | None) -> np.ndarray:
    return index.astype(np.int64) if to_ids is None else to_ids[index]
