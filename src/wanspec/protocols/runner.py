"""Keeping a model's KV cache in step with the token sequence a protocol wants next.

Protocols describe the sequence they want the model to have seen; the runner rolls the cache back
to the longest common prefix and extends the rest (always at least one token, so the logits of
the last position come back). `plan` runs at decision time and updates the planned cache state at
once, so the cost of a computation queued behind another one is known exactly; `run` executes
the same plan later, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from wanspec.protocols.base import ComputeCost
from wanspec.sampling import Counts, SamplingParams, quantize, warp_probs


@dataclass(frozen=True)
class ExtendPlan:
    keep: int  # cached tokens kept
    tokens: tuple[int, ...]  # tokens fed after them

    @property
    def cost(self) -> ComputeCost:
        return ComputeCost("forward", n=len(self.tokens), context=self.keep)


class ModelRunner:
    def __init__(self, lm) -> None:
        self.lm = lm
        self._planned: list[int] = []

    def plan(self, desired: Sequence[int], rows: int = 1) -> ExtendPlan:
        """Plan to feed at least the last `rows` tokens of `desired` (their logits come back)."""
        if len(desired) < rows or rows < 1:
            raise ValueError(f"need at least {rows} token(s) to get {rows} row(s) of logits")
        keep = 0
        limit = min(len(self._planned), len(desired) - rows)
        while keep < limit and self._planned[keep] == desired[keep]:
            keep += 1
        self._planned = list(desired)
        return ExtendPlan(keep, tuple(int(t) for t in desired[keep:]))

    def run(self, plan: ExtendPlan) -> torch.Tensor:
        """Logits [len(plan.tokens), V] for the fed positions."""
        if self.lm.length != plan.keep:
            self.lm.truncate(plan.keep)
        return self.lm.extend(list(plan.tokens))


def target_counts(logits: torch.Tensor, params: SamplingParams, valid: np.ndarray) -> Counts:
    """q̃ at one position: padding rows masked, the request's warp, quantised."""
    masked = logits.to(torch.float32).masked_fill(~torch.from_numpy(valid.copy()), float("-inf"))
    return quantize(warp_probs(masked.unsqueeze(0), params)[0])
