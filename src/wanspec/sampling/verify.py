"""Standard chain verification (SPEC "Standard step", steps 2-4).

Draft token x_i is accepted with probability min(1, q_i(x_i)/p_i(x_i)), in order, stopping at
the first rejection. q is the float64 distribution the cloud decides with (the target's own q,
or the rounded q̂ of a method that must ship it) and p the draft's exactly reported p̃(x_i); the
test is one float uniform (`wanspec.sampling.draws.bernoulli`). At temperature 0 both are
one-hot, so acceptance is exact argmax agreement and no randomness is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wanspec.sampling.draws import Rng, bernoulli


def accept_token(target_prob: float, draft_prob: float, rng: Rng) -> bool:
    """Accept a drafted token with probability min(1, q(x)/p(x))."""
    if not draft_prob > 0:
        raise ValueError("a drafted token must have positive draft probability")
    return bernoulli(float(target_prob), float(draft_prob), rng)


def verify_chain(
    tokens: Sequence[int],
    draft_probs: Sequence[float],
    target_dists: Sequence[np.ndarray],
    rng: Rng | Sequence[Rng],
    *,
    unverified: Sequence[bool] | None = None,
) -> int:
    """Number of leading draft tokens accepted.

    `target_dists[i]` is q_i, the target distribution at the position of tokens[i] (there may be
    one more, for the bonus), `draft_probs[i]` = p_i(x_i), both probabilities (or both weights
    on one scale). `unverified[i]` marks tokens accepted without a test (U-HLM's lossy skip).
    `rng` is one stream for every coin, or token i's own stream at `rng[i]` (streams keyed by
    output position, so a coin does not depend on where the chain began).
    """
    if len(draft_probs) != len(tokens) or len(target_dists) < len(tokens):
        raise ValueError("tokens, draft_probs and target_dists do not line up")
    for i, (token, draft_prob) in enumerate(zip(tokens, draft_probs, strict=True)):
        if unverified is not None and unverified[i]:
            continue
        coin_rng = rng[i] if isinstance(rng, Sequence) else rng
        if not accept_token(target_dists[i][token], draft_prob, coin_rng):
            return i
    return len(tokens)
