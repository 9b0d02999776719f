"""The draft length γ a pipeline should use next, chosen online from what the edge measures.

Pure functions over numbers (no I/O, no clock, no model), plus `ChainController`, the small
online state a pipeline edge feeds once per chain. The model is the pipelines' cycle-time
analysis (docs/METHODS.md), checked against the simulator on the i.i.d. synthetic pair:

- tokens per chain (no bonus token in a pipeline): E[L](γ) = (1 − α^γ)/(1 − α);
- one chain in flight (`acespec`): E[T](γ) = max(γ·T_tree, W) + P_miss(γ)·γ·T_draft, with
  W = RTT + T_verify the send-to-verdict window and P_miss(γ) = (1 − α^γ)·m, m the share of
  rejections the tree did not cache;
- a chain sent ahead (`deepspec`), when the tree fits in the window: a = α^γ chains are accepted
  whole, and a chain sent ahead after a full acceptance waits τ or τ + W − τ alternately, so
  E[T](γ) = (1 − a)·W + P_miss(γ)·γ·T_draft + a/(1 + a)·τ + a²/(1 + a)·W, τ = γ·T_tree.

The chosen γ changes only the time, never the tokens: a pipeline's draws are keyed by output
position (SPEC's Randomness clause), so a seed gives the same tokens at every γ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wanspec.protocols.budget import ALPHA_MAX, ALPHA_MIN, PRIOR_ALPHA, Ewma

# A run starts at the default γ and keeps it until the edge has seen this many verdicts: the
# window and α of one chain are too noisy to act on.
WARMUP_CHAINS = 2
# γ changes only when the model predicts at least this much more throughput than the current γ
# (hysteresis: estimates wander, and each change costs a tree drafted for the old γ).
SWITCH_GAIN = 0.04


def tokens_per_chain(alpha: float, gamma: int) -> float:
    """E[L]: tokens a chain of γ commits (accepted ones, plus the resolved one at a rejection)."""
    alpha = min(max(alpha, ALPHA_MIN), ALPHA_MAX)
    return (1 - alpha**gamma) / (1 - alpha)


def chain_seconds(
    gamma: int,
    *,
    alpha: float,
    window_s: float,
    tree_pass_s: float,
    draft_s: float,
    miss_share: float,
    send_ahead: bool,
) -> float:
    """E[T]: the expected time between two verdicts at draft length γ (see the module doc)."""
    alpha = min(max(alpha, ALPHA_MIN), ALPHA_MAX)
    full = alpha**gamma
    tree = gamma * tree_pass_s
    redraft = (1 - full) * miss_share * gamma * draft_s
    if not send_ahead or tree >= window_s:
        return max(tree, window_s) + redraft
    return (1 - full) * window_s + redraft + (full * tree + full**2 * window_s) / (1 + full)


def best_gamma(
    current: int,
    gamma_max: int,
    *,
    alpha: float,
    window_s: float,
    tree_pass_s: float,
    draft_s: float,
    miss_share: float,
    send_ahead: bool,
    switch_gain: float = SWITCH_GAIN,
) -> int:
    """The γ in 1..gamma_max with the most tokens per second, or `current` unless that beats it
    by more than `switch_gain`."""

    def rate(gamma: int) -> float:
        seconds = chain_seconds(
            gamma,
            alpha=alpha,
            window_s=window_s,
            tree_pass_s=tree_pass_s,
            draft_s=draft_s,
            miss_share=miss_share,
            send_ahead=send_ahead,
        )
        return tokens_per_chain(alpha, gamma) / seconds if seconds > 0 else math.inf

    best = max(range(1, gamma_max + 1), key=lambda g: (rate(g), -g))
    return best if rate(best) > (1 + switch_gain) * rate(current) else current


@dataclass
class ChainController:
    """γ for the next chain, from running estimates the edge feeds it.

    Feeds: `observe_verdict(accepted, drafted, window_s)` per verdict; `observe_tree_pass(s)` and
    `observe_draft(s)` per compute; `observe_outcome(hit)` per rejection looked up in the tree.
    Until the estimates exist (`WARMUP_CHAINS` verdicts, one tree pass and one draft) it keeps
    `start`."""

    start: int
    gamma_max: int
    send_ahead: bool
    gamma: int = field(init=False)
    verdicts: int = field(init=False, default=0)
    accepted: int = field(init=False, default=0)
    tested: int = field(init=False, default=0)
    rejections: int = field(init=False, default=0)
    misses: int = field(init=False, default=0)
    window: Ewma = field(init=False, default_factory=Ewma)
    tree_pass: Ewma = field(init=False, default_factory=Ewma)
    draft: Ewma = field(init=False, default_factory=Ewma)
    history: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.gamma_max:
            raise ValueError(f"start γ {self.start} outside [1, {self.gamma_max}]")
        self.gamma = self.start

    @property
    def alpha(self) -> float:
        """The per-token acceptance rate (accepted / tested, as `BranchPlanner.alpha`)."""
        return self.accepted / self.tested if self.tested else PRIOR_ALPHA

    def observe_verdict(self, accepted: int, drafted: int, window_s: float | None) -> None:
        self.verdicts += 1
        self.accepted += accepted
        self.tested += accepted + int(accepted < drafted)
        if window_s is not None:
            self.window.update(window_s)

    def observe_outcome(self, hit: bool) -> None:
        self.rejections += 1
        self.misses += int(not hit)

    def observe_tree_pass(self, seconds: float) -> None:
        self.tree_pass.update(seconds)

    def observe_draft(self, seconds: float) -> None:
        self.draft.update(seconds)

    def next_gamma(self) -> int:
        """γ for the chain about to be drafted (recorded in `history`)."""
        window, tree, draft = self.window.value, self.tree_pass.value, self.draft.value
        if self.verdicts >= WARMUP_CHAINS and None not in (window, tree, draft):
            self.gamma = best_gamma(
                self.gamma,
                self.gamma_max,
                alpha=self.alpha,
                window_s=window,
                tree_pass_s=tree,
                draft_s=draft,
                miss_share=(self.misses + 1) / (self.rejections + 2),
                send_ahead=self.send_ahead,
            )
        self.history.append(self.gamma)
        return self.gamma
