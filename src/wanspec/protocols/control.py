"""The draft length γ and the chains in flight D a pipeline should use next, chosen online from
what the edge measures.

Pure functions over numbers (no I/O, no clock, no model), plus `ChainController`, the small
online state a pipeline edge feeds once per chain. The model is the pipelines' cycle-time
analysis (docs/METHODS.md), checked against the simulator on the i.i.d. synthetic pair:

- tokens per chain (no bonus token in a pipeline): E[L](γ) = Σ_{k<γ} P(the first k accepted),
  (1 − α^γ)/(1 − α) for i.i.d. acceptance. The edge measures acceptance per depth: a_k = P(the
  k-th token accepted | the k − 1 before it were). A real pair's a_k grows with k (easy stretches
  of text last), so a chain is accepted whole more often than α^γ says: P(full) = Π_{k≤γ} a_k;
- time per verdict, with D chains in flight (1: `acespec`; `deepspec`: `chains_in_flight`):
  a chain is accepted whole with a = P(full). After a rejection the next chain leaves at the
  verdict (after a redraft of γ·T_draft on a miss); in a run of full acceptances chain k leaves
  once the tree of chain k − 1 is drafted (τ = γ·T_tree after it left) and chain k − D has its
  verdict, and its verdict comes W = RTT + T_verify after it left, or T_verify after the one
  before. `verdict_gap` sums that recursion over the geometric length of the run. For D = 1 it
  is AceSpec's max(τ, W) + P_miss·γ·T_draft;
- a rejection that finds the edge mid-pass waits for that pass: a miss redrafts after it, a
  hit's tree starts after it, so the next run may start late (a two-state chain over the runs'
  starts). In its own tree that is half a pass on average. In the tree of the chain sent after
  it (now stale) the edge holds a pass the verdict would interrupt where that pays
  (`holds_pass`): for a verdict uniform within the pass, a share 1 − a of them (a = P(that
  chain stays live)) find the edge idle, the rest wait a²·T_pass/2 on average, and a full
  acceptance finds that tree (1 − a)²·T_pass/2 late on average. A pass that also drafts forks'
  trees is never held (half a pass again): the model weighs the two by the measured share of
  such passes that could be held;
- a rejection whose branch went up as a fork (`deepspec-tree`) is no end of the run: the cloud
  verifies the fork at once, as it would the continuation after a full acceptance, so the run
  goes on with P = a + (1 − a)·P(fork | rejection), and only the other rejections hit or miss.
  A chain's forks go up once its tree is drafted, so in the run the fork leaves then, and its
  verdict comes a window later at the earliest: a fork sent s before the verdict reaches the
  edge saves min(s, RTT). The share of hits that were forks is measured only on chains whose
  tree beat their verdict, so a γ whose trees end at the verdict, taking no fork, does not make
  shorter chains look as if they would take none. Forks go up shallowest first, so that share
  is read per rejection depth. A fork taken whose tree was not drafted along starts it after
  the verdict, and the chain after a fork leaves only once the edge hears the verdict that
  took it.
- with more than one chain in flight the run after a miss starts with a shorter chain of k
  (`restart_length`): drafted in k·T_draft, going on with P(the first k accepted), committing
  E[L](k). Runs start on time, late or with such a chain: the stationary shares of a Markov
  chain over the runs' starts weigh them, and the share of verdicts on restart chains weighs
  their tokens.

- the tree budget B (`tree_budget="auto"`): a pass of B tips costs T_tree(B) (the edge's latency
  profile, scaled to the passes measured) and its tree misses the share the planner's hit model
  predicts at B. AceSpec's rule, the most tips whose tree fits the window, is all or nothing
  where a pass costs about the same for 1 tip as for 30: with a window shorter than the chain's
  own γ passes it drafts no alternative at all, though they would cost almost nothing.

The chosen γ, D and B change only the time, never the tokens: a pipeline's draws are keyed by
output position (SPEC's Randomness clause), so a seed gives the same tokens at every γ, D and B.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from wanspec.protocols.budget import ALPHA_MAX, ALPHA_MIN, PRIOR_ALPHA, Ewma
from wanspec.protocols.settings import DEFAULT_TREE_BUDGET

# A run starts at the default γ and keeps it until the edge has seen this many verdicts: the
# window and α of one chain are too noisy to act on.
WARMUP_CHAINS = 2
# Before any rejection the tree is assumed to miss this share of them (one pseudo-rejection): a
# tree that fits its window mostly hits, and a pessimistic prior would shorten the chains
# before the first lookups are in.
PRIOR_MISS_SHARE = 0.2
# With D chosen online, a run starts with `deepspec`'s default D.
START_DEPTH = 2
# The share of the measured window a candidate γ's tree may fill.
TREE_ROOM = 0.9
# A tree budget changes only where the model expects this much more (a tree already planned
# keeps its own; the next one takes the new budget, so a change costs no drafted tree).
BUDGET_GAIN = 0.01
# A budget's pass is priced over this many last passes' shapes (own tree and forks' trees).
PASSES_KEPT = 64
# Acceptance at a depth is shrunk towards the pooled α as if this many tokens at α had been seen
# there: a depth drafted a few times must not swing γ.
DEPTH_PRIOR_TOKENS = 8
# The forks' share of the hits starts at one half, as if this many hits had been seen: the first
# forks taken or not must not swing it to all or nothing.
FORK_PRIOR_HITS = 2
# A run of full acceptances longer than this adds nothing measurable to the expectation.
RUN_LIMIT = 4096
# Nor do the chains it reaches with less than this probability: 1e-8 of a rate at most, against
# 1e-12, a quarter cheaper (the edge runs the model up to a few hundred times per chain).
RUN_TAIL = 1e-9
# γ changes only when the model predicts at least this much more throughput than the current γ
# (hysteresis: estimates wander, and each change costs a tree drafted for the old γ).
SWITCH_GAIN = 0.04
# Chains in flight beyond those that reach within this share of the best modelled rate are not
# worth their stale drafts.
DEPTH_SLACK = 0.01
# With the budget chosen too, γ at the budgets next to the current one is tried this far from
# the current γ (every γ at the current budget).
PLAN_STEP = 2
# Times closer than this are the same time, their sums rounded differently.
TIME_EPS = 1e-9
# A run's chains settle into a cycle of one shape, or of two (chains in flight sent in pairs, a
# window apart), whose tail is summed in closed form.
PERIOD_MAX = 2


def _shrunk(hits: Sequence[int], tries: Sequence[int], pooled: float) -> tuple[float, ...]:
    """Per depth, hits / tries shrunk towards the pooled share as if `DEPTH_PRIOR_TOKENS` tries at
    that share had been seen there: a depth seldom reached keeps about the pooled one."""
    prior = DEPTH_PRIOR_TOKENS
    return tuple((h + prior * pooled) / (n + prior) for h, n in zip(hits, tries, strict=True))


def dists_pay(*, reject: float, fork_share: float, saved_s: float, extra_s: float) -> bool:
    """Whether a chain sent alone should carry its p̃ (`deepspec-tree`): only then can the cloud
    go on with one of its forks after a rejection (P = `reject`), which it does in the share
    `fork_share` of such rejections, each saving the round trip the branch would take to reach
    it (`saved_s`: the cloud still verifies the fork); against that, its p̃ keeps the uplink
    `extra_s` longer."""
    return fork_pays(taken=reject * fork_share, saved_s=saved_s, extra_s=extra_s)


def fork_pays(*, taken: float, saved_s: float, extra_s: float) -> bool:
    """Whether bits that let the cloud go on with a fork are worth their time on the uplink
    (`extra_s`): the fork is taken with P = `taken` and then saves `saved_s`."""
    return taken * saved_s > extra_s


def fork_saving_s(
    round_trip_s: float, *, handshake_bits: int, chain_bits: int, rate_bps: float
) -> float:
    """The round trip a fork taken saves (the verdict down, the chain it asks for up), from
    the handshake's: less the Hello's and HelloAck's sending, plus the chain's, at the measured
    uplink rate (taken for the downlink's too). On a slow link those two messages are several
    chains' worth of bits: at 50 kbit/s the handshake's round trip overstates a fork's saving by
    a third."""
    return bare_round_trip_s(round_trip_s + chain_bits / rate_bps, handshake_bits=handshake_bits,
                             rate_bps=rate_bps)  # fmt: skip


def bare_round_trip_s(round_trip_s: float, *, handshake_bits: int, rate_bps: float) -> float:
    """The handshake's round trip less the Hello's and HelloAck's sending at the measured uplink
    rate (taken for the downlink's too, which errs short): the round trip of a message that
    takes no time to send. At 50 kbit/s that sending is about 30 ms of it."""
    return max(round_trip_s - handshake_bits / rate_bps, 0.0)


def holds_pass(*, idle_s: float, pass_s: float, full: float) -> bool:
    """Whether the edge should leave the next pass of a chain-sent-ahead's tree until the verdict
    due in `idle_s`. Run now, the pass would still run `pass_s − idle_s` past the verdict, which
    a rejection (P = 1 − `full`: the chain sent ahead turns stale) waits for; held, that tree
    starts `idle_s` later, which costs only when the chain is accepted whole (P = `full`)."""
    return 0 < idle_s < pass_s and (1 - full) * (pass_s - idle_s) > full * idle_s


@dataclass(frozen=True)
class Cycle:
    """The pipeline's steady state: E[T] between two verdicts, and the share of verdicts that
    are on a chain restarting after a miss (shorter than γ)."""

    gap_s: float
    restart_share: float = 0.0


class _Run(NamedTuple):
    """One run of chains, from its first chain leaving to the next run's: E[time], E[verdicts],
    P(it ends at a miss), P(the next run starts late) and the mean lateness then."""

    seconds: float
    verdicts: float
    p_miss: float
    p_late: float
    late_s: float


def verdict_gap(full: float, **timing: Any) -> float:
    """E[T] between two verdicts (`cycle`'s)."""
    return cycle(full, **timing).gap_s


def cycle(
    full: float,
    *,
    window_s: float,
    tree_s: float,
    redraft_s: float,
    miss_share: float,
    chains_in_flight: int = 1,
    verify_s: float = 0.0,
    pass_s: float = 0.0,
    live: float | None = None,
    holdable: float = 1.0,
    restart_full: float | None = None,
    restart_redraft_s: float = 0.0,
    fork: float = 0.0,
    fork_tree: float = 1.0,
) -> Cycle:
    """E[T] between two verdicts (see the module doc): `full` = P(a chain is accepted whole),
    `tree_s` = τ, `redraft_s` = γ·T_draft, `miss_share` = misses per rejection, `pass_s` = one
    tree pass (0: the edge's passes are not priced), `live` = P(a chain sent ahead stays live at
    the verdict before it) as the edge's `holds_pass` prices it (default `full`), `holdable` =
    the share of such a chain's passes the edge may hold. With `restart_full` every miss is
    followed by a shorter chain (`restart_length`), drafted in `restart_redraft_s` and accepted
    whole with P = `restart_full`. `fork` = P(a rejection's branch is a fork the cloud holds,
    where the chain's tree beat its verdict); `fork_tree` = the share of forks taken whose tree
    was drafted along (the others' trees start after the verdict)."""
    if not 0 <= full < 1:
        raise ValueError(f"P(full acceptance) must be in [0, 1), got {full}")
    if not 0 <= fork <= 1:
        raise ValueError(f"P(fork | rejection) must be in [0, 1], got {fork}")
    restarts = restart_full is not None
    timing = dict(window_s=window_s, tree_s=tree_s, miss_share=miss_share,
                  redraft_s=restart_redraft_s if restarts else redraft_s,
                  chains_in_flight=chains_in_flight, verify_s=verify_s, pass_s=pass_s,
                  live=full if live is None else live, holdable=holdable, fork=fork,
                  fork_tree=fork_tree)  # fmt: skip
    # a run starts on time, after a hit whose tree waits behind a stale pass (late, at the mean
    # wait the on-time runs leave), or with a restart chain after a miss: a Markov chain over
    # the runs' starts
    on_time = _run_gap(full, 0.0, full, **timing)
    runs = [on_time]
    if restarts:
        runs.append(_run_gap(full, 0.0, min(restart_full, ALPHA_MAX), **timing))
    late_s = next((run.late_s for run in runs if run.p_late), 0.0)
    if late_s:
        runs.append(_run_gap(full, late_s, full, **timing))
    shares = _stationary(runs, restarts, late_s > 0)
    seconds = sum(p * run.seconds for p, run in zip(shares, runs, strict=True))
    verdicts = sum(p * run.verdicts for p, run in zip(shares, runs, strict=True))
    return Cycle(seconds / verdicts, shares[1] / verdicts if restarts else 0.0)


def _stationary(runs: list[_Run], restarts: bool, lates: bool) -> list[float]:
    """The stationary shares of the runs' kinds (on time, then restart, then late, those there
    are): each run is followed by a restart (where `restarts`) with its own `p_miss`, by a late
    start with its own `p_late`, else by an on-time one. Solved exactly: every kind returns to
    on time, so the shares are the one solution of π = πP that sums to 1."""
    n = len(runs)
    restart, late = (1 if restarts else None), (n - 1 if lates else None)
    moves = np.zeros((n, n))
    for row, run in zip(moves, runs, strict=True):
        if restart is not None:
            row[restart] += run.p_miss
        if late is not None:
            row[late] += run.p_late
        row[0] += 1.0 - row.sum()
    balance = moves.T - np.eye(n)
    balance[-1] = 1.0  # one balance equation is redundant: the shares' sum replaces it
    return np.linalg.solve(balance, np.eye(n)[-1]).tolist()


def _run_gap(
    full: float,
    late: float,
    first: float,
    *,
    window_s: float,
    tree_s: float,
    redraft_s: float,
    miss_share: float,
    chains_in_flight: int,
    verify_s: float,
    pass_s: float,
    live: float,
    holdable: float,
    fork: float,
    fork_tree: float,
) -> _Run:
    """One run whose first tree starts `late` after its chain left and whose first chain is
    accepted whole with P = `first` (a restart chain's), each later one with P = `full`; a
    rejection whose branch went up as a fork goes on too (the fork left when the chain's tree
    was drafted). It ends at another rejection,
    whose verdict a hit follows once its tree is drafted and a miss after a redraft. The next
    run may start late: a hit sends its chain at once, but its tree queues behind a pass still
    drafting the stale chain sent ahead. So does the tree of a fork taken whose tree was not
    drafted along, and the chain after a fork taken leaves only once the verdict taking it is
    in (the run's times are expectations over which way each chain went on)."""
    drafted: list[float] = []
    verdicts: list[float] = []
    seconds = count = p_miss = p_late = waits = 0.0
    reach = 1.0  # P(the run gets to chain k)
    forked_on = fork_wait = 0.0  # P(chain k is a fork taken | the run got to it), its tree's wait
    forked_before = 0.0  # the same for chain k − 1
    shapes: list[tuple[float, ...]] = []  # each chain's times relative to its verdict, its odds
    ends: list[tuple[float, ...]] = []  # each chain's (goes on, value, misses, stale, busy)
    repeats = [0] * (PERIOD_MAX + 1)  # per period p: chains in a row of chain k − p's shape
    while reach > RUN_TAIL and len(verdicts) < RUN_LIMIT:
        k = len(verdicts)
        leave = 0.0 if k == 0 else drafted[-1]
        if k >= 2:  # after a fork taken the edge sends on only once it hears the verdict taking it
            leave += forked_before * max(verdicts[k - 2] - leave, 0.0)
        if k >= chains_in_flight:
            leave = max(leave, verdicts[k - chains_in_flight])
        held = 0.0  # a pass of its tree held for the verdict before it, which accepted it whole
        if k > 0 and leave + TIME_EPS < verdicts[-1] < leave + tree_s - TIME_EPS:
            held = holdable * (1.0 - live) ** 2 * pass_s / 2
        start = (1.0 - forked_on) * held + forked_on * (1.0 - fork_tree) * fork_wait
        drafted.append(leave + (late if k == 0 else start) + tree_s)
        verdict = max(leave + window_s, verdicts[-1] + verify_s if verdicts else 0.0)
        verdicts.append(verdict)
        # the run ends at this chain's rejection: a hit leaves once its tree is drafted, a
        # miss redrafts once the pass in flight is done
        ahead = drafted[k]  # the next chain leaves here, if a place in flight is free
        if k + 1 >= chains_in_flight:
            ahead = max(ahead, verdicts[k + 1 - chains_in_flight])
        busy = _pass_left(verdict, drafted[k], ahead, tree_s, pass_s, live, holdable)
        hit, miss = max(verdict, drafted[k]), verdict + busy + redraft_s
        whole = first if k == 0 else full
        forked = fork if drafted[k] < verdict else 0.0  # forks go up before the verdict only
        goes_on = min(whole + (1.0 - whole) * forked, ALPHA_MAX)
        misses = min(miss_share / (1.0 - forked), 1.0) if forked < 1 else 0.0  # of the others
        end = reach * (1.0 - goes_on)  # P(the run ends at chain k)
        value = (1.0 - misses) * hit + misses * miss
        # a stale chain's pass in flight: a hit's tree waits for it
        stale = float(ahead < verdict and busy > 0)
        seconds += end * value
        count += end * (k + 1)
        p_miss += end * misses
        p_late += end * (1.0 - misses) * stale
        waits += end * (1.0 - misses) * stale * busy
        # a fork taken here whose tree was not drafted along: it starts after the pass in flight
        # (the stale chain's, which drafts forks' trees and is never held)
        left = _pass_left(verdict, drafted[k], ahead, tree_s, pass_s, live, 0.0)
        fork_wait = max(verdict + left - drafted[k], 0.0)
        forked_before = forked_on
        forked_on = (1.0 - whole) * forked / goes_on if goes_on > 0 else 0.0
        reach *= goes_on
        gap = verdict - verdicts[-2] if k else 0.0
        now = (gap, drafted[k] - verdict, ahead - verdict, hit - verdict, miss - verdict,
               goes_on, misses, stale * busy, forked_on, fork_wait)  # fmt: skip
        for p in range(1, min(k, PERIOD_MAX) + 1):
            repeats[p] = repeats[p] + 1 if _same(now, shapes[-p]) else 0
        shapes.append(now)
        ends.append((goes_on, value, misses, stale, busy))
        # once every chain repeats the one p before it long enough to cover all the recursion
        # reads (chains in flight back), every later one does, p verdict gaps later: sum them
        period = next((p for p in range(1, PERIOD_MAX + 1) if repeats[p] > chains_in_flight + p),
                      0)  # fmt: skip
        if period:
            more = _cycle_tail(ends[-period:], verdict - verdicts[-1 - period], k)
            seconds += reach * more[0]
            count += reach * more[1]
            p_miss += reach * more[2]
            p_late += reach * more[3]
            waits += reach * more[4]
            break
    return _Run(seconds, count, p_miss, p_late, waits / p_late if p_late else 0.0)


def _cycle_tail(cycle: Sequence[tuple[float, ...]], shift_s: float, last: int) -> tuple[float, ...]:
    """A run's remaining chains, per unit of P(reaching them), where they repeat `cycle` (the
    last p chains, up to chain `last`: goes on, value, misses, stale, busy) forever, each
    repetition `shift_s` later: E[seconds, verdicts, misses, late start, late wait] at the
    run's end. Repetition m ≥ 1 of entry i ends the run with P^(m−1)·c_i·(1 − g_i), P = Π g,
    c_i = Π_{j<i} g_j; those weights over one cycle sum to 1 − P."""
    p = len(cycle)
    whole = math.prod(g for g, *_ in cycle)
    reach, weights = 1.0, []
    for goes_on, *_ in cycle:
        weights.append(reach * (1.0 - goes_on) / (1.0 - whole))
        reach *= goes_on
    first = last + 1 - p  # the chain index entry 0 repeats, one cycle on
    periods = 1.0 / (1.0 - whole)  # E[repetitions] to the run's end
    seconds = sum(w * value for w, (_, value, *_) in zip(weights, cycle, strict=True))
    count = sum(w * (first + i + 1) for i, w in enumerate(weights))
    misses = sum(w * m for w, (_, _, m, _, _) in zip(weights, cycle, strict=True))
    late = sum(w * (1.0 - m) * st for w, (_, _, m, st, _) in zip(weights, cycle, strict=True))
    waits = sum(w * (1.0 - m) * st * b for w, (_, _, m, st, b) in zip(weights, cycle, strict=True))
    return seconds + shift_s * periods, count + p * periods, misses, late, waits


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 for x, y in zip(a, b, strict=True))


def _pass_left(
    verdict: float,
    drafted: float,
    ahead: float,
    tree_s: float,
    pass_s: float,
    live: float,
    holdable: float,
) -> float:
    """How much of the edge's pass in flight is left, on average, at a rejection's verdict:
    of the chain's own tree still being drafted (half a pass), or of the tree of the chain sent
    after it, which a forward does not stop midway but `holds_pass` mostly keeps out of the
    verdict's way (live²/2 of a pass where it may hold it, half a pass where not); at most what
    is left of the tree. Where in a pass a verdict lands is the jitter of every time before
    it, which the model does not know."""
    left = 0.0
    if verdict < drafted:
        left = min(pass_s / 2, drafted - verdict)
    elif ahead < verdict < ahead + tree_s:
        share = holdable * live**2 + (1.0 - holdable)
        left = min(share * pass_s / 2, ahead + tree_s - verdict)
    return left if left > TIME_EPS else 0.0  # times equal but for their sums' rounding


@dataclass(frozen=True)
class Estimates:
    """What the edge has measured: per-token acceptance, the window (send to verdict), one tree
    pass, one plain draft step, the share of rejections the tree missed, and the cloud's time
    per chain."""

    alpha: float
    window_s: float
    tree_pass_s: float
    draft_s: float
    miss_share: float
    verify_s: float = 0.0  # the cloud's time per chain, which binds chains sent back to back
    # per γ, the miss share the tree of that length is predicted to have (else `miss_share`)
    miss_by_gamma: Mapping[int, float] | None = None
    # the share of tree hits that were forks already with the cloud (`deepspec-tree`), among
    # the hits on chains whose forks went up before the verdict; per depth of the rejection
    # 0, 1, … in `depth_fork_share` (forks go up shallowest first), this beyond its end
    fork_share_of_hits: float = 0.0
    # the share of forks taken whose tree was drafted along, in the passes of the chain after
    fork_tree_share: float = 1.0
    # the share of the passes of chains sent ahead the edge may hold (not drafting forks' trees)
    holdable: float = 1.0
    # per depth 1, 2, …: P(a chain's token there is accepted | the ones before it were); `alpha`
    # beyond its end (empty: i.i.d. acceptance)
    depth_alpha: tuple[float, ...] = ()
    depth_fork_share: tuple[float, ...] = ()

    def accept(self, depth: int) -> float:
        """P(a chain's token at `depth` (1 = first) is accepted | the ones before it were)."""
        alpha = self.depth_alpha[depth - 1] if depth <= len(self.depth_alpha) else self.alpha
        return min(max(alpha, ALPHA_MIN), ALPHA_MAX)

    def full(self, length: int) -> float:
        """P(a chain's first `length` tokens are all accepted)."""
        return math.prod(self.accept(k) for k in range(1, length + 1))

    def tokens(self, gamma: int) -> float:
        """E[L]: tokens a chain of γ commits (accepted ones, plus the resolved one at a
        rejection), Σ_{k<γ} P(at least k + 1 tokens) = Σ_{k<γ} P(the first k accepted)."""
        return sum(self.full(k) for k in range(gamma))

    def miss(self, gamma: int) -> float:
        if self.miss_by_gamma is None or gamma not in self.miss_by_gamma:
            return self.miss_share
        return self.miss_by_gamma[gamma]

    def fork(self, gamma: int) -> float:
        """P(the rejection's branch is a fork the cloud already holds, where the chain's tree
        beat its verdict) at draft length γ: the hits the tree of that length is predicted to
        have, times the forks' share of them at the depths where a chain of γ is rejected."""
        return (1.0 - self.miss(gamma)) * self._fork_share(gamma)

    def _fork_share(self, gamma: int) -> float:
        shares = self.depth_fork_share
        if not shares:
            return self.fork_share_of_hits
        # P(the rejection is at depth j), j = 0 … γ − 1 (the first j accepted, the next not)
        at = [self.full(j) * (1.0 - self.accept(j + 1)) for j in range(gamma)]
        share = [shares[j] if j < len(shares) else self.fork_share_of_hits for j in range(gamma)]
        total = sum(at)
        return sum(w * f for w, f in zip(at, share, strict=True)) / total if total else 0.0


def chain_cycle(gamma: int, est: Estimates, chains_in_flight: int = 1, restart: int = 0) -> Cycle:
    """The cycle at draft length γ with D chains in flight; with `restart` (`restart_length`,
    0 = off) each miss is followed by a chain that long, where more than one is in flight."""

    restarts = chains_in_flight > 1 and 0 < restart < gamma
    return cycle(
        min(est.full(gamma), ALPHA_MAX),
        window_s=est.window_s,
        tree_s=gamma * est.tree_pass_s,
        redraft_s=gamma * est.draft_s,
        miss_share=est.miss(gamma),
        chains_in_flight=chains_in_flight,
        verify_s=est.verify_s,
        pass_s=est.tree_pass_s,
        holdable=est.holdable,
        restart_full=est.full(restart) if restarts else None,
        restart_redraft_s=restart * est.draft_s,
        fork=est.fork(gamma),
        fork_tree=est.fork_tree_share,
    )


def chain_seconds(gamma: int, est: Estimates, chains_in_flight: int = 1, restart: int = 0) -> float:
    """E[T] between two verdicts at draft length γ with D chains in flight."""
    return chain_cycle(gamma, est, chains_in_flight, restart).gap_s


def modelled_rate(gamma: int, est: Estimates, chains_in_flight: int = 1, restart: int = 0) -> float:
    """Tokens per second the model predicts at (γ, D): per verdict, a chain of γ's tokens, or a
    restart chain's in the share of verdicts that are on one."""
    found = chain_cycle(gamma, est, chains_in_flight, restart)
    share = found.restart_share
    tokens = (1 - share) * est.tokens(gamma)
    if share:
        tokens += share * est.tokens(restart)
    return tokens / found.gap_s if found.gap_s > 0 else math.inf


def best_setting(
    current: tuple[int, int],
    gammas: Sequence[int],
    depths: Sequence[int],
    est: Estimates,
    switch_gain: float = SWITCH_GAIN,
    restart: int = 0,
    budget_fixed: bool = False,
) -> tuple[int, int]:
    """The (γ, D) among the candidates with the most modelled tokens per second, or `current`
    unless that beats it by more than `switch_gain` (a change of D alone needs no margin: no
    tree drafted for the old setting is lost). Among settings within `DEPTH_SLACK` of the best,
    the fewest chains in flight win: a chain sent ahead that turns stale costs uplink bits the
    model does not count. Only γ whose tree fits in the window are candidates: a tree that
    overruns it makes the planner shrink the budget, and the hits measured at the old budget
    would not hold; unless the budget is fixed (`budget_fixed`: chosen by `best_plan`)."""
    room = TREE_ROOM * est.window_s
    fitting = [g for g in gammas if budget_fixed or g * est.tree_pass_s <= room] or list(gammas)
    rates = {(g, d): r for g in fitting for d, r in _depth_rates(g, est, depths, restart).items()}
    best = _leanest(rates)
    if current[0] not in fitting:  # its modelled rate assumes a tree it will not get
        return best
    if best[0] == current[0]:
        return best
    if current in rates:
        now = rates[current]
    else:
        now = modelled_rate(current[0], est, current[1], restart)
    return best if rates[best] > (1 + switch_gain) * now else current


def _depth_rates(
    gamma: int, est: Estimates, depths: Sequence[int], restart: int
) -> dict[int, float]:
    """The modelled rate at γ for each number of chains in flight among `depths`, fewest
    first, up to the first that adds nothing: once the cloud's own pace binds, more chains in
    flight change nothing, and the cycle model is the edge's costliest sum."""
    rates: dict[int, float] = {}
    for depth in sorted(depths):
        rate = modelled_rate(gamma, est, depth, restart)
        if rates and rate <= (1 + 1e-9) * rates[max(rates)]:
            break
        rates[depth] = rate
    return rates


def _leanest(rates: Mapping[Any, float]) -> Any:
    """The setting (γ, D, …) with the fewest chains in flight among those within `DEPTH_SLACK`
    of the best rate; the fastest among those, then the shortest γ and the fewest tips."""
    top = max(rates.values())
    return min((s for s, r in rates.items() if r >= (1 - DEPTH_SLACK) * top),
               key=lambda s: (s[1], -rates[s], *s))  # fmt: skip


def best_plan(
    current: tuple[int, int, int],
    gammas: Sequence[int],
    depths: Sequence[int],
    budgets: Sequence[int],
    at_budget: Callable[[int], Estimates],
    restart: int = 0,
) -> tuple[int, int, int]:
    """(γ, D, B) chosen together, each budget B among `budgets` priced at its own estimates
    (`at_budget(B)`: its pass time and each γ's miss share): the best setting if it changes γ
    and models `SWITCH_GAIN` more than the current γ at its own best budget, else the current γ
    at that budget if it models `BUDGET_GAIN` more than at the current one (the fewest tips
    among equals), else the current γ and budget; D as `best_setting` picks it, with no
    margin. Together, because each pins the other: at a small budget long chains miss often,
    and with short chains a larger budget buys nothing, so choosing one after the other never
    leaves such a pair. A change of γ is weighed against what a change of budget alone gets:
    against the current γ at a worse budget, a new γ passes for the budget's gain.

    The candidates are every γ at the current budget, the current γ at every budget, and γ
    within `PLAN_STEP` of the current at the budgets next to it: a local search that finds
    such pairs a step at a time, at a fraction of the cycle model's cost of every pair (the
    edge runs it once per chain)."""
    gamma, _, budget = current
    order = sorted({*budgets, budget})
    at = order.index(budget)
    near = [b for b in order[max(at - 1, 0) : at + 2] if b != budget]
    pairs = {(g, budget) for g in gammas} | {(gamma, b) for b in budgets}
    pairs |= {(g, b) for b in near for g in gammas if abs(g - gamma) <= PLAN_STEP}
    ests = {b: at_budget(b) for b in {b for _, b in pairs}}
    rates = {(g, d, b): r for g, b in pairs
             for d, r in _depth_rates(g, ests[b], depths, restart).items()}  # fmt: skip

    def leanest(keep: Callable[[tuple[int, int, int]], bool]) -> tuple[int, int, int]:
        return _leanest({s: r for s, r in rates.items() if keep(s)})

    now = leanest(lambda s: s[0] == gamma and s[2] == budget)
    same = leanest(lambda s: s[0] == gamma and s[2] in budgets)
    best = leanest(lambda s: s[2] in budgets)
    if best[0] != gamma and rates[best] > (1 + SWITCH_GAIN) * max(rates[same], rates[now]):
        return best
    return same if rates[same] > (1 + BUDGET_GAIN) * rates[now] else now


@dataclass
class PassCost:
    """A pass's seconds as a function of its tips, fitted to the passes the edge has timed:
    a line a + b·tips by least squares through the mean time at each tips count seen (weighted
    by how often), b ≥ 0. An edge with no latency profile prices its trees with it (AceSpec's
    budget rule, the forks' trees a pass may carry, `tree_budget="auto"`). Before any pass
    is timed a pass costs nothing, so the first tree is drafted at B_max; one tips count alone
    (a single budget so far) makes it flat, so a larger budget gets tried once and then priced
    by its own passes."""

    weight: float = 0.3  # each tips count's EWMA weight
    _means: dict[int, Ewma] = field(default_factory=dict)
    _counts: dict[int, int] = field(default_factory=dict)
    _line: tuple[float, float] = (0.0, 0.0)  # refitted per pass timed, read per budget priced

    def observe(self, tips: int, seconds: float) -> None:
        if tips < 1 or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a pass of {tips} tips cannot take {seconds} s")
        self._means.setdefault(tips, Ewma(self.weight)).update(seconds)
        self._counts[tips] = self._counts.get(tips, 0) + 1
        self._line = self._fit()

    def line(self) -> tuple[float, float]:
        """(a, b): seconds at zero tips and per tip."""
        return self._line

    def _fit(self) -> tuple[float, float]:
        tips = np.array(list(self._means), dtype=np.float64)
        secs = np.array([m.value for m in self._means.values()], dtype=np.float64)
        weights = np.array(list(self._counts.values()), dtype=np.float64)
        mean_tips = np.average(tips, weights=weights)
        mean_secs = np.average(secs, weights=weights)
        spread = np.average((tips - mean_tips) ** 2, weights=weights)
        slope = 0.0
        if spread > 0:
            slope = max(np.average((tips - mean_tips) * (secs - mean_secs), weights=weights)
                        / spread, 0.0)  # fmt: skip
        return max(float(mean_secs - slope * mean_tips), 0.0), float(slope)

    def __call__(self, tips: int) -> float:
        a, b = self._line
        return a + b * tips


@dataclass
class ChainController:
    """γ (and, with `adapt_depth`, D) for the next chain, from running estimates the edge feeds.

    Feeds: `observe_verdict(accepted, drafted, window_s)` per verdict; `observe_tree_pass(s)` and
    `observe_draft(s)` per compute; `observe_outcome(hit, fork=, in_time=)` per rejection looked
    up in the tree (or taken as a fork); `observe_ahead_pass(holdable=)` per pass of a
    chain-sent-ahead's tree. With `sends_forks` (`deepspec-tree`) it prices forks taken.
    Until the estimates exist (`WARMUP_CHAINS` verdicts, one tree pass and one draft) it keeps
    `start` and `START_DEPTH`. `adapt_gamma` False holds γ at `start`; `chains_in_flight` is D,
    or D's upper limit when `adapt_depth`. With a `hit_model` each candidate γ gets the miss
    share its own tree is predicted to have; without one (or before it knows), the measured.
    With `budgets` it chooses the tree budget among them together with γ and D once the hit
    model predicts (`best_plan`), pricing a pass by `tree_seconds` (a latency profile's
    seconds per tips, or the edge's `PassCost`); it starts at `start_budget`."""

    start: int
    gamma_max: int
    chains_in_flight: int = 1
    sends_forks: bool = False
    adapt_gamma: bool = True
    adapt_depth: bool = False
    restart: int = 0  # `restart_length`: the chain after a miss, where D > 1 (0 = γ)
    # P(hit | rejection) of the tree for a chain of γ at a budget (None: the planner's own), or
    # None while unknown (the planner's)
    hit_model: Callable[[int, int | None], float | None] | None = None
    budgets: tuple[int, ...] = ()  # the tree budgets it may choose among (none: the planner's)
    tree_seconds: Callable[[int], float] | None = None  # a pass of B tips (with `budgets`)
    start_budget: int = DEFAULT_TREE_BUDGET
    gamma: int = field(init=False)
    budget: int | None = field(init=False, default=None)
    depth: int = field(init=False)
    verdicts: int = field(init=False, default=0)
    accepted: int = field(init=False, default=0)
    tested: int = field(init=False, default=0)
    # per depth 1..γ_max: tokens accepted there, and tokens tested there (the ones before
    # accepted)
    depth_accepted: list[int] = field(init=False)
    depth_tested: list[int] = field(init=False)
    rejections: int = field(init=False, default=0)
    misses: int = field(init=False, default=0)
    forks: int = field(init=False, default=0)
    # per rejection depth 0..γ_max − 1: hits whose chain's tree beat its verdict, and the forks
    # taken among them
    depth_fork_chances: list[int] = field(init=False)
    depth_forks: list[int] = field(init=False)
    fork_trees: int = field(init=False, default=0)  # forks taken whose tree was drafted along
    ahead_passes: int = field(init=False, default=0)
    holdable_passes: int = field(init=False, default=0)
    window: Ewma = field(init=False, default_factory=Ewma)
    tree_pass: Ewma = field(init=False, default_factory=Ewma)
    # the last passes' tips, each in its own tree's: 1, or more with forks' trees along
    pass_trees: deque[float] = field(init=False, default_factory=lambda: deque(maxlen=PASSES_KEPT))
    draft: Ewma = field(init=False, default_factory=Ewma)
    verify_s: float | None = field(init=False, default=None)
    round_trip_s: float | None = field(init=False, default=None)
    history: list[int] = field(init=False, default_factory=list)
    budget_history: list[int] = field(init=False, default_factory=list)
    depth_history: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.gamma_max:
            raise ValueError(f"start γ {self.start} outside [1, {self.gamma_max}]")
        if self.chains_in_flight < 1:
            raise ValueError(f"chains in flight must be at least 1, got {self.chains_in_flight}")
        if self.budgets:
            if self.tree_seconds is None or self.hit_model is None:
                raise ValueError("choosing the tree budget needs a pass cost and a hit model")
            if self.start_budget not in self.budgets:
                raise ValueError(f"start budget {self.start_budget} not among {self.budgets}")
            self.budget = self.start_budget
        self.gamma = self.start
        self.depth_accepted = [0] * self.gamma_max
        self.depth_tested = [0] * self.gamma_max
        self.depth_fork_chances = [0] * self.gamma_max
        self.depth_forks = [0] * self.gamma_max
        self.depth = (
            min(START_DEPTH, self.chains_in_flight) if self.adapt_depth else (self.chains_in_flight)
        )

    @property
    def alpha(self) -> float:
        """The per-token acceptance rate (accepted / tested, as `BranchPlanner.alpha`)."""
        return self.accepted / self.tested if self.tested else PRIOR_ALPHA

    @property
    def fork_chances(self) -> int:
        """Hits whose chain's tree beat its verdict: those whose branch could be a fork."""
        return sum(self.depth_fork_chances)

    @property
    def depth_alpha(self) -> tuple[float, ...]:
        """Acceptance per depth (`Estimates.depth_alpha`), each shrunk towards the pooled α by
        `DEPTH_PRIOR_TOKENS`: a depth seldom reached keeps about α."""
        return _shrunk(self.depth_accepted, self.depth_tested, self.alpha)

    def observe_verdict(self, accepted: int, drafted: int, window_s: float | None) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted")
        self.verdicts += 1
        self.accepted += accepted
        self.tested += accepted + int(accepted < drafted)
        for depth in range(min(accepted + 1, drafted, self.gamma_max)):
            self.depth_tested[depth] += 1
            self.depth_accepted[depth] += int(depth < accepted)
        if window_s is not None:
            self.window.update(window_s)

    def observe_outcome(
        self,
        hit: bool,
        *,
        depth: int,
        fork: bool = False,
        in_time: bool = True,
        fork_tree: bool = False,
    ) -> None:
        """A rejection at `depth` (the tokens accepted before it) looked up in the tree: a hit
        or a miss, and a hit that was a fork the cloud held already (`deepspec-tree`), with its
        own tree drafted along (`fork_tree`) or not. `in_time`: the chain's tree was drafted
        before its verdict came, so its forks could go up (a fork taken always was)."""
        if fork and not (hit and in_time):
            raise ValueError("a fork taken is a hit, on a chain whose tree was drafted")
        if fork_tree and not fork:
            raise ValueError("only a fork taken has a tree drafted along")
        if not 0 <= depth < self.gamma_max:
            raise ValueError(f"a rejection at depth {depth} of chains of at most {self.gamma_max}")
        self.fork_trees += int(fork_tree)
        self.rejections += 1
        self.misses += int(not hit)
        self.forks += int(fork)
        self.depth_forks[depth] += int(fork)
        self.depth_fork_chances[depth] += int(hit and in_time)

    def observe_ahead_pass(self, *, holdable: bool) -> None:
        """A pass of a chain-sent-ahead's tree is due: one the edge may hold for the verdict,
        or one that also drafts forks' trees, which it never holds."""
        self.ahead_passes += 1
        self.holdable_passes += int(holdable)

    def observe_verdict_gap(self, seconds: float) -> None:
        """The time between a verdict and the one before, for a chain sent before that one came:
        never less than the cloud's time per chain, and equal to it when the chain waited at
        the cloud, so the least seen bounds T_verify from above and soon meets it."""
        self.verify_s = seconds if self.verify_s is None else min(self.verify_s, seconds)

    def observe_round_trip(self, seconds: float) -> None:
        """The handshake's round trip (the cloud answers it without computing), less its
        messages' sending once the uplink's rate is known (`bare_round_trip_s`): the window less
        it bounds the cloud's time per chain, which the verdict gaps show only once a chain
        waits at the cloud; where the edge is slower, none ever does. With the sending left in,
        a slow link makes that bound far too short (124 ms for a cloud that takes 147 at
        50 kbit/s), and chains whose tree is shorter than the cloud's time look free."""
        self.round_trip_s = seconds

    def observe_tree_pass(self, seconds: float, tips: int = 1, own: int | None = None) -> None:
        """A tree pass of `tips` tips took `seconds`; its own tree had `own` of them (fewer
        where forks' trees were drafted along, `deepspec-tree`: a pass at another budget
        drafts them at that budget too)."""
        self.tree_pass.update(seconds)
        self.pass_trees.append(tips / (own or tips))

    def observe_draft(self, seconds: float) -> None:
        self.draft.update(seconds)

    def estimates(self) -> Estimates | None:
        """The model's inputs, once measured."""
        window, tree, draft = self.window.value, self.tree_pass.value, self.draft.value
        if self.verdicts < WARMUP_CHAINS or None in (window, tree, draft):
            return None
        miss_share = (self.misses + PRIOR_MISS_SHARE) / (self.rejections + 1)
        # with no chain sent ahead yet, the cloud's time is bounded by the window alone
        verify = window if self.verify_s is None else min(self.verify_s, window)
        if self.round_trip_s is not None:
            verify = min(verify, max(window - self.round_trip_s, 0.0))
        forks = self._pooled_fork_share() if self.sends_forks else 0.0
        depth_forks = self._depth_fork_share(forks) if self.sends_forks else ()
        # one pseudo-pass that may be held: before any chain goes ahead, its passes may be
        holdable = (self.holdable_passes + 1) / (self.ahead_passes + 1)
        # one pseudo-fork in two drafted along
        fork_trees = (self.fork_trees + 1) / (self.forks + 2)
        return Estimates(
            self.alpha, window, tree, draft, miss_share, verify, self._misses(),
            fork_share_of_hits=forks, fork_tree_share=fork_trees, holdable=holdable,
            depth_alpha=self.depth_alpha, depth_fork_share=depth_forks,
        )  # fmt: skip

    def _pooled_fork_share(self) -> float:
        """The share of hits that were forks, among the hits whose chain's tree beat its
        verdict, with `FORK_PRIOR_HITS` pseudo-hits half of them forks: a setting whose trees
        end at the verdict takes no fork, and must not teach that shorter ones would not
        either."""
        prior = FORK_PRIOR_HITS
        return (self.forks + prior / 2) / (self.fork_chances + prior)

    def _depth_fork_share(self, pooled: float) -> tuple[float, ...]:
        """The forks' share of the hits per rejection depth, each shrunk towards the pooled one
        by `DEPTH_PRIOR_TOKENS`: forks go up shallowest first, so a longer chain, rejected deeper
        more often, finds fewer of its branches with the cloud."""
        return _shrunk(self.depth_forks, self.depth_fork_chances, pooled)

    def _best_plan(self, est: Estimates, gammas: Sequence[int], depths: Sequence[int]) -> None:
        """γ, D and the budget for the next tree (`best_plan`), once the hit model predicts at
        every budget; a pass at another budget costs the measured pass times the ratio of
        `tree_seconds`' costs, at the last passes' shapes: forks' trees are drafted at the
        chain's budget too."""
        assert self.budget is not None and self.hit_model is not None
        hits = {(g, b): self.hit_model(g, b) for g in gammas for b in self.budgets}
        if None in hits.values():
            current = (self.gamma, self.depth)
            self.gamma, self.depth = best_setting(
                current, gammas, depths, est, restart=self.restart, budget_fixed=True
            )
            return
        trees, cost = self.pass_trees or [1.0], self.tree_seconds
        assert cost is not None

        def pass_s(budget: int) -> float:  # the mean over the passes' shapes: they vary a lot
            return sum(cost(max(round(k * budget), 1)) for k in trees) / len(trees)

        now = pass_s(self.budget)
        scale = est.tree_pass_s / now if now > 0 else 1.0

        def at_budget(budget: int) -> Estimates:
            misses = {g: 1.0 - hits[g, budget] for g in gammas}  # type: ignore[operator]
            return replace(est, tree_pass_s=scale * pass_s(budget), miss_by_gamma=misses)

        self.gamma, self.depth, self.budget = best_plan(
            (self.gamma, self.depth, self.budget), gammas, depths, self.budgets, at_budget,
            restart=self.restart,
        )  # fmt: skip

    def _misses(self) -> dict[int, float] | None:
        """The hit model's miss share per candidate γ: a longer chain spreads the same budget
        over more depths, so its tree misses more often than the one measured."""
        if self.hit_model is None:
            return None
        hits = {g: self.hit_model(g, self.budget) for g in range(1, self.gamma_max + 1)}
        return {g: 1.0 - h for g, h in hits.items() if h is not None} or None

    def next_gamma(self) -> int:
        """γ for the chain about to be drafted (recorded in `history`); it also sets `depth`,
        the chains that may be in flight from now on (recorded in `depth_history`)."""
        est = self.estimates()
        if est is not None:
            gammas = range(1, self.gamma_max + 1) if self.adapt_gamma else [self.gamma]
            # D moves only once the cloud's time per chain is measured (from chains sent ahead)
            free = self.adapt_depth and self.verify_s is not None
            depths = range(1, self.chains_in_flight + 1) if free else [self.depth]
            if self.budgets:
                self._best_plan(est, gammas, depths)
            else:
                self.gamma, self.depth = best_setting((self.gamma, self.depth), gammas, depths,
                                                      est, restart=self.restart)  # fmt: skip
        self.history.append(self.gamma)
        if self.budget is not None:
            self.budget_history.append(self.budget)
        self.depth_history.append(self.depth)
        return self.gamma
