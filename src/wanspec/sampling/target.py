"""The target's distribution at one position, as every method decides on it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wanspec.sampling.quant import Counts, quantize
from wanspec.sampling.warps import SamplingParams, warp_probs


def target_counts(
    logits: torch.Tensor,
    params: SamplingParams,
    valid: np.ndarray,
    prev_ids: Sequence[int] | None = None,
) -> Counts:
    """q̃ at one position: padding rows masked out, the request's warp, quantised.

    `prev_ids`: the target ids before this position (prompt and output), which a repetition
    penalty needs exactly as transformers gets them."""
    masked = logits.to(torch.float32).masked_fill(~torch.from_numpy(valid.copy()), float("-inf"))
    context = None if prev_ids is None else [prev_ids]
    return quantize(warp_probs(masked.unsqueeze(0), params, context)[0])
