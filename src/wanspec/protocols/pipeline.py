"""Asynchronous pipelines: PicoSpec, AceSpec, and AceSpec across vocabularies (`acespec-x`),
each of the last two also with chains in flight (`deepspec`, `deepspec-x`), and `deepspec-tree`,
which also sends its trees' branches as forks.

One main chain is in flight at a time, as in AceSpec's Algorithm 1. While the cloud verifies it,
the edge drafts ahead instead of idling:
- PicoSpec drafts the continuation after the chain, assuming it will all be accepted;
- AceSpec also drafts alternative branches: at each chain depth k the top-F_k draft tokens other
  than x_k, each continued for γ tokens, all tips extended together in ONE tree pass per depth.
On the reply the edge resolves the rejected position exactly (the method's scheme: the sparse
target distribution for `picospec`/`acespec`, SR-DV for `acespec-x`, whose fallback after M
candidate rounds is the residual of the float q drawn on the cloud from the uploaded p̃), then
looks up the outcome (π, token): a hit makes that branch's continuation the next main chain at
once (its KV entries kept behind the verified prefix, the rest dropped); a miss cancels the tree
and redrafts. At full acceptance the cloud samples no bonus token: the continuation's first token
is verified at that position instead, which is the same law and gives the papers' E[L].

`deepspec` keeps a second chain in flight (`deepspec-x` likewise for `acespec-x`): once the
tree's passes are done and the verdict is still out, the edge sends the continuation right away
as the next chain, marked `ahead` (it assumes the one in flight will be accepted whole). The
cloud verifies it the moment that chain is accepted whole, so the round trip is hidden; after a
rejection the cloud drops it as stale, and the tree lookup goes on as in AceSpec. Its base alone
cannot tell: in `deepspec-x` SR-DV's fallback is drawn on the cloud, which appends that token,
so after a rejection at a chain's last position the cloud's output is exactly as long as the
base of the chain sent ahead, which assumed the drafted token there. So the cloud verifies a
chain marked `ahead` only if the round before it was the last it verified and was accepted
whole with nothing of its own appended (`SpecCloud._current`). A chain sent ahead is the very
chain AceSpec (AceSpec-X) would send after that verdict, so a seed gives its tokens; only the
time differs.

`deepspec-tree` runs on UL (p̃ goes up with every chain; the cloud draws a rejection's token
itself) and, once a chain's tree is drafted, sends its continuation and its alternative
branches as forks, each naming the round it continues and the token that round's verdict must
leave last in the output. The cloud verifies the one fork the verdict matches at once; the
edge, seeing the same verdict, adopts that branch as the chain awaiting its verdict. Forks go
up only while the uplink, at the rate the edge measures (`wanspec.protocols.uplink`), can
carry them before the next chain leaves. The edge is then the bottleneck (it drafts a tree per
chain, γ passes), while a pass costs about the same for a few tips as for tens: so the passes
of the next chain's tree also draft the trees of the likeliest forks (`fork_trees`), and a fork
taken has its tree (nearly) drafted, its own forks and continuation ready to go up.

A chain sent ahead turns stale at every rejection, and a forward does not stop midway: a pass
of its tree that the verdict interrupts holds up what the verdict asks for (a redraft, the hit
branch's tree). So when the verdict is due before the next such pass would end, the edge leaves
that pass until the verdict comes, where that costs less on average than it saves
(`control.holds_pass`); a chain accepted whole then has its tree resumed.

Draft tokens are sampled with a random stream keyed by (seed, output position), so a token
drafted inside the tree is exactly the token a redraft would give there: the cache only saves
draft work, and a run's tokens do not depend on the tree's shape, the budget or the timing.
That is exact only while no stream serves two verified tokens (SPEC's Randomness clause): every
drafted token records the key it was drawn with, and a verdict that looks at a token whose key is
not its own output position is a local bug and raises (`PipelineEdge._check_streams`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.jobs import KeepTreePath, LogitRows, TreeForward
from wanspec.protocols.base import (
    Action,
    Compute,
    Draw,
    Event,
    MessageReceived,
    ProtocolError,
    Purpose,
    Send,
    position_rng,
)
from wanspec.protocols.budget import BranchPlanner, Ewma, ranked_capture
from wanspec.protocols.control import (
    ChainController,
    PassCost,
    bare_round_trip_s,
    dists_pay,
    fork_pays,
    fork_saving_s,
    holds_pass,
)
from wanspec.protocols.schemes import dist_probs
from wanspec.protocols.speculative import EdgeState, Round, SpecEdge
from wanspec.protocols.uplink import UplinkModel
from wanspec.sampling.proposal import DraftRow

FORKS_UNMEASURED = 2  # forks a tree sends before the uplink's rate is measured
# a pass may draft forks' trees along with its own only while they add at most this share to
# its cost (where the edge's pass cost is known)
FORK_TREE_SLACK = 0.15


@dataclass
class Branch:
    """One drafted continuation in the tree, found by the verdict (`depth` accepted, `root`):
    the continuation after the whole chain (`depth` = γ, `root` = x_γ, the chain's own last
    token) or the alternative `root` in place of chain token `depth`."""

    depth: int
    root: int
    start: int  # output offset (from the chain's first token) of the branch's first drafted token
    nodes: list[int] = field(default_factory=list)  # tree nodes fed: root, c_1, …, c_{γ−1}
    tokens: list[int] = field(default_factory=list)  # drafted c_1 … c_γ (target ids)
    draft_ids: list[int] = field(default_factory=list)
    probs: list[int] = field(default_factory=list)
    dists: list[DraftRow] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # per drafted token: its draft stream's key

    @classmethod
    def continuation(cls, gamma: int, last: int) -> Branch:
        """What follows a fully accepted chain: x_γ stands at offset γ − 1, so the next token is
        output offset γ, where the next chain starts."""
        return cls(gamma, last, start=gamma)

    @classmethod
    def alternative(cls, depth: int, root: int) -> Branch:
        """`root` in place of chain token `depth` (offset `depth`): its continuation starts at
        the offset after it."""
        return cls(depth, root, start=depth + 1)


@dataclass
class Speculation:
    """The tree drafted for one chain in flight.

    Its nodes are numbered in the draft model's pending tree from `offset` on: the trees of the
    chains in flight lie there one after the other, oldest first, each hanging from the branch
    of the one before that its chain continues."""

    branches: list[Branch]
    base: int  # output position of the chain's first token: the branches' positions count from it
    depth: int  # the chain's length: the continuation branch hangs off its last token
    anchors: list[int]  # per chain position: where the token before it sits (cache offset or node)
    offset: int = 0
    passes_done: int = 0
    passes_planned: int = 0
    nodes: int = 0
    started_at: float | None = None  # when its first pass went out (the driver's clock)
    # the branches sent as forks (`deepspec-tree`), by the verdict that takes them
    forks: dict[tuple[int, int], Round] = field(default_factory=dict)
    # a fork's tree drafted in the passes of the tree after its chain's (`deepspec-tree`): the
    # fork, and (on the tree drafting them) those trees
    fork: Round | None = None
    co: list[Speculation] = field(default_factory=list)
    pass_branches: list[Branch] = field(default_factory=list)  # what the pass in flight extends
    # per tree drafted in the pass in flight (this one, then its `co`): the branches extended
    pass_layout: list[tuple[Speculation, list[Branch]]] = field(default_factory=list)

    @property
    def drafted(self) -> bool:
        return self.passes_done >= self.passes_planned

    def find(self, depth: int, root: int | None) -> Branch | None:
        for branch in self.branches:
            if branch.depth == depth and (root is None or branch.root == root):
                return branch
        return None

    def shift(self, n: int, gone: list[int]) -> None:
        """Renumber after `n` nodes before this tree, and the nodes `gone` (sorted) after
        them, left the pending tree: the rest keep their order."""

        def moved(node: int) -> int:
            return node - n - int(np.searchsorted(gone, node))

        self.offset = moved(self.offset)
        self.anchors = [moved(node) if node >= 0 else node for node in self.anchors]
        for spec in (self, *self.co):
            for branch in spec.branches:
                branch.nodes = [moved(node) for node in branch.nodes]


@dataclass
class InFlight:
    """A chain sent before the verdict on the chain before it, with the tree drafted for it."""

    round: Round
    spec: Speculation
    alternatives: list[list[int]]  # per chain depth: what its tree branched on, best first


def _cache_end(depth: int) -> list[int]:
    """The anchors of a tree whose chain's `depth` tokens are the last ones in the cache."""
    return [-(depth - k) for k in range(depth)]


def _tree_branches(chain: Round, alternatives: list[list[int]], fanout: list[int]) -> list[Branch]:
    """A chain's tree: its continuation, then `fanout[k]` alternatives at each depth k."""
    branches = [Branch.continuation(len(chain.tokens), chain.tokens[-1])]
    for k, width in enumerate(fanout):
        branches += [Branch.alternative(k, a) for a in alternatives[k][:width]]
    return branches


def _chain_of(branch: Branch, rnd: Round) -> Round:
    """`rnd` holding a drafted branch as its chain: tokens, draft ids, p̃(x), p̃ and stream keys."""
    rnd.tokens, rnd.draft_ids = list(branch.tokens), list(branch.draft_ids)
    rnd.probs, rnd.dists = list(branch.probs), list(branch.dists)
    rnd.keys = list(branch.keys)
    return rnd


class PipelineEdge(SpecEdge):
    """The edge of `picospec`, `acespec`, `deepspec`, `deepspec-tree`, `acespec-x` and
    `deepspec-x` (see the module docstring).

    STALLED: a verdict hit a branch whose passes are not all drafted; the edge waits for its own
    tree passes (the cloud has nothing in flight for it), then goes on with `pending_key`."""

    EXPECTS = {**SpecEdge.EXPECTS, EdgeState.STALLED: ()}  # noqa: RUF012

    def __init__(
        self,
        *,
        planner: BranchPlanner | None,
        send_ahead: bool = False,
        send_forks: bool = False,
        controller: ChainController | None = None,
        pass_cost: PassCost | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.planner = planner
        self.pass_cost = pass_cost  # fed each tree pass's time where no latency profile is
        self.send_ahead = send_ahead
        self.send_forks = send_forks
        if send_forks and not self.scheme.uploads_dists:
            raise ValueError("forks need a cloud that draws the rejected position's token itself")
        # what the uplink carries, so that forks never hold up the next chain, and so that the
        # controller's bound on the cloud's time leaves the handshake's sending out
        self.uplink = UplinkModel() if send_forks or controller is not None else None
        self.lone_send: Any = None  # the uplink ticket of the chain sent alone, if any
        self.controller = controller
        self.depth_limit = self.settings.chains_in_flight if send_ahead else 1
        self.next_length = self.settings.gamma if controller is None else controller.start
        self.restart_cap: int | None = None  # the length of a chain restarting after a miss
        self.issued_at: dict[str, float | None] = {}  # when the last job of a kind went out
        self.ahead: list[InFlight] = []  # chains sent before the verdict, oldest first (deepspec)
        self.went_ahead = False  # a chain was sent ahead after the first verdict
        self.spec: Speculation | None = None  # the tree of the chain awaiting its verdict
        self.most_in_flight = 1
        self.pending_key: tuple[int, int | None] | None = None  # what STALLED goes on with
        # a taken fork's tree whose pass, drafting a tree now stale, is in flight: where its
        # rows start among that pass's
        self.completing: int | None = None
        # the tree of a chain sent ahead whose next pass waits for the verdict due first
        self.held: Speculation | None = None
        self.pass_s: float | None = None  # the last tree pass's time
        self.pass_tips = (1, 1)  # the tree pass in flight's tips: in all, and its own tree's
        self.sent_at: float | None = None  # when the chain awaiting its verdict left, if alone
        self.opened_at: float | None = None  # when the Hello left
        self.round_trip: float | None = None  # the handshake's (the cloud answers at once)
        self.handshake_bits = 0  # the Hello's and the HelloAck's
        self.reply_bits = 0  # the last message's from the cloud
        self.verdict_at: float | None = None  # when the last verdict came
        # seconds from a verdict to the next, for a chain already with the cloud at the first
        # (sent ahead, or a fork taken): about the cloud's time to verify a chain
        self.verdict_gap = Ewma()
        self.alternatives: list[list[int]] = []  # per chain depth: candidate target ids, best first
        self.round_ctx: list[int] = []  # the draft context the current chain extends
        self.rounds_log: list[dict[str, Any]] = []

    # ---- clock stamps (for the budget and the controller only)
    def on_start(self) -> list[Action]:
        self.opened_at = self.now
        actions = super().on_start()
        hello = [a.msg for a in actions if isinstance(a, Send) and isinstance(a.msg, wire.Hello)]
        self.handshake_bits = sum(wire.bits(msg) for msg in hello)
        return actions

    def on_hello_ack(self, ack: wire.HelloAck) -> list[Action]:
        self.handshake_bits += wire.bits(ack)
        actions = super().on_hello_ack(ack)
        if self.now is not None and self.opened_at is not None:
            self.round_trip = self.now - self.opened_at
            if self.controller is not None:
                self.controller.observe_round_trip(self.round_trip)
        return actions

    def handle(self, event: Event) -> list[Action]:
        if self.uplink is not None and isinstance(event, MessageReceived):
            self.reply_bits = wire.bits(event.msg) if event.bits is None else event.bits
        actions = super().handle(event)  # keeps the stamp in `now`
        for action in actions:
            if isinstance(action, Compute):
                self.issued_at[action.label] = self.now
        return actions

    def _timed(self, purpose: Purpose) -> float | None:
        """Seconds since the last job of this kind was issued (None without clock stamps)."""
        issued = self.issued_at.get(purpose)
        return None if issued is None or self.now is None else self.now - issued

    @property
    def chain_length(self) -> int:
        cap = self.restart_cap
        return self.next_length if cap is None else min(cap, self.next_length)

    @property
    def chains_in_flight(self) -> int:
        """D: how many chains may be in flight now (the controller's choice, or the setting)."""
        return self.depth_limit if self.controller is None else self.controller.depth

    def _choose_length(self) -> int:
        """γ of the next chain: the controller's choice, or the setting; and the tree budget,
        where the controller chooses it."""
        if self.controller is not None:
            self.next_length = self.controller.next_gamma()
            if self.controller.budget is not None and self.planner is not None:
                self.planner.fixed_budget = self.controller.budget
        return self.next_length

    # ---- drafting the main chain
    def _begin_round(self) -> list[Action]:
        self.alternatives = []
        self.round_ctx = list(self.draft_ctx)
        self._choose_length()
        return super()._begin_round()

    def _take(self, logits: LogitRows) -> None:
        rnd = self.round
        row = self._draft_into(rnd, logits, self.generated + len(rnd.tokens))
        self.alternatives.append(row.ranked(self._rank_limit, rnd.tokens[-1]))

    def _draft_into(self, chain: Round | Branch, logits: LogitRows, position: int) -> DraftRow:
        """Draw the draft token at output `position` from its own keyed stream and append it
        (with its draft id, p(x) and p) to a chain."""
        row = self._draft_row(logits, ranks=self._rank_limit)
        self._append_keyed(chain, row, position)
        return row

    def _append_keyed(self, chain: Round | Branch, row: DraftRow, position: int) -> None:
        self._append_draft(
            chain, row.draw(position_rng(self.settings.seed, Draw.DRAFT, position)), row
        )
        chain.keys.append(position)

    @property
    def _rank_limit(self) -> int:
        """How many alternatives a drafted position may branch on (the largest fan-out)."""
        return 0 if self.planner is None else self.planner.b_max

    def _upload(self) -> list[Action]:
        if len(self.round.tokens) < self.next_length:
            self.count("restart_chains")
        self.restart_cap = None  # the tree and the chains after this one are γ long
        self.round.plain = self._goes_plain(self.round, alone=True)
        if self.round.plain:
            self.count("chains_plain")
        actions = super()._upload()
        self.sent_at = self.now
        chains = [a.msg for a in actions if isinstance(a, Send) and hasattr(a.msg, "tokens")]
        self.lone_send = self._log_send(chains[-1]) if chains else None
        return [*actions, *self._speculate()]

    def _goes_plain(self, rnd: Round, *, alone: bool) -> bool:
        """Whether a chain about to go up leaves its p̃ behind (`chain_dists` 'auto',
        `deepspec-tree`). Its p̃ only lets the cloud go on with one of its forks, so it goes
        where forks taken, at the share of rejections they have been taken in on chains with
        p̃ (one pseudo-fork in two pseudo-rejections: the first chains try them out), each
        saving a round trip (the handshake's, less its own sending: `fork_saving_s`; else
        the window), save more time than the p̃ takes on the uplink at its measured rate
        (`dists_pay`). Nothing is priced while the windows do not pin the rate down, which
        small messages on a fast link never do: priced at the slowest rate they fit alike, the
        p̃ would stay behind and no window would carry enough bits to correct it. A chain sent
        alone goes without it until a chain was sent ahead after the first verdict: its forks
        would go up once its tree is drafted before its verdict, which is when a chain is sent
        ahead too; where that never happens (a short window) the run is `deepspec`'s. The
        first window does not count: the cloud's prefill runs in it, so a chain may go ahead
        then where none will later."""
        if not self.scheme.chooses_dists or self.settings.chain_dists != "auto":
            return False
        assert self.planner is not None and self.uplink is not None  # every such edge has them
        counts = self.counters
        window, rate = self.planner.window.value, self.uplink.pinned_rate_bps()
        if window is None or (alone and not self.went_ahead):
            return True
        fork_share = (counts.get("forks_taken", 0) + 1) / (counts.get("dists_rejections", 0) + 2)
        extra_s, saved = 0.0, self._fork_saving(window, None, 0)
        if rate is not None:
            plain_bits = self._bits(rnd, plain=True)
            extra_s = (self._bits(rnd, plain=False) - plain_bits) / rate
            saved = self._fork_saving(window, rate, plain_bits)
        reject = 1.0 - self.planner.alpha ** len(rnd.tokens)
        return not dists_pay(reject=reject, fork_share=fork_share, saved_s=saved, extra_s=extra_s)

    def _bits(self, rnd: Round, *, plain: bool) -> int:
        """The bits of `rnd`'s draft message with its p̃ left behind or not (its flag kept)."""
        kept, rnd.plain = rnd.plain, plain
        bits = wire.bits(self.draft_message(rnd))
        rnd.plain = kept
        return bits

    def _fork_saving(self, window: float, rate: float | None, chain_bits: int) -> float:
        """The time a fork taken saves: the round trip its branch would take to reach the cloud
        (the handshake's, less its own messages' sending plus a chain's, at the measured uplink
        rate: `fork_saving_s`), at most the window."""
        if self.round_trip is None:
            return window
        if rate is None:
            return min(window, self.round_trip)
        return min(window, fork_saving_s(self.round_trip, handshake_bits=self.handshake_bits,
                                         chain_bits=chain_bits, rate_bps=rate))  # fmt: skip

    def _observe_bare_round_trip(self) -> None:
        """Tell the controller the handshake's round trip less its messages' sending, once the
        windows pin the uplink's rate down (`bare_round_trip_s`)."""
        rate = None if self.uplink is None else self.uplink.pinned_rate_bps()
        if self.controller is None or self.round_trip is None or rate is None:
            return
        self.controller.observe_round_trip(
            bare_round_trip_s(self.round_trip, handshake_bits=self.handshake_bits, rate_bps=rate)
        )

    def _log_send(self, msg: Any, bits: int | None = None) -> Any:
        """Log a chain given to the link, with its bits (where the edge prices its uplink)."""
        if self.uplink is None or self.now is None:
            return None
        return self.uplink.sent(self.now, wire.bits(msg) if bits is None else bits)

    # ---- drafting ahead while the chain is in flight
    def _speculate(self) -> list[Action]:
        """The tree for the chain just sent from the committed context: it hangs from the
        cache, its chain's tokens being the last ones there."""
        anchors = _cache_end(len(self.round.tokens))
        self.spec = self._plan_tree(self.round, self.alternatives, anchors, self.generated, 0)
        return [self._tree_pass(self.spec)]

    def _plan_tree(
        self,
        rnd: Round,
        alternatives: list[list[int]],
        anchors: list[int],
        base: int,
        offset: int,
    ) -> Speculation:
        """Plan a chain's tree: its alternatives branch off the chain's depths, and every branch
        is drafted as long as the next chain will be."""
        depth = len(rnd.tokens)
        passes = self._choose_length()
        fanout = self.planner.plan(depth, passes) if self.planner is not None else [0] * depth
        branches = _tree_branches(rnd, alternatives, fanout)
        self.count("tree_rounds")
        self.count("tree_branches", len(branches) - 1)
        self.rounds_log.append({"round": rnd.index, "fanout": list(fanout)})
        return Speculation(branches, base, depth, anchors, offset, passes_planned=passes)

    @property
    def _drafting(self) -> Speculation | None:
        """The tree being drafted (or last drafted): the newest chain's."""
        return self.ahead[-1].spec if self.ahead else self.spec

    def _tree_pass(self, spec: Speculation) -> Any:
        """One pass extending every branch of the tree by a token, and those of the forks'
        trees drafted along with it (`co`)."""
        tokens, parents = [], []
        spec.pass_layout = []
        for tree in (spec, *spec.co):
            if tree.passes_done == 0:  # a fork's tree too: its forks' room counts from it
                tree.started_at = self.now
            tree.pass_branches = [b for b in tree.branches if len(b.nodes) < tree.passes_planned]
            spec.pass_layout.append((tree, tree.pass_branches))
            for branch in tree.pass_branches:
                if not branch.nodes:
                    tokens.append(int(self.alignment.target_to_draft[branch.root]))
                    parents.append(tree.anchors[min(branch.depth, tree.depth - 1)])
                else:
                    tokens.append(branch.draft_ids[-1])
                    parents.append(branch.nodes[-1])
                branch.nodes.append(spec.offset + spec.nodes + len(tokens) - 1)
        spec.nodes += len(tokens)
        self.count("tree_nodes", len(tokens))
        self.pass_tips = (len(tokens), len(spec.pass_branches))
        context = self.cache.tokens
        return self.compute(Purpose.TREE, TreeForward(tuple(tokens), tuple(parents), len(context)))

    def on_compute(self, purpose: Purpose, result: Any) -> list[Action]:
        if purpose == Purpose.DRAFT:
            self._observe_compute(purpose)
            return super().on_compute(purpose, result)
        if purpose == Purpose.KEEP:
            return []
        self._observe_compute(purpose)
        return self._tree_done(result)

    def _observe_compute(self, purpose: Purpose) -> None:
        seconds = self._timed(purpose)
        if purpose == Purpose.TREE and seconds is not None:
            self.pass_s = seconds
            if self.pass_cost is not None:
                self.pass_cost.observe(self.pass_tips[0], seconds)
        if self.controller is None or seconds is None:
            return
        if purpose == Purpose.DRAFT:
            self.controller.observe_draft(seconds)
        else:
            self.controller.observe_tree_pass(seconds, *self.pass_tips)

    def _tree_done(self, rows: LogitRows) -> list[Action]:
        """One tree pass is back: extend every branch, then draft on, send the next chain ahead,
        or end a stall."""
        spec = self._drafting
        assert spec is not None
        drafted = self._draft_rows(rows, ranks=self._rank_limit)
        layout = spec.pass_layout
        if self.completing is not None:  # a fork's tree, from the pass of a tree now stale
            start, self.completing = self.completing, None
            drafted, layout = drafted[start:], [(spec, spec.pass_branches)]
        rows_left = iter(drafted)
        for tree, branches in layout:
            for branch in branches:
                self._extend_branch(tree, branch, next(rows_left))
            tree.passes_done += 1
        if not spec.drafted:
            return self._next_pass(spec)
        if self.state == EdgeState.WAITING:
            return self._send_drafted(spec)
        if self.state == EdgeState.STALLED:
            key, self.pending_key = self.pending_key, None
            assert key is not None
            return self._continue(key, stalled=True)
        return []

    def _send_drafted(self, spec: Speculation) -> list[Action]:
        """A tree is drafted while its chain awaits a verdict: send its continuation as the next
        chain (if a place in flight is free) and its branches as forks; the next chain's tree
        also drafts the likeliest forks' trees."""
        chain = self._newest_chain  # the tree's, before the next chain joins those in flight
        before = len(self.ahead)
        actions = self._send_ahead(first_pass=False)
        actions += self._send_forks(spec, chain)
        if len(self.ahead) > before:
            nxt = self.ahead[-1].spec
            nxt.co = self._fork_trees(spec, nxt)
            actions += self._next_pass(nxt)
        return actions

    def _next_pass(self, spec: Speculation) -> list[Action]:
        """The next pass of `spec`, unless it is the tree of a chain sent ahead and the verdict
        due first should find the edge free (`holds_pass`): then it waits in `held`. A pass that
        also drafts forks' trees goes on: a fork taken wants it too."""
        if not self.ahead or spec is not self.ahead[-1].spec:
            return [self._tree_pass(spec)]
        if self.controller is not None:
            self.controller.observe_ahead_pass(holdable=not spec.co)
        if not spec.co and self._holds_pass():
            self.held = spec
            self.count("passes_held")
            return []
        return [self._tree_pass(spec)]

    def _holds_pass(self) -> bool:
        due = None if self.spec is None else self._verdict_due(self.spec)
        if due is None or self.now is None or self.pass_s is None or self.planner is None:
            return False
        full = self.planner.alpha ** len(self.round.tokens)  # the chain sent ahead stays live
        return holds_pass(idle_s=due - self.now, pass_s=self.pass_s, full=full)

    def _resume_held(self) -> list[Action]:
        """The verdict came and the chain sent ahead is still live: its tree's pass goes on."""
        held, self.held = self.held, None
        if held is None:
            return []
        assert held is self._drafting and not held.drafted  # only the newest tree's pass waits
        self.count("passes_resumed")
        return [self._tree_pass(held)]

    def _extend_branch(self, spec: Speculation, branch: Branch, row: DraftRow) -> None:
        # from the speculation's base, not `generated`: a verdict may commit tokens while the
        # tree is still being drafted, and the keyed stream must not shift with that timing
        position = spec.base + branch.start + len(branch.tokens)
        self._append_keyed(branch, row, position)

    def _send_ahead(self, *, first_pass: bool = True) -> list[Action]:
        """Send the newest tree's continuation as the next chain before the verdicts on the
        chains in flight (`deepspec`, up to `chains_in_flight` of them), and draft its tree at
        once, hanging from that continuation. Its base is where the cloud's output stands if
        every chain before it is accepted whole, and it is marked `ahead`: the cloud verifies it
        only after the chain before it was accepted whole."""
        newest = self._drafting
        if not self.send_ahead or newest is None or not newest.drafted:
            return []
        branch = newest.find(newest.depth, None)
        base = newest.base + newest.depth
        full = 1 + len(self.ahead) >= self.chains_in_flight
        if full or branch is None or base >= self.settings.max_new_tokens:
            return []
        last = self._newest_chain.index
        if self.send_forks:  # continues the newest chain accepted whole: its last token stays
            rnd = _chain_of(branch, Round(self._rounds, base, fork=(last, branch.root)))
            # without its p̃ it can name what it continues only as the round before it
            if self._rounds == last + 1 and self._goes_plain(rnd, alone=False):
                rnd.fork, rnd.ahead, rnd.plain = None, True, True
                self.count("chains_plain")
                self.count("chains_plain_ahead")
        else:
            rnd = _chain_of(branch, Round(self._rounds, base, ahead=True))
        self._rounds += 1
        alternatives = self._ranked(branch)
        offset = newest.offset + newest.nodes
        spec = self._plan_tree(rnd, alternatives, list(branch.nodes), base, offset)
        self.ahead.append(InFlight(rnd, spec, alternatives))
        self.most_in_flight = max(self.most_in_flight, 1 + len(self.ahead))
        self.count("chains_sent_ahead")
        self.went_ahead = self.went_ahead or bool(self.accepted_per_round)
        msg = self.draft_message(rnd)
        self._log_send(msg)
        return [Send(msg), *self._next_pass(spec)] if first_pass else [Send(msg)]

    def _send_forks(self, spec: Speculation, chain: Round) -> list[Action]:
        """Send the alternative branches of `chain`'s drafted tree as forks (`deepspec-tree`),
        the shallowest and likeliest first, up to `forks_per_tree` and while the uplink, at its
        measured rate, can carry them before the next chain leaves (about as long from now as
        this tree took): each is the chain the cloud verifies next, at once, if the verdict
        rejects the token at the branch's depth and draws the branch's root there. Where the
        rate is pinned down, a fork goes only if the time it saves, times the share of forks sent
        that were taken, outweighs its time on the uplink (`fork_pays`): on a slow link forks
        seldom taken queue ahead of the chain a miss or a hit sends next."""
        if not self.send_forks or chain.plain:  # no fork of a chain whose p̃ stayed behind
            return []
        assert self.uplink is not None  # every edge that sends forks measures its uplink
        room, cap = self._fork_room(spec, self.uplink), self.settings.forks_per_tree
        if room is None:  # the uplink not measured (yet): only the likeliest few
            room, cap = float("inf"), min(cap, FORKS_UNMEASURED)
        branches = [b for b in spec.branches if b.depth < spec.depth]  # depth, then rank order
        sends = []
        for branch in branches[:cap]:
            base = spec.base + branch.depth + 1
            if base >= self.settings.max_new_tokens:
                continue
            rnd = _chain_of(branch, Round(self._rounds, base, fork=(chain.index, branch.root)))
            msg = self.draft_message(rnd)
            bits = wire.bits(msg)
            if bits > room:
                self.count("forks_held")
                break
            if not self._fork_worth(rnd, bits):
                self.count("forks_unpaid")
                continue
            room -= bits
            self._rounds += 1
            spec.forks[branch.depth, branch.root] = rnd
            self._log_send(msg, bits)
            sends.append(Send(msg))
        self.count("forks_sent", len(sends))
        return sends

    def _fork_worth(self, fork: Round, bits: int) -> bool:
        """Whether `fork` is worth its `bits` on the uplink (always, while its rate is not
        pinned down: small messages on a fast link never pin it): taken, as forks sent have
        been (one pseudo-fork taken in two sent: the first trees try them out), it saves the
        round trip of its branch sent plain after the verdict."""
        assert self.planner is not None and self.uplink is not None
        rate, window = self.uplink.pinned_rate_bps(), self.planner.window.value
        if rate is None or window is None:
            return True
        counts = self.counters
        taken = (counts.get("forks_taken", 0) + 1) / (counts.get("forks_sent", 0) + 2)
        saved = self._fork_saving(window, rate, self._bits(fork, plain=True))
        return fork_pays(taken=taken, saved_s=saved, extra_s=bits / rate)

    def _fork_trees(self, spec: Speculation, nxt: Speculation) -> list[Speculation]:
        """Trees for the likeliest forks of `spec` (the order they went up in), each planned as
        if its fork were the chain, hanging from the fork's nodes, drafted in `nxt`'s passes
        while they keep a pass's cost within `FORK_TREE_SLACK` of its own."""
        planner, passes = self.planner, nxt.passes_planned
        assert planner is not None  # every edge that sends forks plans trees
        trees: list[Speculation] = []
        tips = len(nxt.branches)
        for (depth, root), fork in list(spec.forks.items())[: self.settings.fork_trees]:
            branch = spec.find(depth, root)
            assert branch is not None
            length, alternatives = len(fork.tokens), self._ranked(branch)
            stats = planner.stats
            fanout = planner.plan(length, passes)
            planner.stats = stats  # the plan of record stays the chains' own
            branches = _tree_branches(fork, alternatives, fanout)
            if not self._pass_affords(len(nxt.branches), tips + len(branches)):
                break
            tips += len(branches)
            tree = Speculation(branches, fork.base, length, list(branch.nodes), fork=fork)
            tree.passes_planned = passes
            trees.append(tree)
        self.count("fork_trees", len(trees))
        return trees

    def _pass_affords(self, own: int, tips: int) -> bool:
        """Whether a pass of `tips` tips costs at most `FORK_TREE_SLACK` more than one of `own`
        (always, where the edge does not know its pass cost, and where the budget is fixed: by
        the user, or by the controller, which prices the forks' trees in its pass)."""
        planner = self.planner
        if planner is None or planner.tree_seconds is None or planner.fixed_budget is not None:
            return True
        return planner.tree_seconds(tips) <= (1 + FORK_TREE_SLACK) * planner.tree_seconds(own)

    def _fork_room(self, spec: Speculation, uplink: UplinkModel) -> float | None:
        """Bits the uplink can carry before the next chain leaves and, for the tree of the
        chain awaiting its verdict, before that verdict is due: a fork still queued then holds
        up the chain the verdict asks for when it took none (None before the uplink's rate is
        measured, and where the driver keeps no clock)."""
        if self.now is None or spec.started_at is None:
            return None
        within = self.now - spec.started_at
        due = self._verdict_due(spec)
        if due is not None:
            within = min(within, due - self.now)
        return uplink.room_bits(self.now, max(within, 0.0))

    def _verdict_due(self, spec: Speculation) -> float | None:
        """When the verdict on `spec`'s chain should come, if it awaits its verdict: its send
        time plus the mean window, if it was sent alone; else, being with the cloud since the
        verdict before, that verdict's time plus the mean gap between such verdicts."""
        if spec is not self.spec:
            return None
        if self.sent_at is not None:
            window = None if self.planner is None else self.planner.window.value
            return None if window is None else self.sent_at + window
        gap = self.verdict_gap.value
        return None if gap is None or self.verdict_at is None else self.verdict_at + gap

    @property
    def _newest_chain(self) -> Round:
        """The chain whose tree is the newest: the last sent ahead, else the one awaiting."""
        return self.ahead[-1].round if self.ahead else self.round

    def _ranked(self, branch: Branch) -> list[list[int]]:
        """Per depth of a branch become a chain, the alternatives its tree may branch on."""
        limit = self._rank_limit
        return [row.ranked(limit, t) for row, t in zip(branch.dists, branch.tokens, strict=True)]

    # ---- the verdict
    def on_reply(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.VerifyResult) and self.state == EdgeState.WAITING:
            rnd = self.round
            if msg.round == rnd.index and msg.accepted == len(rnd.tokens) and msg.token is None:
                return self._all_accepted(rnd)
            if msg.round == rnd.index and msg.accepted < len(rnd.tokens):
                self._observe_capture(rnd, msg)
        return super().on_reply(msg)

    def _observe_capture(self, rnd: Round, msg: wire.VerifyResult) -> None:
        """Where the residual mass lay among the alternatives the tree branched on (for β), when
        the reply carries the whole target distribution of the rejected position."""
        width = self.alignment.target_width
        if self.planner is None or msg.dist is None or msg.dist.width != width or msg.truncated:
            return
        residual = np.maximum(dist_probs(msg.dist) - self.draft_probs(rnd, msg.accepted), 0.0)
        if residual.sum() > 0:
            ranked = self.alternatives[msg.accepted]  # what the tree really branched on
            self.planner.observe_capture(ranked_capture(residual, ranked, self.planner.b_max))

    def _observe(self, accepted: int) -> None:
        drafted = len(self.round.tokens)
        window = None if self.sent_at is None or self.now is None else self.now - self.sent_at
        # the first verdict's window is unlike the rest (the handshake went up just before its
        # chain, the cloud's prefill ran in it)
        steady = bool(self.accepted_per_round)
        if self.controller is not None:
            # seeding the window's average, it would hold γ and B too long for several chains
            self.controller.observe_verdict(accepted, drafted, window if steady else None)
            if self.sent_at is None and None not in (self.now, self.verdict_at):
                # a chain sent ahead: its verdict follows the one before by T_verify at least,
                # and by exactly that when it waited at the cloud
                self.controller.observe_verdict_gap(self.now - self.verdict_at)
        if self.sent_at is None and self.now is not None and self.verdict_at is not None:
            self.verdict_gap.update(self.now - self.verdict_at)
        self.verdict_at = self.now
        # fitted with one more window, the first can make the fastest rate look best, and then
        # forks flood a slow uplink
        measured = self.lone_send is not None and window is not None
        if self.uplink is not None and measured and steady:
            self.uplink.answered(self.lone_send, self.sent_at, window, self.reply_bits)
            self._observe_bare_round_trip()
        self.lone_send = None
        if self.planner is None:
            return
        if window is not None:
            self.planner.observe_window(window)
        self.planner.observe_round(accepted, drafted)

    def _all_accepted(self, rnd: Round) -> list[Action]:
        self._observe(len(rnd.tokens))
        actions = self._commit(rnd, len(rnd.tokens), [])
        return actions if self.done else [*actions, *self._continue((len(rnd.tokens), None))]

    def finish_round(
        self, rnd: Round, accepted: int, token: int, *, decided_by_edge: bool
    ) -> list[Action]:
        """The rejected position is resolved: commit, then look the outcome up in the tree."""
        self._observe(accepted)
        if self.send_forks:  # chains with p̃: what the share of forks taken counts from
            self.count("plain_rejections" if rnd.plain else "dists_rejections")
        if decided_by_edge:
            self.pending_echo.append(int(token))
        actions = self._commit(rnd, accepted, [int(token)])
        return actions if self.done else [*actions, *self._continue((accepted, int(token)))]

    def _commit(self, rnd: Round, accepted: int, extra: list[int]) -> list[Action]:
        if any(not 0 <= t < self.alignment.target_width for t in extra):
            raise ProtocolError(f"token {extra} is outside the target vocabulary")
        self._check_streams(rnd, min(accepted + 1, len(rnd.tokens)))
        self.accepted_per_round.append(accepted)
        new = [*rnd.tokens[:accepted], *extra]
        self.generated += len(new)
        actions, done = self.emit(new)
        if not done:
            for t in new:
                self._sync_draft_context(t)
        return actions

    def _check_streams(self, rnd: Round, decided: int) -> None:
        """No draft stream serves two verified tokens: each drafted token the verdict looked at
        (the accepted ones and the rejected one) was drawn from the stream keyed by its own output
        position, and each output position is verified once. A reused stream would draw a
        proposal with the very uniform that decided an earlier token, so its law given the past
        would not be the p̃ the cloud divides by."""
        own = list(range(self.generated, self.generated + decided))
        if rnd.keys[:decided] != own:
            raise RuntimeError(
                f"draft streams {rnd.keys[:decided]} drew the tokens at output positions {own}"
            )

    def _continue(self, key: tuple[int, int | None], *, stalled: bool = False) -> list[Action]:
        """Go on after a verdict (`key`: accepted, and the token drawn at a rejection); `stalled`:
        the verdict came before its chain's tree was drafted."""
        spec = self.spec
        branch = None if spec is None else spec.find(*key)
        if spec is not None and key[1] is not None and key in spec.forks:
            assert branch is not None
            return self._take_fork(branch, spec.forks[key])  # type: ignore[index]
        if self.ahead and key[1] is None:  # accepted whole: the next chain is with the cloud
            assert branch is not None
            return self._adopt(branch)
        stale = self._drop_ahead()
        if branch is not None and not spec.drafted:
            self.pending_key = key  # a hit whose branch is still being drafted: wait for it
            self.state = EdgeState.STALLED
            self.count("pipeline_stalls")
            return []
        hit = branch is not None and self._fits(branch)
        if self.controller is not None and key[1] is not None:
            in_time = spec is not None and spec.drafted and not stalled
            self.controller.observe_outcome(hit, depth=key[0], in_time=in_time)
        if hit:
            return [*stale, *self._hit(branch)]
        self.count("cache_misses")
        self.count("redrafts")
        if spec is not None:
            self.count("wasted_tree_nodes", spec.nodes)
        self.spec = None
        self.restart_cap = self._restart_length()
        # the tree passes only: a path kept is queued behind the pass in flight, and the cache
        # already counts it kept
        return [*self._cancel_trees(), *self._begin_round()]

    def _restart_length(self) -> int | None:
        """How long the chain after a miss may be: the cloud has nothing of the edge's then, and
        a chain of γ would reach it only after γ draft steps. A short one leaves sooner, its
        tree is drafted as for any chain, and the next chain goes ahead behind it, so the
        redraft overlaps the window; with one chain in flight the next would wait for its
        verdict instead, a window for a few tokens."""
        length = self.settings.restart_length
        return length if length and self.send_ahead and self.chains_in_flight > 1 else None

    def _cancel_trees(self) -> list[Action]:
        """Cancel the tree passes outstanding (a pass drafting a taken fork's tree among them)."""
        self.completing = None
        return self.cancel(Purpose.TREE)

    def _drop_ahead(self, *, cancel: bool = True) -> list[Action]:
        """A rejection made every chain sent ahead stale: the cloud drops them, and the edge
        cancels their trees (the cancel actions; none when nothing was ahead), unless told to
        let the pass in flight finish."""
        if not self.ahead:
            return []
        self.count("stale_chains_ahead", len(self.ahead))
        self.ahead = []
        self.held = None
        return self._cancel_trees() if cancel else []

    def _take_fork(self, branch: Branch, fork: Round) -> list[Action]:
        """The verdict took a branch sent as a fork: the cloud verifies it now, so it is the
        chain awaiting its verdict. Keep its cache path, cancel the chains sent ahead (stale),
        and draft its tree, unless the next chain's passes were drafting it already."""
        if not self._fits(branch):
            raise RuntimeError("the fork taken does not spell the committed context")
        self.count("forks_taken")
        nxt = self.ahead[0].spec if self.ahead else None
        tree = next((t for t in (nxt.co if nxt else []) if t.fork is fork), None)
        if self.controller is not None:
            along = tree is not None
            self.controller.observe_outcome(True, depth=branch.depth, fork=True, fork_tree=along)
        if tree is None:
            stale = self._drop_ahead()
            keep = self._keep_branch(branch)
            self.round, self.sent_at = fork, None
            self.enter(EdgeState.WAITING)
            return [*stale, keep, *self._speculate()]
        assert nxt is not None
        return self._take_fork_tree(branch, fork, tree, nxt)

    def _take_fork_tree(
        self, branch: Branch, fork: Round, tree: Speculation, nxt: Speculation
    ) -> list[Action]:
        """Take a fork whose tree the next chain's passes were drafting: keep the fork's path
        with that tree below it (renumbered from 0 in its order; all else is dropped). If
        their pass is in flight, let it finish (it would run anyway) and take the fork tree's
        rows from it; once drafted, the fork's forks and continuation go up."""
        self.count("fork_trees_taken")
        self.count("tree_rounds")  # it is the tree of a chain now
        completing = not nxt.drafted  # their pass is in flight
        start = 0
        for other, branches in nxt.pass_layout:
            if other is tree:
                break
            start += len(branches)
        stale = self._drop_ahead(cancel=not completing)
        keep = self._keep_branch(branch, below=True)
        self.round, self.sent_at = fork, None
        self.enter(EdgeState.WAITING)
        kept = sorted(node for b in tree.branches for node in b.nodes)
        renumber = {node: k for k, node in enumerate(kept)}
        for b in tree.branches:
            b.nodes = [renumber[node] for node in b.nodes]
        tree.offset, tree.nodes, tree.fork = 0, len(kept), None
        self.spec = tree
        if completing:
            self.count("fork_trees_taken_in_flight")
            self.completing = start
            return [*stale, keep]
        return [*stale, keep, *self._send_drafted(tree)]

    def _fits(self, branch: Branch) -> bool:
        """The kept cache path must spell exactly the committed draft context (across
        vocabularies the retokeniser may spell committed text differently)."""
        chain = self.round.draft_ids[: min(branch.depth, len(self.round.tokens) - 1)]
        root = int(self.alignment.target_to_draft[branch.root])
        return self.draft_ctx == [*self.round_ctx, *chain, root]

    def _hit(self, branch: Branch) -> list[Action]:
        keep = self._keep_branch(branch)
        _chain_of(branch, self._open_round())
        return [keep, *self._upload()]

    def _keep_branch(self, branch: Branch, *, below: bool = False) -> Any:
        """A hit branch becomes the next chain: keep its cache path, drop the rest of the tree
        (but what hangs below the path, `below`), and rank its alternatives (only now: they
        matter only once it is the chain)."""
        spec = self.spec
        assert spec is not None
        self.count("cache_hits")
        self.count("wasted_tree_nodes", spec.nodes - len(branch.nodes))
        self.alternatives = self._ranked(branch)
        return self._keep_path(branch, below=below)

    def _keep_path(self, branch: Branch, *, below: bool) -> Any:
        """Keep a branch's cache path (and, `below`, the trees hanging along it)."""
        length = len(branch.tokens)
        keep = self.compute(Purpose.KEEP, KeepTreePath(tuple(branch.nodes[:length]), below))
        self.cache.assume([*self.draft_ctx, *branch.draft_ids[: length - 1]])
        self.round_ctx = list(self.draft_ctx)
        return keep

    def _adopt(self, branch: Branch) -> list[Action]:
        """The chain in flight was accepted whole, and its continuation went out ahead: that is
        the chain awaiting its verdict now. Keep the continuation's cache path with the trees
        hanging along it, renumbered, and send the next chain if a place in flight is free."""
        if not self._fits(branch):
            raise RuntimeError("the continuation sent ahead does not spell the committed context")
        spec, nxt = self.spec, self.ahead.pop(0)
        assert spec is not None
        self.count("cache_hits")
        self.count("wasted_tree_nodes", spec.nodes - len(branch.nodes))
        keep = self._keep_path(branch, below=True)
        dropped = nxt.spec.offset  # the old tree's nodes left the pending tree
        # and so did the trees of its forks drafted in the next tree's passes
        gone = sorted(node for tree in nxt.spec.co for b in tree.branches for node in b.nodes)
        self.count("fork_trees_dropped", len(nxt.spec.co))
        nxt.spec.co = []
        nxt.spec.nodes -= len(gone)
        for later in (nxt, *self.ahead):
            later.spec.shift(dropped, gone)
        if nxt.spec.passes_done == 0 and nxt.spec is self.held:
            # no pass of its tree went out: it hangs from the path just kept, the cache's end
            nxt.spec.anchors = _cache_end(nxt.spec.depth)
        # its window would include the wait behind the chains before it at the cloud: only a
        # chain sent with none in flight measures RTT + T_verify
        self.round, self.spec, self.sent_at = nxt.round, nxt.spec, None
        self.alternatives = nxt.alternatives
        self.enter(EdgeState.WAITING)
        return [keep, *self._resume_held(), *self._send_ahead()]

    @property
    def cache_hit_rate(self) -> float | None:
        hits, misses = self.counters.get("cache_hits", 0), self.counters.get("cache_misses", 0)
        return hits / (hits + misses) if hits + misses else None
