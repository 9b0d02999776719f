"""The request's sampling settings, as plain data: both sides' laws are warped by them.

Kept apart from the warps themselves (torch, in `wanspec.sampling.warps`), so that settings and
the protocol machines that carry them need no tensor library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_number(value: object, name: str, low: float, high: float, *, open_low: bool) -> None:
    """`value` is a finite real (not a bool) in (low, high] or [low, high]."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low < value if open_low else low <= value) and value <= high
    if not ok:
        bracket = "(" if open_low else "["
        raise ValueError(f"{name} must be a number in {bracket}{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling settings; both models use the same warp (SPEC: p and q)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1.0 = off

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        _check_number(self.min_p, "min_p (0 = off)", 0.0, 1.0, open_low=False)
        _check_number(
            self.repetition_penalty, "repetition_penalty (1.0 = off)", 0.0, math.inf, open_low=True
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_context(self) -> bool:
        """Whether the warp depends on the tokens before the position (`prev_ids`)."""
        return self.repetition_penalty != 1.0
