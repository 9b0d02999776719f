"""The target's distribution at one position, as every method decides on it."""

from __future__ import annotations

import numpy as np
import torch

from wanspec.sampling.quant import Counts, quantize
from wanspec.sampling.warps import SamplingParams, warp_probs


def target_counts(logits: torch.Tensor, params: SamplingParams, valid: np.ndarray) -> Counts:
    """q̃ at one position: padding rows masked out, the request's warp, quantised."""
    masked = logits.to(torch.float32).masked_fill(~torch.from_numpy(valid.copy()), float("-inf"))
    return quantize(warp_probs(masked.unsqueeze(0), params)[0])
