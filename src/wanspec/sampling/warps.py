"""Sampling warps, applied exactly as transformers' `generate` applies its logits processors.

Order (transformers' `_get_logits_processor`): the repetition penalty first (a processor that
needs the context, and the only one of these that greedy decoding also applies), then the
sampling warpers temperature → top-k → top-p → min-p. Each step keeps transformers' semantics and
float32 arithmetic (ties at the k-th logit are kept; top-p keeps the smallest high-probability set
whose mass exceeds p, at least one token; min-p drops tokens below min_p × the top probability),
so "the target's own sampling" means the same thing here as in `model.generate(...)`.
Temperature 0 is greedy: a one-hot argmax of the (penalised) logits.

The repetition penalty depends on the tokens before each row's position (`prev_ids`: exactly the
`input_ids` transformers passes, prompt plus output so far). Both sides of a protocol see the same
context, so a context-dependent warp stays exact.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from wanspec.sampling.params import SamplingParams


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError("temperature 0 is greedy and has no logits warp; use warp_probs")
    return logits / temperature


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Mask every logit below the k-th largest (ties with the k-th survive)."""
    if top_k <= 0:
        return logits
    k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: drop the low tail whose cumulative mass is at most 1 - top_p."""
    if top_p >= 1.0:
        return logits
    ascending, order = torch.sort(logits, dim=-1, descending=False)
    tail_mass = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = tail_mass <= (1.0 - top_p)
    drop_sorted[..., -1:] = False  # always keep the most likely token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below `min_p` times the most likely token's.

    The top token always survives (its probability equals the threshold's base), which is
    transformers' "keep at least one token".
    """
    if min_p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, -math.inf)


def _seen_mask(prev_ids: Sequence[Sequence[int]], rows: int, width: int) -> torch.Tensor:
    """Bool [rows, width]: which tokens occur in each row's context.

    Ids at or beyond the logits width are ignored, as transformers ignores them (such tokens
    cannot be generated); negative ids are an error.
    """
    if len(prev_ids) != rows:
        raise ValueError(f"prev_ids has {len(prev_ids)} entries for {rows} logits rows")
    seen = torch.zeros((rows, width + 1), dtype=torch.bool)
    for row, ids in enumerate(prev_ids):
        try:
            index = torch.as_tensor([operator.index(t) for t in ids], dtype=torch.long)
        except TypeError as exc:
            raise TypeError(f"prev_ids[{row}] must be a sequence of token ids") from exc
        if index.numel() and int(index.min()) < 0:
            raise ValueError(f"prev_ids[{row}] contains a negative token id")
        seen[row, index.clamp(max=width)] = True
    return seen[:, :width]


def apply_repetition_penalty(
    logits: torch.Tensor, penalty: float, prev_ids: Sequence[Sequence[int]] | None
) -> torch.Tensor:
    """CTRL's penalty: a token already in the row's context has its logit divided by `penalty`
    (multiplied when negative), once however often it occurred."""
    if penalty == 1.0:
        return logits
    if prev_ids is None:
        raise ValueError("repetition_penalty needs prev_ids: the tokens before each row")
    if logits.ndim != 2:
        raise ValueError(f"repetition_penalty needs logits [rows, V], got {tuple(logits.shape)}")
    seen = _seen_mask(prev_ids, logits.shape[0], logits.shape[1])
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def _warp_sampling(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling warpers after the context processors: temperature, top-k, top-p, min-p."""
    out = apply_temperature(logits, params.temperature)
    out = apply_top_k(out, params.top_k)
    out = apply_top_p(out, params.top_p)
    return apply_min_p(out, params.min_p)


def warp_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    prev_ids: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Repetition penalty, temperature, top-k, top-p, min-p in that order (non-greedy only).

    `prev_ids[i]`: the token ids before row i's position (needed only with a repetition penalty).
    """
    penalised = apply_repetition_penalty(logits, params.repetition_penalty, prev_ids)
    return _warp_sampling(penalised, params)


def warp_probs(
    logits: torch.Tensor,
    params: SamplingParams,
    prev_ids: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Probabilities after the warp, float64; greedy gives the one-hot argmax (first max wins)
    of the penalised logits, which is what `generate(do_sample=False)` picks."""
    logits = apply_repetition_penalty(logits.to(torch.float32), params.repetition_penalty, prev_ids)
    if params.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float64)
        out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return out
    return _warp_sampling(logits, params).to(torch.float64).softmax(dim=-1)
