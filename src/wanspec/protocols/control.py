"""The draft length γ a pipeline should use next, chosen online from what the edge measures.

Pure functions over numbers (no I/O, no clock, no model), plus `ChainController`, the small
online state a pipeline edge feeds once per chain. The model is the pipelines' cycle-time
analysis (docs/METHODS.md), checked against the simulator on the i.i.d. synthetic pair:

- tokens per chain (no bonus token in a pipeline): E[L](γ) = (1 − α^γ)/(1 − α);
- time per verdict, with D chains in flight (1: `acespec`; `deepspec`: `chains_in_flight`):
  a chain is accepted whole with a = α^γ. After a rejection the next chain leaves at the
  verdict (after a redraft of γ·T_draft on a miss); in a run of full acceptances chain k leaves
  once the tree of chain k − 1 is drafted (τ = γ·T_tree after it left) and chain k − D has its
  verdict, and its verdict comes W = RTT + T_verify after it left, or T_verify after the one
  before. `verdict_gap` sums that recursion over the geometric length of the run. For D = 1 it
  is AceSpec's max(τ, W) + P_miss·γ·T_draft.

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
# The share of the measured window a candidate γ's tree may fill.
TREE_ROOM = 0.9
# A run of full acceptances longer than this adds nothing measurable to the expectation.
RUN_LIMIT = 4096
# γ changes only when the model predicts at least this much more throughput than the current γ
# (hysteresis: estimates wander, and each change costs a tree drafted for the old γ).
SWITCH_GAIN = 0.04


def tokens_per_chain(alpha: float, gamma: int) -> float:
    """E[L]: tokens a chain of γ commits (accepted ones, plus the resolved one at a rejection)."""
    alpha = min(max(alpha, ALPHA_MIN), ALPHA_MAX)
    return (1 - alpha**gamma) / (1 - alpha)


def verdict_gap(
    full: float,
    *,
    window_s: float,
    tree_s: float,
    redraft_s: float,
    miss_share: float,
    chains_in_flight: int = 1,
    verify_s: float = 0.0,
) -> float:
    """E[T] between two verdicts (see the module doc): `full` = P(a chain is accepted whole),
    `tree_s` = τ, `redraft_s` = γ·T_draft, `miss_share` = misses per rejection."""
    if not 0 <= full < 1:
        raise ValueError(f"P(full acceptance) must be in [0, 1), got {full}")
    sends: list[float] = []
    verdicts: list[float] = []
    expected, weight = 0.0, 1.0 - full  # P(the run ends at chain k) = a^k (1 − a)
    while weight > 1e-12 * (1.0 - full) and len(verdicts) < RUN_LIMIT:
        k = len(sends)
        leave = 0.0 if k == 0 else sends[-1] + tree_s
        if k >= chains_in_flight:
            leave = max(leave, verdicts[k - chains_in_flight])
        sends.append(leave)
        verdict = max(leave + window_s, verdicts[-1] + verify_s if verdicts else 0.0)
        verdicts.append(verdict)
        # the run ends at this chain's rejection: a hit leaves once its tree is drafted
        hit, miss = max(verdict, leave + tree_s), verdict + redraft_s
        expected += weight * ((1.0 - miss_share) * hit + miss_share * miss)
        weight *= full
    return (1.0 - full) * expected  # per verdict: a run holds E[K] = 1/(1 − a) of them


def chain_seconds(
    gamma: int,
    *,
    alpha: float,
    window_s: float,
    tree_pass_s: float,
    draft_s: float,
    miss_share: float,
    chains_in_flight: int = 1,
) -> float:
    """E[T] between two verdicts at draft length γ, from per-token estimates."""
    alpha = min(max(alpha, ALPHA_MIN), ALPHA_MAX)
    return verdict_gap(
        alpha**gamma,
        window_s=window_s,
        tree_s=gamma * tree_pass_s,
        redraft_s=gamma * draft_s,
        miss_share=miss_share,
        chains_in_flight=chains_in_flight,
    )


def best_gamma(
    current: int,
    gamma_max: int,
    *,
    alpha: float,
    window_s: float,
    tree_pass_s: float,
    draft_s: float,
    miss_share: float,
    chains_in_flight: int = 1,
    switch_gain: float = SWITCH_GAIN,
) -> int:
    """The γ in 1..gamma_max whose tree fits in the window with the most tokens per second, or
    `current` unless that beats it by more than `switch_gain`."""

    def rate(gamma: int) -> float:
        seconds = chain_seconds(
            gamma,
            alpha=alpha,
            window_s=window_s,
            tree_pass_s=tree_pass_s,
            draft_s=draft_s,
            miss_share=miss_share,
            chains_in_flight=chains_in_flight,
        )
        return tokens_per_chain(alpha, gamma) / seconds if seconds > 0 else math.inf

    # A tree that no longer fits in the window makes the planner shrink the budget, and the hits
    # measured at the old budget would not hold: only γ whose tree fits, with room for the
    # window's jitter, are candidates.
    room = TREE_ROOM * window_s
    fitting = [g for g in range(1, gamma_max + 1) if g * tree_pass_s <= room]
    best = max(fitting or range(1, gamma_max + 1), key=lambda g: (rate(g), -g))
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
    chains_in_flight: int = 1
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
                chains_in_flight=self.chains_in_flight,
            )
        self.history.append(self.gamma)
        return self.gamma
