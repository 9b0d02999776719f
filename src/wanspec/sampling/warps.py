"""Sampling warps: temperature, then top-k, then top-p, as transformers' logits processors do.

The warps work on torch logits (the models' native output) and keep transformers' semantics
exactly (ties at the k-th logit are kept; top-p keeps the smallest high-probability set whose
mass exceeds p, at least one token), so "the target's own sampling" means the same thing here
as in `model.generate(do_sample=True, ...)`. Temperature 0 is greedy: a one-hot argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling settings; both models use the same warp (SPEC: p and q)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p in that order (non-greedy only)."""
    out = apply_temperature(logits, params.temperature)
    out = apply_top_k(out, params.top_k)
    return apply_top_p(out, params.top_p)


def warp_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after the warp, float64; greedy gives the one-hot argmax (first max wins)."""
    logits = logits.to(torch.float32)
    if params.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float64)
        out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return out
    return warp_logits(logits, params).to(torch.float64).softmax(dim=-1)
