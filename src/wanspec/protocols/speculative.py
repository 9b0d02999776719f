"""Stop-and-wait speculative decoding: one edge/cloud machine pair for every resampling scheme.

The edge drafts γ tokens (TLI: only from the common vocabulary, in target ids), one draft forward
per token, uploads them with p_i(x_i) and waits; the cloud verifies them in one forward pass and
answers. Methods differ only in what happens at a rejection, which is a `Scheme`
(`wanspec.protocols.schemes`). Every draft names its round and the committed prefix it extends
(`base`), so the cloud can tell a stale draft from a current one when several are in flight.

The cloud computes the target's float q at every row; the bonus token is always drawn from it.
Acceptance uses q too, or the rounded q̂ of a scheme that ships q (the very q̂ the edge then
resamples from); the TV distance of each rounding used is summed into the `tv_bound` counter.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.jobs import LogitRows
from wanspec.protocols.base import (
    Action,
    ComputeDone,
    Draw,
    ErrorCode,
    Event,
    Machine,
    MessageReceived,
    ProtocolError,
    Purpose,
    Send,
    Start,
    position_rng,
    request_rng,
)
from wanspec.protocols.cache import CacheMirror
from wanspec.protocols.candidates import CandidatePlanner, LinkFit
from wanspec.protocols.endpoints import EdgeMachine, TargetInfo
from wanspec.protocols.resample_choice import Mechanism, MechanismChooser
from wanspec.protocols.schemes import (
    Ask,
    Decision,
    Resolved,
    Scheme,
    rejected_dist_message,
    wire_dist,
)
from wanspec.protocols.settings import GenerationSettings
from wanspec.sampling import Rounded, dequantize, pick, verify_chain
from wanspec.sampling.proposal import DraftRow, EmptyDraftRowError
from wanspec.vocab import DraftRetokenizer, NoCommonMassError, VocabAlignment

Draft = wire.Draft | wire.DraftWithDists


@dataclass
class Round:
    """What the edge drafted in one round (target ids and their draft distributions)."""

    index: int
    base: int  # generated tokens the cloud holds when this draft arrives
    tokens: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)
    probs: list[int] = field(default_factory=list)
    dists: list[DraftRow] = field(default_factory=list)
    draft_logits: list[np.ndarray] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # per token: its draft stream's key (pipelines)
    rejected_at: int = 0
    replies: int = 0  # replies about the rejected position so far (the verdict's included)
    srdv: bool = False  # a rejection is resolved by SR-DV, not HR (chosen before drafting)
    plain: bool = False  # it goes up without its p̃ where the method chooses (`chooses_dists`)
    ahead: bool = False  # sent before the verdict on the round before it (`Draft.ahead`)
    # sent before that round's verdict, which must leave this token last (`DraftWithDists.fork`)
    fork: tuple[int, int] | None = None
    sent_at: float | None = None  # the driver's clock when the draft went out, if it stamps one
    sent_bits: int = 0  # the draft's bits on the wire (counted only where K or M are chosen)
    accepts: list[float] = field(default_factory=list)  # SR-DV: each candidate's acceptance odds


@dataclass
class Rejection:
    """What the cloud keeps about the rejected position of a round, for follow-up requests."""

    index: int
    position: int
    target: np.ndarray  # the float q at the rejected position
    rounded: Rounded | None = None  # the q̂ decided with and shipped, for schemes that ship q
    draft: np.ndarray | None = None  # p̃ there, when the edge uploaded it (UL, U-HLM)
    replies: int = 0  # answers sent about it so far (the verdict's included)
    resolved: bool = False  # the cloud gave its token (or O-sample): nothing more may be asked
    srdv: bool = False  # the round's draft chose SR-DV (a method that chooses per round)
    plain: bool = False  # the round's draft went up without its p̃ (`chooses_dists`)


# ============================================================================ the edge


class EdgeState(enum.Enum):
    OPENING_DRAFTING = enum.auto()  # DRAFTING, the cloud's HelloAck not yet in
    OPENING_WAITING = enum.auto()  # WAITING, the cloud's HelloAck not yet in
    DRAFTING = enum.auto()
    WAITING = enum.auto()  # the draft is up, the verdict not yet back
    RESOLVING = enum.auto()  # a rejection is being resolved with follow-up requests
    STALLED = enum.auto()  # (pipelines) the verdict's branch of the tree is still being drafted
    DONE = enum.auto()


class SpecEdge(EdgeMachine):
    """Drafts, uploads, resolves rejections per scheme, emits finalised tokens."""

    EXPECTS = {  # noqa: RUF012
        EdgeState.OPENING_DRAFTING: (wire.HelloAck,),
        EdgeState.OPENING_WAITING: (wire.HelloAck,),
        EdgeState.WAITING: (wire.VerifyResult,),
        EdgeState.RESOLVING: (wire.VerifyResult, wire.Candidates, wire.OToken),
    }
    OPENING = {  # noqa: RUF012
        EdgeState.DRAFTING: EdgeState.OPENING_DRAFTING,
        EdgeState.WAITING: EdgeState.OPENING_WAITING,
    }

    def __init__(
        self,
        *,
        scheme: Scheme,
        alignment: VocabAlignment,
        prompt_draft_ids: list[int],
        chooser: MechanismChooser | None = None,
        candidates: CandidatePlanner | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(EdgeState.OPENING_DRAFTING, **kwargs)
        self.scheme, self.alignment = scheme, alignment
        if chooser is not None and not scheme.chooses_per_round:
            raise ValueError(f"scheme {scheme.name!r} does not choose a mechanism per round")
        # picks each round's mechanism, for a scheme that chooses per round
        if chooser is None and scheme.chooses_per_round:
            chooser = MechanismChooser()
        self.chooser = chooser
        if candidates is not None and not scheme.candidate_sets:
            raise ValueError(f"scheme {scheme.name!r} resolves no rejection by candidate sets")
        self.candidates = candidates  # chooses SR-DV's K and M from the measured link
        # the link as the edge's exchanges show it, where a policy prices with it
        self.link = candidates.link if candidates is not None else None
        if self.link is None and chooser is not None:
            self.link = LinkFit()
        self.first_k = self.settings.srdv_start[0]  # the first set's K as the cloud holds it
        self.asked: tuple[float | None, int] | None = None  # a follow-up's send time and bits
        self.now: float | None = None  # the driver's clock at the last event, if it stamps one
        self.rng = request_rng(self.settings.seed, "edge")
        # The draft may propose from any law it reports exactly; it leaves the repetition
        # penalty (which needs the target-side context) to the target's q.
        self.draft_params = replace(self.settings.sampling, repetition_penalty=1.0)
        self.common = alignment.in_common
        self.cache = CacheMirror()
        self.draft_ctx: list[int] = list(prompt_draft_ids)
        self.retokenizer = DraftRetokenizer(alignment)
        self.pending_echo: list[int] = []
        self.generated = 0
        self.round = Round(0, 0)
        self._rounds = 0

    def on_start(self) -> list[Action]:
        return [*self.hello(), *self._begin_round()]

    def handle(self, event: Event) -> list[Action]:
        """Keep the driver's clock stamp: the chooser is told what each rejected round took."""
        if isinstance(event, Start | MessageReceived | ComputeDone) and event.at is not None:
            self.now = event.at
        if isinstance(event, MessageReceived) and self.link is not None:
            self._observe_exchange(event.msg, event.bits)
        return super().handle(event)

    def _observe_exchange(self, msg: Any, bits: int | None) -> None:
        """Feed the link fit one exchange: a draft sent alone and its verdict, or a follow-up
        and its answer (seconds from send to reply against bits up and down: the reply's as
        the driver counted them, else encoded here)."""
        assert self.link is not None
        rnd, sent = self.round, None
        if isinstance(msg, wire.VerifyResult) and self.state == EdgeState.WAITING:
            if msg.round == rnd.index and rnd.sent_at is not None:
                sent, verified = (rnd.sent_at, rnd.sent_bits), True
        elif self.state == EdgeState.RESOLVING and self.asked is not None:
            sent, verified, self.asked = self.asked, False, None
        if sent is None or sent[0] is None or self.now is None:
            return
        seconds = self.now - sent[0]
        down = wire.bits(msg) if bits is None else bits
        self.link.observe(up_bits=sent[1], down_bits=down, seconds=seconds, verified=verified)

    # ---- drafting
    def _begin_round(self) -> list[Action]:
        self.enter(EdgeState.DRAFTING)
        self._open_round()
        return [self.compute(Purpose.DRAFT, self.cache.plan(self.draft_ctx))]

    def _open_round(self) -> Round:
        """The next round, numbered one past the last (the cloud's replies name it), starting
        at the first output token not yet confirmed; a chooser fixes its mechanism here, before
        any of its draws."""
        if self.chooser is not None:
            self._predict_hr()
        srdv = self.chooser is not None and self.chooser.choose() is Mechanism.SRDV
        self.round = Round(self._rounds, self.generated - len(self.pending_echo), srdv=srdv)
        self._rounds += 1
        return self.round

    def _predict_hr(self) -> None:
        """Tell the chooser what an HR round should cost on the link measured so far: a
        verdict that carries q over the common vocabulary, at least a byte per common id."""
        assert self.chooser is not None and self.link is not None
        costs = self.link.costs()
        if costs is not None:
            bits = 8 * int(self.common.sum())
            seconds = costs.trip_s + costs.verify_s + bits * costs.down_s_per_bit
            self.chooser.predict(Mechanism.HR, seconds)

    def on_compute(self, purpose: Purpose, result: Any) -> list[Action]:
        rnd = self.round
        self._take(result.last())
        if len(rnd.tokens) < self.chain_length:
            return [self.compute(Purpose.DRAFT, self.cache.plan(self.draft_ctx + rnd.draft_ids))]
        return self._upload()

    @property
    def chain_length(self) -> int:
        """γ of the round being drafted."""
        return self.settings.gamma

    def _take(self, logits: LogitRows) -> None:
        rnd = self.round
        row = self._draft_row(logits)
        self._append_draft(rnd, row.draw(self.rng), row)
        if self.scheme.keeps_draft_logits:
            rnd.draft_logits.append(self.alignment.project_draft_logits(logits.numpy()[0]))

    def _draft_row(self, logits: LogitRows, ranks: int = 0) -> DraftRow:
        """p̃ at one drafted position (a one-row block) over the target's ids (TLI: common
        tokens only)."""
        return self._draft_rows(logits, ranks)[0]

    def _draft_rows(self, logits: LogitRows, ranks: int = 0) -> list[DraftRow]:
        """p̃ at each row of a block of draft logits (one tree pass's nodes), in one go: the one
        place a drafted law is made, so a chain, a tree and a redraft propose from the same
        (reshaped, when the request asks) p̃, which is what the edge reports and uploads."""
        alignment = self.alignment
        try:
            rows = logits.draft_rows(
                self.draft_params,
                allowed=alignment.draft_in_common,
                to_ids=None if alignment.is_identity else alignment.draft_to_target,
                width=alignment.target_width,
                ranks=ranks,
            )
        except EmptyDraftRowError as exc:
            raise NoCommonMassError("draft logits are −inf on every common token") from exc
        factor, top = self.settings.draft_reshape, self.settings.draft_reshape_top
        return rows if factor == 1.0 else [row.reshaped(top, factor) for row in rows]

    def _append_draft(self, chain: Any, token: int, row: DraftRow) -> None:
        """Add a drafted token to a chain (a round or a pipeline's branch): its target id,
        its draft id, p̃(x) and p̃."""
        chain.tokens.append(token)
        chain.draft_ids.append(int(self.alignment.target_to_draft[token]))
        chain.probs.append(row.count(token))
        chain.dists.append(row)

    def _upload(self) -> list[Action]:
        msg = self.draft_message(self.round)
        self.round.sent_at = self.now
        if self.link is not None:
            self.round.sent_bits = wire.bits(msg)
        self.pending_echo = []
        self.enter(EdgeState.WAITING)
        return [*self._set_first_candidates(), Send(msg)]

    def _set_first_candidates(self) -> list[Action]:
        """Tell the cloud the first set's K before a draft, when the planner changed it."""
        if self.candidates is None:
            return []
        k = self.candidates.k
        if k == self.first_k:
            return []
        self.first_k = k
        self.count("first_candidates_set")
        return [Send(wire.FirstCandidates(k))]

    @property
    def candidate_plan(self) -> tuple[int, int]:
        """SR-DV's (K, M) for the next request about a rejected position."""
        if self.candidates is None:
            return self.settings.srdv_k, self.settings.srdv_m
        return self.candidates.k, self.candidates.m

    def _saw_candidates(self, rnd: Round, msg: wire.VerifyResult | wire.Candidates) -> None:
        """A candidate set came: note each candidate's acceptance odds max(0, 1 − p̃(y)/q(y)),
        whose mean estimates the position's residual mass β, and what a candidate costs."""
        self.count("srdv_candidates", len(msg.candidates))
        if self.candidates is None:
            return
        draft = self.draft_probs(rnd, rnd.rejected_at)
        rnd.accepts += [max(0.0, 1.0 - float(draft[y]) / q) for y, q in msg.candidates]
        self.candidates.observe_candidates(len(msg.candidates), wire.bits(msg))
        if self.candidates.fallback_bits is None:  # what a fallback here would upload
            fallback = rejected_dist_message(rnd, rnd.rejected_at, self.alignment.target_width)
            self.candidates.observe_fallback(wire.bits(fallback))

    def draft_message(self, rnd: Round) -> Draft:
        """The message that sends `rnd` to the cloud, with the tokens the edge decided since the
        last one (`pending_echo`)."""
        scheme = self.scheme.for_round(rnd.srdv, rnd.plain)
        if scheme.uploads_dists:
            positions = scheme.upload_positions(self, rnd)
            if scheme.skipped_counter is not None:
                self.count(scheme.skipped_counter, len(rnd.tokens) - len(positions))
            return self.dists_message(rnd, positions)
        committed = tuple(self.pending_echo)
        return wire.Draft(
            rnd.index,
            rnd.base,
            committed,
            tuple(rnd.tokens),
            tuple(rnd.probs),
            rnd.srdv,
            rnd.ahead,
        )

    def residual_rng(self, accepted: int) -> np.random.Generator:
        """The residual's stream at a rejected position, `accepted` tokens into the round
        awaiting its verdict (whose first token is the next output position)."""
        return position_rng(self.settings.seed, Draw.RESIDUAL, self.generated + accepted)

    @staticmethod
    def draft_probs(rnd: Round, position: int) -> np.ndarray:
        """p̃ at a drafted position as probabilities (the 16-bit counts the edge reports)."""
        return rnd.dists[position].probs()

    def dists_message(self, rnd: Round, positions: list[int]) -> wire.DraftWithDists:
        """UL / U-HLM upload: the draft plus full draft distributions at `positions`."""
        return wire.DraftWithDists(
            rnd.index,
            rnd.base,
            committed=tuple(self.pending_echo),
            tokens=tuple(rnd.tokens),
            width=self.alignment.target_width,
            dist_positions=tuple(positions),
            dists=tuple(wire_dist(rnd.dists[i]) for i in positions),
            fork=rnd.fork,
        )

    # ---- replies
    def on_reply(self, msg: Any) -> list[Action]:
        rnd = self.round
        if msg.round != rnd.index:
            raise ProtocolError(f"reply for round {msg.round}, but round {rnd.index} is open")
        if isinstance(msg, wire.VerifyResult) and self.state == EdgeState.WAITING:
            if msg.accepted > len(rnd.tokens):
                raise ProtocolError(f"{msg.accepted} accepted of {len(rnd.tokens)} drafted")
            if msg.accepted == len(rnd.tokens):
                if msg.token is None:
                    raise ProtocolError("all tokens accepted but no bonus token")
                return self._apply(rnd, Resolved(msg.accepted, msg.token, decided_by_edge=False))
            rnd.rejected_at = msg.accepted
        elif isinstance(msg, wire.VerifyResult) and msg.accepted != rnd.rejected_at:
            raise ProtocolError(
                f"a follow-up verdict at position {msg.accepted}, but position {rnd.rejected_at} "
                "was rejected"
            )
        scheme = self.scheme.for_round(rnd.srdv, rnd.plain)
        if not isinstance(msg, scheme.replies_at_rejection):
            raise ProtocolError(f"{scheme.name}: unexpected {type(msg).__name__} at a rejection")
        self.state = EdgeState.RESOLVING
        rnd.replies += 1
        try:
            decision = scheme.edge_on_reject(self, rnd, msg)
        except ValueError as exc:  # the reply's numbers admit no valid draw
            raise ProtocolError(f"bad reply: {exc}") from exc
        if getattr(msg, "candidates", None):  # checked by the scheme
            self._saw_candidates(rnd, msg)
        return self._apply(rnd, decision)

    def _apply(self, rnd: Round, decision: Decision) -> list[Action]:
        """Carry out what a verdict or the scheme decided: the one place a round's outcome
        touches the edge (counters, then the commit or the request)."""
        for name in decision.counts:
            self.count(name)
        if isinstance(decision, Ask):
            if self.link is not None:
                self.asked = (self.now, wire.bits(decision.msg))
                if self.candidates is not None and isinstance(decision.msg, wire.DraftWithDists):
                    self.candidates.observe_fallback(self.asked[1])
            return [Send(decision.msg)]
        if self.candidates is not None and rnd.accepts:
            self.candidates.observe_position(sum(rnd.accepts) / len(rnd.accepts))
            self.candidates.replan()
        return self.finish_round(
            rnd, decision.accepted, decision.token, decided_by_edge=decision.decided_by_edge
        )

    def finish_round(
        self, rnd: Round, accepted: int, token: int, *, decided_by_edge: bool
    ) -> list[Action]:
        """Commit accepted drafts plus the bonus/replacement token, then go on or stop."""
        if not 0 <= token < self.alignment.target_width:
            raise ProtocolError(f"token {token} is outside the target vocabulary")
        if self.chooser is not None and accepted < len(rnd.tokens):
            self._observe_rejection(rnd)
        self.accepted_per_round.append(accepted)
        new = [*rnd.tokens[:accepted], int(token)]
        self.generated += len(new)
        actions, done = self.emit(new)
        if done:
            return actions
        if decided_by_edge:
            self.pending_echo.append(int(token))
        for t in new:
            self._sync_draft_context(t)
        return [*actions, *self._begin_round()]

    def _observe_rejection(self, rnd: Round) -> None:
        """Tell the chooser what a rejected round cost: its draft's send to its resolution."""
        assert self.chooser is not None
        mechanism = Mechanism.SRDV if rnd.srdv else Mechanism.HR
        seconds = None if rnd.sent_at is None or self.now is None else self.now - rnd.sent_at
        self.chooser.observe(mechanism, seconds)
        self.count(f"rejections_{mechanism}")

    def _sync_draft_context(self, token: int) -> None:
        """Spell a finalised target token in the draft's vocabulary. Bytes the draft vocabulary
        cannot spell are left out of the draft context (counted): the draft only proposes, so
        this costs acceptance, never exactness."""
        try:
            self.draft_ctx.extend(self.retokenizer.push(token))
        except ValueError:
            self.count("draft_unspellable_tokens")


# ============================================================================ the cloud


class CloudState(enum.Enum):
    IDLE = enum.auto()  # waiting for a draft
    VERIFYING = enum.auto()  # a verification pass is running; later drafts wait in line
    REJECTED = enum.auto()  # answered a rejection; follow-ups for that round may come
    DONE = enum.auto()


_DRAFTS = (wire.Draft, wire.DraftWithDists)


class SpecCloud(Machine):
    """Prefill on request, verify each draft against the committed output in one pass, answer
    per scheme. A draft that does not extend the committed output is stale: dropped, counted. So
    is a chain sent ahead (`Draft.ahead`) unless the last round verified is the one before it and
    was accepted whole with no token of the cloud's own appended: its base alone could match an
    output the cloud extended with a token of its own (SR-DV's fallback at the last position).

    A draft is checked when it arrives, queued or not, so a malformed one ends the session at
    once with an error naming its round; what depends on the output so far (staleness, the
    request's length) is checked when its turn comes, after the verdict before it went out."""

    side = "cloud"
    EXPECTS = {  # noqa: RUF012
        CloudState.IDLE: (*_DRAFTS, wire.FirstCandidates, wire.Close),
        CloudState.VERIFYING: (*_DRAFTS, wire.FirstCandidates, wire.Close),
        CloudState.REJECTED: (
            *_DRAFTS,
            wire.CandidatesRequest,
            wire.ResampleRequest,
            wire.FirstCandidates,
            wire.Close,
        ),
    }

    def __init__(
        self,
        *,
        scheme: Scheme,
        target: TargetInfo,
        alignment: VocabAlignment,
        settings: GenerationSettings,
        prompt: str,
        bonus: bool = True,
    ) -> None:
        super().__init__(CloudState.IDLE)
        self.bonus = bonus  # False: pipelines verify the next chain's first token there instead
        self.scheme, self.alignment, self.settings = scheme, alignment, settings
        self.rng = request_rng(settings.seed, "cloud")
        self.common = alignment.in_common
        self.valid = target.vocab.target_valid
        self.prompt_ids = target.encode(prompt)
        self.cache_tokens = target.admit(len(self.prompt_ids), settings.max_new_tokens)
        self.output: list[int] = []
        self.cache = CacheMirror()
        self.inbox: list[Draft] = []
        self.verifying: Draft | None = None
        self.rejection: Rejection | None = None
        # the last round verified, and whether it was accepted whole with nothing of the
        # cloud's own appended (what a chain sent ahead assumes of the round before it)
        self.last_verified: tuple[int, bool] | None = None
        self.first_candidates = settings.srdv_start[0]  # K of a rejection's first SR-DV set

    def on_start(self) -> list[Action]:
        self.counters.setdefault("tv_bound", 0.0)
        return [self.compute(Purpose.PREFILL, self.cache.plan(self.prompt_ids))]

    def on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.Close):
            return self.finish("closed by edge")
        if isinstance(msg, wire.FirstCandidates):
            self._set_first_candidates(msg.k)
            return []
        rejection = self.rejection
        if rejection is not None and msg.round == rejection.index:
            return self._follow_up(rejection, msg)
        if not isinstance(msg, _DRAFTS) or not msg.tokens:
            raise ProtocolError(f"unexpected {type(msg).__name__} for round {msg.round}")
        self._check_draft(msg)
        self.inbox.append(msg)
        return self._next_draft()

    def _set_first_candidates(self, k: int) -> None:
        """The edge chose the first set's K: only where the request lets it, within its cap."""
        settings = self.settings
        if not (self.scheme.candidate_sets and settings.adaptive_srdv_k):
            raise ProtocolError(
                "FirstCandidates, but this request does not choose SR-DV's K online"
            )
        if not 1 <= k <= settings.srdv_k:
            raise ProtocolError(
                f"a first candidate set of {k}, but the request's srdv_k allows at most "
                f"{settings.srdv_k}",
                ErrorCode.LIMIT,
            )
        self.first_candidates = k
        self.count("first_candidates_set")

    def _follow_up(self, rejection: Rejection, msg: Any) -> list[Action]:
        """Answer a request about the rejected position; once the cloud has given its token
        (or an O-sample) the rejection is resolved and nothing more may be asked of it."""
        if rejection.resolved:
            raise ProtocolError(
                f"{type(msg).__name__} for round {rejection.index}, whose rejected position is "
                "already resolved"
            )
        try:
            scheme = self.scheme.for_round(rejection.srdv, rejection.plain)
            reply = scheme.cloud_on_request(self, rejection, msg)
        except ValueError as exc:  # the request's numbers admit no valid draw
            raise ProtocolError(f"bad request: {exc}") from exc
        rejection.resolved = isinstance(reply, wire.OToken) or (
            isinstance(reply, wire.VerifyResult) and reply.token is not None
        )
        return self._answer(rejection, reply)

    def _next_draft(self) -> list[Action]:
        """Verify the next queued draft that extends the output, if none is being verified. A
        peer error found here ends the session after whatever verdict came before it."""
        try:
            while self.inbox and self.state != CloudState.VERIFYING:
                msg = self.inbox.pop(0)
                if not self._current(msg):
                    self.count("stale_drafts")
                    continue
                self._check_room(msg)
                self.output.extend(msg.committed)
                self.verifying = msg
                self.state = CloudState.VERIFYING
                rows = len(msg.tokens) + 1
                job = self.cache.plan([*self.prompt_ids, *self.output, *msg.tokens], rows)
                return [self.compute(Purpose.VERIFY, job)]
        except ProtocolError as exc:
            return self.fail(exc)
        return []

    def _current(self, msg: Draft) -> bool:
        """Whether a draft extends the output as it stands: its base is the output's length and,
        for a chain sent ahead, the round before it was the last verified, accepted whole; for
        a fork, its round was the last verified and left the fork's token last in the output."""
        if msg.base != len(self.output):
            return False
        if isinstance(msg, wire.Draft) and msg.ahead:
            return self.last_verified == (msg.round - 1, True)
        if isinstance(msg, wire.DraftWithDists) and msg.fork is not None:
            last = self.last_verified
            return last is not None and last[0] == msg.fork[0] and self.output[-1] == msg.fork[1]
        return True

    def _check_draft(self, msg: Draft) -> None:
        """Refuse, on arrival, a draft this cloud could never verify."""
        expected = wire.DraftWithDists if self.scheme.uploads_dists else wire.Draft
        if not self.scheme.chooses_dists and not isinstance(msg, expected):
            kind = f"{expected.__name__}, not {type(msg).__name__}"
            raise _bad_draft(msg, f"this method's drafts travel as {kind}")
        if _srdv(msg) and not self.scheme.chooses_per_round:
            raise _bad_draft(msg, "it asks for SR-DV, but this method does not choose per round")
        if isinstance(msg, wire.Draft) and msg.ahead and (msg.committed or msg.round == 0):
            # it continues the round before it, accepted whole: it commits nothing, and round 0
            # has no round before it
            reason = "committed tokens" if msg.committed else "no round before it"
            raise _bad_draft(msg, f"it is sent ahead but has {reason}")
        self._check_fork(msg)
        gamma = self.settings.gamma
        if len(msg.tokens) > gamma:
            reason = f"{len(msg.tokens)} tokens, but the request's gamma is {gamma}"
            raise _bad_draft(msg, reason, ErrorCode.LIMIT)
        width = self.alignment.target_width
        if any(not 0 <= t < width for t in (*msg.tokens, *msg.committed)):
            raise _bad_draft(msg, f"a token outside the target vocabulary [0, {width})")
        if isinstance(msg, wire.DraftWithDists):
            if msg.width != width:
                raise _bad_draft(msg, f"distributions over {msg.width} ids, target has {width}")
            for position, dist in zip(msg.dist_positions, msg.dists, strict=True):
                if _count_of(dist, msg.tokens[position]) == 0:
                    raise _bad_draft(msg, f"token {position} has p(x) = 0 in its own distribution")
            return
        if len(msg.probs) != len(msg.tokens):
            raise _bad_draft(msg, "every drafted token needs its p(x)")
        zero = [i for i, p in enumerate(msg.probs) if p <= 0]
        if zero:
            raise _bad_draft(msg, f"token {zero[0]} has p(x) = 0: it could not have been drafted")

    def _check_fork(self, msg: Draft) -> None:
        """A fork continues the verdict of an earlier round, whose token at a rejection the
        cloud draws itself: only such a method sends one, and it commits nothing."""
        if not isinstance(msg, wire.DraftWithDists) or msg.fork is None:
            return
        if not self.scheme.uploads_dists or self.bonus:
            raise _bad_draft(msg, "it is a fork, but this method sends no chain before a verdict")
        if msg.committed or msg.fork[0] >= msg.round or msg.base == 0:
            raise _bad_draft(msg, "a fork continues an earlier round and commits nothing")

    def _check_room(self, msg: Draft) -> None:
        """A draft past the tokens the request asked for is refused: the edge should have
        stopped, and the session's cache would otherwise grow without bound."""
        limit = self.settings.max_new_tokens
        if len(self.output) + len(msg.committed) >= limit:
            reason = f"the request's max_new_tokens={limit} are all generated"
            raise _bad_draft(msg, reason, ErrorCode.LIMIT)

    def on_compute(self, purpose: Purpose, result: Any) -> list[Action]:
        if purpose == Purpose.PREFILL:
            return []
        msg, self.verifying = self.verifying, None
        assert msg is not None
        tokens = list(msg.tokens)
        srdv, plain = _srdv(msg), self._plain(msg)
        scheme = self.scheme.for_round(srdv, plain)  # the round's mechanism, from acceptance on
        context = [*self.prompt_ids, *self.output]
        # each row's q (and its rounding) is computed only when the decision reaches it: a
        # rejection at position j leaves the rows after j untouched
        sampling = self.settings.sampling
        targets = LazyRows(
            len(result),
            lambda i: result.target_probs(i, sampling, self.valid, [*context, *tokens[:i]]),
        )
        rounded = LazyRows(len(tokens), lambda i: scheme.round_target(self, targets[i]))
        decide = LazyRows(
            len(tokens), lambda i: scheme.decision_probs(self, targets[i], rounded[i])
        )
        probs, unverified, dists = self._draft_side(msg, tokens)
        start, seed = len(self.output), self.settings.seed
        coins = LazyRows(len(tokens), lambda i: position_rng(seed, Draw.COIN, start + i))
        accepted = verify_chain(tokens, probs, decide, coins, unverified=unverified)
        self.output.extend(tokens[:accepted])
        self._add_tv([rounded[i] for i in range(min(accepted + 1, len(tokens)))])
        self.count("rounds")
        self.last_verified = (msg.round, accepted == len(tokens) and not self.bonus)
        if accepted == len(tokens):
            self.rejection = None
            self.state = CloudState.IDLE
            bonus = pick(targets[len(result) - 1], self.rng) if self.bonus else None
            actions = self._reply(wire.VerifyResult(msg.round, accepted, token=bonus))
        else:
            self.count("rejections")
            self.state = CloudState.REJECTED
            self.rejection = Rejection(
                msg.round,
                accepted,
                targets[accepted],
                rounded[accepted],
                dists.get(accepted),
                srdv=srdv,
                plain=plain,
            )
            actions = self._answer(self.rejection, scheme.cloud_reply(self, self.rejection))
        return [*actions, *self._next_draft()]

    def residual_rng(self) -> np.random.Generator:
        """The residual's stream at the rejected position: the next output position, its token
        not yet in the output."""
        return position_rng(self.settings.seed, Draw.RESIDUAL, len(self.output))

    def _plain(self, msg: Draft) -> bool:
        """Whether a draft went up without its p̃ where the method lets the edge choose."""
        return self.scheme.chooses_dists and isinstance(msg, wire.Draft)

    def _add_tv(self, rounded: list[Rounded | None]) -> None:
        """The positions this round decided (accepted ones and the rejected one) with a rounded
        q̂ have law q̂, not q: their TV(q, q̂) adds to the run's bound."""
        tv = sum(r.tv for r in rounded if r is not None)
        self.counters["tv_bound"] = self.counters.get("tv_bound", 0.0) + tv

    def _answer(self, rejection: Rejection, reply: wire.Message) -> list[Action]:
        """Send what the scheme answered about a rejected position, counted on its record."""
        rejection.replies += 1
        return self._reply(reply)

    def _reply(self, reply: wire.Message) -> list[Action]:
        """Send a reply; a token the cloud chose itself joins its output at once."""
        if isinstance(reply, wire.VerifyResult) and reply.token is not None:
            self.output.append(reply.token)
        return [Send(reply)]

    @staticmethod
    def _draft_side(msg: Draft, tokens: list[int]) -> tuple[list[float], list[bool] | None, dict]:
        """p̃(x_i) of each drafted token as a probability, which positions go unverified, and
        the full p̃ the edge uploaded (by position)."""
        if isinstance(msg, wire.Draft):
            return list(dequantize(np.array(msg.probs, dtype=np.int64))), None, {}
        dists = {
            pos: dequantize(d.to_dense(), d.bits)
            for pos, d in zip(msg.dist_positions, msg.dists, strict=True)
        }
        probs = [float(dists[i][t]) if i in dists else 1.0 for i, t in enumerate(tokens)]
        unverified = [i not in dists for i in range(len(tokens))]
        return probs, unverified, dists


class LazyRows(Sequence[Any]):
    """A sequence whose i-th item is computed (once) when first read."""

    def __init__(self, length: int, compute: Callable[[int], Any]) -> None:
        self._length, self._compute, self._done = length, compute, {}

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: Any) -> Any:
        if not isinstance(i, int) or not 0 <= i < self._length:
            raise IndexError(f"row {i!r} of {self._length}")
        if i not in self._done:
            self._done[i] = self._compute(i)
        return self._done[i]


def _bad_draft(msg: Draft, reason: str, code: ErrorCode = ErrorCode.PROTOCOL) -> ProtocolError:
    """The error for a draft the cloud refuses, naming its round."""
    return ProtocolError(f"draft for round {msg.round}: {reason}", code)


def _srdv(msg: Draft) -> bool:
    """Whether a round's draft chose SR-DV (only a Draft carries the flag)."""
    return isinstance(msg, wire.Draft) and msg.srdv


def _count_of(dist: wire.Dist, token: int) -> int:
    """A shipped distribution's count of one token (0 when it lists none)."""
    at = int(np.searchsorted(dist.ids, token))
    return int(dist.counts[at]) if at < len(dist.ids) and dist.ids[at] == token else 0
