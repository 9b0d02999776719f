"""What each draft/verify method does at a rejection: who draws the residual, what travels.

A `Scheme` is a pair of small hooks, one per side, used by the one speculative machine pair in
`wanspec.protocols.speculative`; adding such a method means adding a scheme and a registry entry.
Every draw uses the sampling floor's exact integer primitives on the quantised q̃ and p̃.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from wanspec import wire
from wanspec.protocols.base import Action, ProtocolError, Send
from wanspec.sampling import (
    HybridPayload,
    greedy_replacement,
    hybrid_cloud_payload,
    hybrid_edge_resolve,
    hybrid_o_sample,
    sample_residual,
    srdv_cloud_candidates,
    srdv_edge_verify,
    truncate_top_k,
    truncated_residual_sample,
    uhlm_uncertainty,
)

if TYPE_CHECKING:
    from wanspec.protocols.speculative import Rejection, Round, SpecCloud, SpecEdge


def reply_dist(msg: Any, width: int) -> wire.Dist:
    """The distribution a rejection reply must carry, checked against the target's width."""
    dist = getattr(msg, "dist", None)
    if not isinstance(msg, wire.VerifyResult) or dist is None or dist.width != width:
        raise ProtocolError(f"expected q over {width} ids in the reply, got {type(msg).__name__}")
    return dist


class Scheme:
    """Rejection handling of one method; the default is the cloud-side bonus only."""

    name = "base"
    uploads_dists = False  # UL-style: the draft distributions travel with the draft
    keeps_draft_logits = False  # the edge needs each position's draft logits (U-HLM)

    # ---- edge
    def upload_positions(self, edge: SpecEdge, rnd: Round) -> list[int]:
        return list(range(len(rnd.tokens)))

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> list[Action]:
        """Handle a VerifyResult / Candidates / OToken at a rejection; commit or ask again."""
        if isinstance(msg, wire.VerifyResult) and msg.token is not None:
            return edge.finish_round(rnd, msg.accepted, msg.token, decided_by_edge=False)
        raise ProtocolError(f"{self.name}: unexpected {type(msg).__name__} at a rejection")

    # ---- cloud
    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        raise NotImplementedError

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        raise ProtocolError(f"{self.name}: unexpected {type(msg).__name__}")


class ResidualDownlink(Scheme):
    """Naive / CoSD / DSSD: the cloud sends all of q_j; the edge draws the residual."""

    name = "residual-downlink"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        return wire.VerifyResult(rej.index, rej.position, dist=wire.Dist.from_dense(rej.target))

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> list[Action]:
        n = msg.accepted
        target = reply_dist(msg, edge.alignment.target_width).to_dense()
        token = sample_residual(target, rnd.dists[n], edge.rng)
        return edge.finish_round(rnd, n, token, decided_by_edge=True)


class UplinkDists(Scheme):
    """UL: every draft distribution travels up; the cloud draws the residual."""

    name = "ul"
    uploads_dists = True

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        token = sample_residual(rej.target, rej.draft, cloud.rng)
        return wire.VerifyResult(rej.index, rej.position, token=token)


class UncertaintySkip(UplinkDists):
    """U-HLM (lossy): only uncertain draft tokens are verified (their p travels); others pass."""

    name = "uhlm"
    keeps_draft_logits = True

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
        edge.count("uhlm_skipped", len(rnd.tokens) - len(positions))
        return positions


class AskForDraftDist(Scheme):
    """Vanilla SD over a network: the cloud verifies AND resamples, so at a rejection it asks the
    edge for the one draft distribution it lacks (an extra round trip, exact)."""

    name = "sd"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        return wire.VerifyResult(rej.index, rej.position)  # no token: "send me p_j"

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> list[Action]:
        if isinstance(msg, wire.VerifyResult) and msg.token is None:
            n = msg.accepted
            edge.count("draft_dist_requests")
            return [Send(edge.rejected_dist_message(rnd, n))]
        return super().edge_on_reject(edge, rnd, msg)

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        if not isinstance(msg, wire.DraftWithDists) or msg.dist_positions != (0,):
            raise ProtocolError("sd: expected the draft distribution of the rejected position")
        draft = msg.dists[0].to_dense()
        token = sample_residual(rej.target, draft, cloud.rng)
        return wire.VerifyResult(rej.index, rej.position, token=token)


class Hybrid(Scheme):
    """X-CoSD's HR: q on C and θ_o travel; the edge picks the region; O tokens come as pieces.

    q restricted to C travels indexed by position in C (both sides hold the alignment), so its
    dense form costs 16·|C| bits rather than 16·|V_L|."""

    name = "hr"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        return self.hr_payload(cloud, rej, piggyback=cloud.settings.hr_piggyback)

    @staticmethod
    def hr_payload(cloud: SpecCloud, rej: Rejection, piggyback: bool) -> wire.VerifyResult:
        payload = hybrid_cloud_payload(rej.target, cloud.common, cloud.rng, piggyback=piggyback)
        o_token = payload.o_sample
        pieces = () if o_token is None else ((o_token, cloud.alignment.target_piece(o_token)),)
        common_ids = cloud.alignment.common_target_ids  # both sides know C and its order
        return wire.VerifyResult(
            rej.index,
            rej.position,
            dist=wire.Dist.from_dense(payload.target_common[common_ids]),
            theta_o=payload.theta_o,
            o_token=o_token,
            pieces=pieces,
        )

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> list[Action]:
        if isinstance(msg, wire.OToken):
            edge.count("hr_o_requests")
            return edge.finish_round(rnd, rnd.rejected_at, msg.token, decided_by_edge=True)
        return self.resolve(edge, rnd, msg)

    @staticmethod
    def resolve(edge: SpecEdge, rnd: Round, msg: wire.VerifyResult) -> list[Action]:
        n = msg.accepted
        if msg.dist is None:
            raise ProtocolError("hybrid resampling needs q restricted to C")
        common_ids = edge.alignment.common_target_ids
        if msg.dist.width != len(common_ids):
            raise ProtocolError("hybrid resampling: q must travel over the common vocabulary")
        target_common = np.zeros(edge.alignment.target_width, dtype=np.int64)
        target_common[common_ids] = msg.dist.to_dense()
        payload = HybridPayload(target_common, int(msg.theta_o or 0), msg.o_token)
        choice = hybrid_edge_resolve(payload, rnd.dists[n], edge.common, edge.rng)
        edge.count(f"hr_region_{choice.region}")
        if choice.token is None:
            rnd.rejected_at = n
            return [Send(wire.ResampleRequest(rnd.index, wire.ResampleKind.O_SAMPLE))]
        return edge.finish_round(rnd, n, choice.token, decided_by_edge=True)

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        if isinstance(msg, wire.ResampleRequest) and msg.kind == wire.ResampleKind.O_SAMPLE:
            token = hybrid_o_sample(rej.target, cloud.common, cloud.rng)
            return wire.OToken(rej.index, token, cloud.alignment.target_piece(token))
        return super().cloud_on_request(cloud, rej, msg)


class ServerResampleDeviceVerify(Scheme):
    """X-CoSD-E's SR-DV: K samples of q travel; the edge accepts one by rejection sampling;
    after M rounds of K rejections, HR (with the piggybacked O-sample) finishes the job."""

    name = "srdv"

    def _candidates(self, cloud: SpecCloud, rej: Rejection) -> tuple[tuple, tuple]:
        ids, counts = srdv_cloud_candidates(rej.target, cloud.settings.srdv_k, cloud.rng)
        pieces = tuple(
            sorted({(y, cloud.alignment.target_piece(y)) for y in ids if not cloud.common[y]})
        )
        return tuple(zip(ids, counts, strict=True)), pieces

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        candidates, pieces = self._candidates(cloud, rej)
        return wire.VerifyResult(rej.index, rej.position, candidates=candidates, pieces=pieces)

    def cloud_on_request(self, cloud: SpecCloud, rej: Rejection, msg: Any) -> wire.Message:
        if isinstance(msg, wire.CandidatesRequest):
            candidates, pieces = self._candidates(cloud, rej)
            return wire.Candidates(rej.index, candidates, pieces)
        if isinstance(msg, wire.ResampleRequest) and msg.kind == wire.ResampleKind.HR_DIST:
            return Hybrid.hr_payload(cloud, rej, piggyback=True)
        return super().cloud_on_request(cloud, rej, msg)

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> list[Action]:
        if isinstance(msg, wire.VerifyResult) and msg.candidates is None:
            edge.count("srdv_fallbacks")
            return Hybrid.resolve(edge, rnd, msg)
        if isinstance(msg, wire.VerifyResult):
            rnd.rejected_at = msg.accepted
        rnd.candidate_rounds += 1
        edge.count("srdv_candidate_rounds")
        ids, counts = zip(*msg.candidates, strict=True)
        token = srdv_edge_verify(ids, counts, rnd.dists[rnd.rejected_at], edge.rng)
        if token is not None:
            return edge.finish_round(rnd, rnd.rejected_at, token, decided_by_edge=True)
        if rnd.candidate_rounds < edge.settings.srdv_m:
            return [Send(wire.CandidatesRequest(rnd.index, edge.settings.srdv_k))]
        return [Send(wire.ResampleRequest(rnd.index, wire.ResampleKind.HR_DIST))]


class GreedyReplacement(Scheme):
    """GR (lossy): the cloud's argmax replaces the rejected token."""

    name = "gr"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        return wire.VerifyResult(rej.index, rej.position, token=greedy_replacement(rej.target))


class TruncatedResidual(Scheme):
    """TR (lossy): the cloud sends the top-k of q_j; the edge draws the residual over it."""

    name = "tr"

    def cloud_reply(self, cloud: SpecCloud, rej: Rejection) -> wire.Message:
        ids, counts = truncate_top_k(rej.target, cloud.settings.tr_k)
        dist = wire.Dist(len(rej.target), ids, counts)
        return wire.VerifyResult(rej.index, rej.position, dist=dist, truncated=True)

    def edge_on_reject(self, edge: SpecEdge, rnd: Round, msg: Any) -> list[Action]:
        dist = reply_dist(msg, edge.alignment.target_width)
        token = truncated_residual_sample(dist.ids, dist.counts, rnd.dists[msg.accepted], edge.rng)
        return edge.finish_round(rnd, msg.accepted, token, decided_by_edge=True)
