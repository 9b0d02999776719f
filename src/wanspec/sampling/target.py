"""The target's distribution at one position, as every method decides on it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wanspec.sampling.quant import Counts, quantize
from wanspec.sampling.warps import SamplingParams, warp_probs


def valid_mask(valid: np.ndarray) -> torch.Tensor:
    """A vocabulary's valid-id mask in the form `target_probs` applies it fastest (convert once
    per session, not per row)."""
    return torch.from_numpy(np.array(valid, dtype=bool))


def target_probs(
    logits: torch.Tensor,
    params: SamplingParams,
    valid: np.ndarray | torch.Tensor,
    prev_ids: Sequence[int] | None = None,
) -> np.ndarray:
    """The target's float q at one position (float64): padding rows masked out, the request's
    warp applied as transformers applies it. This is the law every lossless method samples.

    `valid`: the ids a token may take (`valid_mask` of it saves a conversion per row).
    `prev_ids`: the target ids before this position (prompt and output), which a repetition
    penalty needs exactly as transformers gets them."""
    mask = valid if isinstance(valid, torch.Tensor) else valid_mask(valid)
    masked = logits.to(torch.float32).masked_fill(~mask, float("-inf"))
    context = None if prev_ids is None else [prev_ids]
    return warp_probs(masked.unsqueeze(0), params, context)[0].numpy()


def target_counts(
    logits: torch.Tensor,
    params: SamplingParams,
    valid: np.ndarray,
    prev_ids: Sequence[int] | None = None,
) -> Counts:
    """q at one position rounded to 16-bit counts (the papers' q̃)."""
    return quantize(target_probs(logits, params, valid, prev_ids))
