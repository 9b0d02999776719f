"""What each draft/verify method does at a rejection: who draws the residual, what travels.

A `Scheme` is a pair of small hooks, one per side, used by the one speculative machine pair in
`wanspec.protocols.speculative`; adding such a method means adding a scheme and a registry entry.
Every draw is one of the sampling floor's primitives.

What q a method decides with: a scheme whose cloud resolves the rejection itself (SD, UL, U-HLM,
SR-DV with its fallback on the cloud, GR) decides with the target's float q and the draft's
exactly reported p̃, so it is exact with respect to q. A scheme that ships q to the edge
(`round_target` returns a `Rounded`) rounds it to `q_bits`-bit counts at every position it
verifies, and both sides decide with that q̂, so it is exact with respect to q̂; the cloud sums
TV(q, q̂) over those positions into the run's `tv_bound`.

A method that chooses its mechanism per round (`AdaptiveResampling`: HR or SR-DV;
`ResidualOrUplink`: p̃ up or q̂ down) hands each round to one member scheme (`for_round`), which
both machines ask once per round, so acceptance, reply and follow-ups of a round all follow the
one mechanism its draft named (by its `srdv` flag, or by carrying p̃ or not).

A hook draws what its method draws and returns what to do, as plain data; the machines apply it
in one place. The edge's hook returns `Resolved` (commit) or `Ask` (send and wait), the cloud's
the message to answer with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wanspec import wire
from wanspec.protocols.base import ErrorCode, ProtocolError
from wanspec.sampling import (
    HybridPayload,
    Rounded,
    dequantize,
    greedy_replacement,
    hybrid_bins,
    hybrid_edge_resolve,
    hybrid_o_sample,
    round_probs,
    sample_residual,
    srdv_cloud_candidates,
    srdv_edge_verify,
    truncate_top_k,
    truncated_residual_sample,
    uhlm_uncertainty,
)
from wanspec.sampling.proposal import DraftRow

if TYPE_CHECKING:
    from wanspec.protocols.speculative import Rejection, Round, SpecCloud, SpecEdge


@dataclass(frozen=True)
class Resolved:
    """The rejected position is settled: commit the `accepted` drafts and `token`, which the
    edge echoes to the cloud when it chose it (`decided_by_edge`)."""

    accepted: int
    token: int
    decided_by_edge: bool
    counts: tuple[str, ...] = ()  # edge counters this outcome adds one to


@dataclass(frozen=True)
class Ask:
    """The rejected position is still open: send `msg` to the cloud and wait for its answer."""

    msg: wire.Message
    counts: tuple[str, ...] = ()  # edge counters this request adds one to


Decision = Resolved | Ask


def wire_dist(row: DraftRow) -> wire.Dist:
    """A drafted position's p̃ as it travels (sparse: the candidates with a count)."""
    return wire.Dist(row.width, row.ids, row.counts)


def rejected_dist_message(rnd: Round, position: int, width: int) -> wire.DraftWithDists:
    """What the cloud needs to draw the residual itself: the rejected token and its full p̃."""
    return wire.DraftWithDists(
        rnd.index,
        rnd.base,
        tokens=(rnd.tokens[position],),
        width=width,
        dist_positions=(0,),
        dists=(wire_dist(rnd.dists[position]),),
    )


def reply_dist(msg: Any, width: int) -> wire.Dist:
    """The distribution a rejection reply must carry, checked against the target's width."""
    dist = getattr(msg, "dist", None)
    if not isinstance(msg, wire.VerifyResult) or dist is None or dist.width != width:
        raise ProtocolError(f"expected q over {width} ids in the reply, got {type(msg).__name__}")
    return dist


def dist_probs(dist: wire.Dist) -> np.ndarray:
    """The probabilities a shipped distribution stands for (the very floats the cloud used)."""
    return dequantize(dist.to_dense(), dist.bits)


def resample_with_draft(rej: Rejection, msg: Any, rng: np.random.Generator) -> int:
    """The cloud resolves a rejection itself: the residual of its float q and the p̃ the edge
    uploaded for the rejected position (SD's answer, SR-DV's fallback)."""
    if not isinstance(msg, wire.DraftWithDists) or msg.dist_positions != (0,):
        raise ProtocolError("expected the draft distribution of the rejected position")
    width = len(rej.target)
    if msg.dists[0].width != width:
        raise ProtocolError(f"the draft distribution is over {msg.dists[0].width} ids, not {width}")
    return sample_residual(rej.target, dist_probs(msg.dists[0]), rng)


class Scheme:
    """Rejection handling of one method; the default is the cloud-side bonus only."""

    name = "base"
    uploads_dists = False  # UL-style: the draft distributions travel with the draft
    keeps_draft_logits = False  # the edge needs each position's draft logits (U-HLM)
    # the edge counter of drafted tokens not uploaded for verification (None: all are uploaded)
    skipped_counter: str | None = None
    # the reply types this method's cloud may send about a rejected position
    replies_at_rejection: tuple[type, ...] = (wire.VerifyResult,)
    # the edge chooses per round how a rejection is resolved (`Draft.srdv`, `for_round`)
    chooses_per_round = False
    # the edge chooses per round whether p̃ goes up (a Draft or a DraftWithDists, `for_round`)
    chooses_dists = False
    # a rejection may be resolved by SR-DV's candidate sets (whose K and M may be chosen online)
    candidate_sets = False

    def for_round(self, srdv: bool, plain: bool = False) -> Scheme:
        """The scheme that handles a round whose draft says `srdv` (and went up without its p̃,
        `plain`): this one, unless the method chooses per round. The machines ask once per
        round and use its hooks for that round."""
        return self

    # ---- edge
    def upload_positions(self, edge: SpecEdge, rnd: Round) -> list[int]:
        return list(range(len(rnd.tokens)))

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> Decision:
        """What a VerifyResult / Candidates / OToken at a rejection decides: commit or ask again.
        It reads the edge and draws from its rng, and changes nothing else of it."""
        if isinstance(msg, wire.VerifyResult) and msg.token is not None:
            return Resolved(msg.accepted, msg.token, decided_by_edge=False)
        raise ProtocolError(f"{self.name}: unexpected {type(msg).__name__} at a rejection")

    # ---- cloud
    def round_target(self, cloud: SpecCloud, target: np.ndarray) -> Rounded | None:
        """The rounded q̂ this method ships and decides with, or None: decide with float q."""
        return None

    def decision_probs(
        self, cloud: SpecCloud, target: np.ndarray, rounded: Rounded | None
    ) -> np.ndarray:
        """The q acceptance tests use at a position (over the target vocabulary)."""
        return target if rounded is None else rounded.probs

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        raise NotImplementedError

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        """The answer to a follow-up request; the cloud sends it and keeps the record."""
        raise ProtocolError(f"{self.name}: unexpected {type(msg).__name__}")


class ShipsTarget(Scheme):
    """A scheme that ships q to the edge: it rounds q to `q_bits` and decides with q̂."""

    def round_target(self, cloud: SpecCloud, target: np.ndarray) -> Rounded | None:
        return round_probs(target, cloud.settings.q_bits)


class ResidualDownlink(ShipsTarget):
    """Naive / CoSD / DSSD: the cloud sends all of q̂_j; the edge draws the residual."""

    name = "residual-downlink"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        assert rej.rounded is not None
        dist = wire.Dist.from_dense(rej.rounded.counts, rej.rounded.bits)
        return wire.VerifyResult(rej.index, rej.position, dist=dist)

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> Decision:
        n = msg.accepted
        target = dist_probs(reply_dist(msg, edge.alignment.target_width))
        token = sample_residual(target, edge.draft_probs(rnd, n), edge.residual_rng(n))
        return Resolved(n, token, decided_by_edge=True)


class UplinkDists(Scheme):
    """UL: every draft distribution travels up; the cloud draws the residual."""

    name = "ul"
    uploads_dists = True

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        assert rej.draft is not None
        token = sample_residual(rej.target, rej.draft, cloud.residual_rng())
        return wire.VerifyResult(rej.index, rej.position, token=token)


class UncertaintySkip(UplinkDists):
    """U-HLM (lossy): only uncertain draft tokens are verified (their p travels); others pass."""

    name = "uhlm"
    keeps_draft_logits = True
    skipped_counter = "uhlm_skipped"

    def upload_positions(self, edge: SpecEdge, rnd: Round) -> list[int]:
        s = edge.settings
        positions = [
            i
            for i, (token, logits) in enumerate(zip(rnd.tokens, rnd.draft_logits, strict=True))
            if uhlm_uncertainty(
                logits, token, edge.rng, samples=s.uhlm_samples, eta_max=s.uhlm_eta_max
            )
            > s.uhlm_threshold
        ]
        return positions


class AskForDraftDist(Scheme):
    """Vanilla SD over a network: the cloud verifies AND resamples, so at a rejection it asks the
    edge for the one draft distribution it lacks (an extra round trip, exact)."""

    name = "sd"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        return wire.VerifyResult(rej.index, rej.position)  # no token: "send me p_j"

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> Decision:
        if isinstance(msg, wire.VerifyResult) and msg.token is None:
            width = edge.alignment.target_width
            message = rejected_dist_message(rnd, msg.accepted, width)
            return Ask(message, counts=("draft_dist_requests",))
        return super().edge_on_reject(edge, rnd, msg)

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        token = resample_with_draft(rej, msg, cloud.residual_rng())
        return wire.VerifyResult(rej.index, rej.position, token=token)


class Hybrid(Scheme):
    """X-CoSD's HR: q̂ on C and θ̂_o travel; the edge picks the region; O tokens come as pieces.

    q restricted to C travels indexed by position in C (both sides hold the alignment), so it
    costs |C| counts rather than |V_L|. The rounding is of C's entries plus θ_o as one bin
    (`hybrid_bins`); the O-sample is drawn from the float q restricted to O."""

    name = "hr"
    replies_at_rejection = (wire.VerifyResult, wire.OToken)

    def round_target(self, cloud: SpecCloud, target: np.ndarray) -> Rounded | None:
        bins = hybrid_bins(target, cloud.common, cloud.alignment.common_target_ids)
        return round_probs(bins, cloud.settings.q_bits)

    def decision_probs(
        self, cloud: SpecCloud, target: np.ndarray, rounded: Rounded | None
    ) -> np.ndarray:
        assert rounded is not None
        common_ids = cloud.alignment.common_target_ids
        return self.spread(rounded.probs[:-1], target.size, common_ids)

    @staticmethod
    def spread(common_probs: np.ndarray, width: int, common_ids: np.ndarray) -> np.ndarray:
        """q̂ on C, in C's order, as a vector over the target vocabulary (zeros on O)."""
        out = np.zeros(width, dtype=np.float64)
        out[common_ids] = common_probs
        return out

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        assert rej.rounded is not None
        counts, bits = rej.rounded.counts, rej.rounded.bits
        theta_o = int(counts[-1])
        piggyback = cloud.settings.hr_piggyback and theta_o > 0
        o_token = hybrid_o_sample(rej.target, cloud.common, cloud.rng) if piggyback else None
        pieces = () if o_token is None else ((o_token, cloud.alignment.target_piece(o_token)),)
        return wire.VerifyResult(
            rej.index,
            rej.position,
            dist=wire.Dist.from_dense(counts[:-1], bits),
            theta_o=theta_o,
            o_token=o_token,
            pieces=pieces,
        )

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> Decision:
        if isinstance(msg, wire.OToken):
            counts = ("hr_o_requests",)
            return Resolved(rnd.rejected_at, msg.token, decided_by_edge=True, counts=counts)
        return self.resolve(edge, rnd, msg)

    def resolve(self, edge: SpecEdge, rnd: Round, msg: wire.VerifyResult) -> Decision:
        n = msg.accepted
        if msg.dist is None:
            raise ProtocolError("hybrid resampling needs q restricted to C")
        common_ids = edge.alignment.common_target_ids
        if msg.dist.width != len(common_ids):
            raise ProtocolError("hybrid resampling: q must travel over the common vocabulary")
        width = edge.alignment.target_width
        target_common = self.spread(dist_probs(msg.dist), width, common_ids)
        theta_o = float(dequantize(np.array([msg.theta_o or 0]), msg.dist.bits)[0])
        payload = HybridPayload(target_common, theta_o, msg.o_token)
        choice = hybrid_edge_resolve(payload, edge.draft_probs(rnd, n), edge.common, edge.rng)
        counts = (f"hr_region_{choice.region}",)
        if choice.token is None:
            return Ask(wire.ResampleRequest(rnd.index, wire.ResampleKind.O_SAMPLE), counts)
        return Resolved(n, choice.token, decided_by_edge=True, counts=counts)

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        if isinstance(msg, wire.ResampleRequest) and msg.kind == wire.ResampleKind.O_SAMPLE:
            token = hybrid_o_sample(rej.target, cloud.common, cloud.rng)
            return wire.OToken(rej.index, token, cloud.alignment.target_piece(token))
        return super().cloud_on_request(cloud, rej, msg)


class ServerResampleDeviceVerify(Scheme):
    """X-CoSD-E's SR-DV: K samples of q travel with q(y) as float64; the edge accepts one by
    rejection sampling. After M rounds of K rejections the edge uploads p̃ of that one position
    and the cloud draws the residual of its float q (not HR: nothing of q is rounded), so the
    method is exact with respect to the float q. K and M are the request's, or the edge's
    choice within them (`srdv_k="auto"`, `srdv_m="auto"`): the first set's K as the edge last
    set it (`FirstCandidates`), every later set's as its request asks."""

    name = "srdv"
    replies_at_rejection = (wire.VerifyResult, wire.Candidates)
    candidate_sets = True

    def _candidates(self, cloud: SpecCloud, rej: Rejection, k: int) -> tuple[tuple, tuple]:
        ids, probs = srdv_cloud_candidates(rej.target, k, cloud.rng)
        pieces = tuple(
            sorted({(y, cloud.alignment.target_piece(y)) for y in ids if not cloud.common[y]})
        )
        return tuple(zip(ids, probs, strict=True)), pieces

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        candidates, pieces = self._candidates(cloud, rej, cloud.first_candidates)
        return wire.VerifyResult(rej.index, rej.position, candidates=candidates, pieces=pieces)

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        if isinstance(msg, wire.CandidatesRequest):
            self._check_request(cloud, rej, msg)
            candidates, pieces = self._candidates(cloud, rej, msg.k)
            return wire.Candidates(rej.index, candidates, pieces)
        token = resample_with_draft(rej, msg, cloud.residual_rng())
        return wire.VerifyResult(rej.index, rej.position, token=token)

    @staticmethod
    def _check_request(cloud: SpecCloud, rej: Rejection, msg: wire.CandidatesRequest) -> None:
        """The edge asks for the request's K candidates (any K up to it, where the edge chooses
        K), and for at most M sets in all (every answer about the position so far was a
        candidate set)."""
        settings = cloud.settings
        k, m = settings.srdv_k, settings.srdv_m
        if settings.adaptive_srdv_k and not 1 <= msg.k <= k:
            raise ProtocolError(
                f"{msg.k} candidates asked for, but the request's srdv_k allows at most {k}",
                ErrorCode.LIMIT,
            )
        if not settings.adaptive_srdv_k and msg.k != k:
            raise ProtocolError(f"{msg.k} candidates asked for, but the request's srdv_k is {k}")
        if rej.replies >= m:
            raise ProtocolError(
                f"candidate set {rej.replies + 1} asked for round {rej.index}, but the "
                f"request's srdv_m is {m}",
                ErrorCode.LIMIT,
            )

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> Decision:
        if isinstance(msg, wire.VerifyResult) and msg.candidates is None:
            return super().edge_on_reject(edge, rnd, msg)  # the cloud's fallback token
        width = edge.alignment.target_width
        if not msg.candidates or any(not 0 <= y < width for y, _ in msg.candidates):
            raise ProtocolError(f"SR-DV needs candidates within the target vocabulary [0, {width})")
        ids, probs = zip(*msg.candidates, strict=True)
        draft = edge.draft_probs(rnd, rnd.rejected_at)
        token = srdv_edge_verify(ids, probs, draft, edge.rng)
        counts = ("srdv_candidate_rounds",)
        if token is not None:
            return Resolved(rnd.rejected_at, token, decided_by_edge=True, counts=counts)
        k, m = edge.candidate_plan
        if rnd.replies < m:  # every reply so far was a candidate set
            return Ask(wire.CandidatesRequest(rnd.index, k), counts)
        message = rejected_dist_message(rnd, rnd.rejected_at, width)
        return Ask(message, counts=(*counts, "srdv_fallbacks"))


class PerRoundScheme(Scheme):
    """A method that hands each round to one of its member schemes (`for_round`): its own hooks
    must never run, for a machine that skips `for_round` is a bug (the base's round_target would
    silently decide a round with the float q whatever its mechanism)."""

    def _unresolved(self, *args: Any) -> Any:
        raise RuntimeError(f"{self.name}: ask for_round(srdv, plain) for the round's hooks")

    round_target = decision_probs = cloud_reply = cloud_on_request = edge_on_reject = _unresolved
    upload_positions = _unresolved


class AdaptiveResampling(PerRoundScheme):
    """X-CoSD with the mechanism chosen per round: HR (`Hybrid`) or SR-DV, as the round's draft
    says. The choice must hold for the whole round on both sides, acceptance tests included: HR
    decides with q̂ rounded on C, SR-DV with the float q. The edge makes it before drafting the
    round, from earlier rounds' costs (`resample_choice`), so each round's law is exact."""

    name = "auto-resample"
    replies_at_rejection = (wire.VerifyResult, wire.OToken, wire.Candidates)
    chooses_per_round = True
    candidate_sets = True

    def __init__(self) -> None:
        self.hr, self.srdv = Hybrid(), ServerResampleDeviceVerify()

    def for_round(self, srdv: bool, plain: bool = False) -> Scheme:
        return self.srdv if srdv else self.hr


class ResidualOrUplink(PerRoundScheme):
    """`deepspec-tree`: a chain goes up with its p̃ (UL: the cloud draws a rejection's token
    itself, so it can go straight on with a fork) or without it (the residual downlink: q̂ comes
    down and the edge draws the token), as the edge chooses per chain. The message type names
    the round's mechanism, and it holds for the whole round on both sides: UL decides with the
    float q, the residual downlink with q̂."""

    name = "residual-or-ul"
    uploads_dists = True  # the forks, and every chain the edge sends with its p̃
    chooses_dists = True

    def __init__(self) -> None:
        self.ul, self.residual = UplinkDists(), ResidualDownlink()

    def for_round(self, srdv: bool, plain: bool = False) -> Scheme:
        return self.residual if plain else self.ul


class GreedyReplacement(Scheme):
    """GR (lossy): the cloud's argmax replaces the rejected token."""

    name = "gr"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        return wire.VerifyResult(rej.index, rej.position, token=greedy_replacement(rej.target))


class TruncatedResidual(ShipsTarget):
    """TR (lossy): the cloud sends the top-k of q̂_j; the edge draws the residual over it."""

    name = "tr"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        assert rej.rounded is not None
        ids, counts = truncate_top_k(rej.rounded.counts, cloud.settings.tr_k)
        dist = wire.Dist(len(rej.target), ids, counts, rej.rounded.bits)
        return wire.VerifyResult(rej.index, rej.position, dist=dist, truncated=True)

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> Decision:
        dist = reply_dist(msg, edge.alignment.target_width)
        target = dequantize(dist.counts, dist.bits)
        draft = edge.draft_probs(rnd, msg.accepted)
        token = truncated_residual_sample(dist.ids, target, draft, edge.rng)
        return Resolved(msg.accepted, token, decided_by_edge=True)
