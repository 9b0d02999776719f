"""Standard chain verification (SPEC "Standard step", steps 2-4).

Draft token x_i is accepted with probability min(1, q_i(x_i)/p_i(x_i)), in order, stopping at
the first rejection. With quantised counts this is an exact integer Bernoulli. At temperature 0
both counts are one-hot, so acceptance is exact argmax agreement and no randomness is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wanspec.sampling.quant import Counts, bernoulli


def accept_token(target_count: int, draft_count: int, rng: np.random.Generator) -> bool:
    """Accept a drafted token with probability min(1, q(x)/p(x))."""
    if draft_count <= 0:
        raise ValueError("a drafted token must have positive draft probability")
    return bernoulli(int(target_count), int(draft_count), rng)


def verify_chain(
    tokens: Sequence[int],
    draft_counts: Sequence[int],
    target_dists: Sequence[Counts],
    rng: np.random.Generator,
    *,
    unverified: Sequence[bool] | None = None,
) -> int:
    """Number of leading draft tokens accepted.

    `target_dists[i]` is q_i, the target distribution at the position of tokens[i] (there may be
    one more, for the bonus). `unverified[i]` marks tokens accepted without a test (U-HLM's lossy
    skip of confident tokens).
    """
    if len(draft_counts) != len(tokens) or len(target_dists) < len(tokens):
        raise ValueError("tokens, draft_counts and target_dists do not line up")
    for i, (token, draft_count) in enumerate(zip(tokens, draft_counts, strict=True)):
        if unverified is not None and unverified[i]:
            continue
        if not accept_token(int(target_dists[i][token]), int(draft_count), rng):
            return i
    return len(tokens)
