"""Stop-and-wait speculative decoding: one edge/cloud state-machine pair, every resampling scheme.

The edge drafts γ tokens (TLI: only from the common vocabulary, in target ids), uploads them with
p_i(x_i) and waits; the cloud verifies them in one forward pass and answers. Methods differ only
in what happens at a rejection (who draws the residual and what travels), which is a `Scheme`:
a pair of small hooks, one per side. The machines never do I/O and never read a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.protocols.base import (
    Action,
    Compute,
    ComputeCost,
    ComputeDone,
    Event,
    Finish,
    MessageReceived,
    Send,
    Start,
)
from wanspec.protocols.runner import ModelRunner, target_counts
from wanspec.protocols.settings import GenerationSettings
from wanspec.protocols.stopping import StopChecker, emit_tokens
from wanspec.sampling import (
    Counts,
    HybridPayload,
    greedy_replacement,
    hybrid_cloud_payload,
    hybrid_edge_resolve,
    hybrid_o_sample,
    quantize,
    sample,
    sample_residual,
    srdv_cloud_candidates,
    srdv_edge_verify,
    truncate_top_k,
    truncated_residual_sample,
    uhlm_uncertainty,
    verify_chain,
    warp_probs,
)
from wanspec.sampling.quant import PROB_SCALE
from wanspec.vocab import DraftRetokenizer, VocabAlignment


class ProtocolError(RuntimeError):
    """The peer sent something this state machine cannot accept in its current state."""


def _rngs(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent, reproducible edge and cloud generators from one request seed."""
    return np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])


# ============================================================================ the round state


@dataclass
class Round:
    """What the edge drafted in one round (target ids and their draft distributions)."""

    index: int
    tokens: list[int] = field(default_factory=list)
    probs: list[int] = field(default_factory=list)
    dists: list[Counts] = field(default_factory=list)
    draft_logits: list[np.ndarray] = field(default_factory=list)
    candidate_rounds: int = 0


@dataclass
class Rejection:
    """What the cloud keeps about the rejected position of a round, for follow-up requests."""

    index: int
    position: int
    target: Counts
    draft: Counts | None = None


# ============================================================================ schemes


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
        token = sample_residual(msg.dist.to_dense(), rnd.dists[n], edge.rng)
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
            return edge.finish_round(rnd, edge.rejected_at, msg.token, decided_by_edge=True)
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
            edge.rejected_at = n
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
            edge.rejected_at = msg.accepted
        rnd.candidate_rounds += 1
        edge.count("srdv_candidate_rounds")
        ids, counts = zip(*msg.candidates, strict=True)
        token = srdv_edge_verify(ids, counts, rnd.dists[edge.rejected_at], edge.rng)
        if token is not None:
            return edge.finish_round(rnd, edge.rejected_at, token, decided_by_edge=True)
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
        dist = msg.dist
        token = truncated_residual_sample(dist.ids, dist.counts, rnd.dists[msg.accepted], edge.rng)
        return edge.finish_round(rnd, msg.accepted, token, decided_by_edge=True)


# ============================================================================ the edge


class SpecEdge:
    """Edge side: drafts, uploads, resolves rejections per scheme, emits finalised tokens."""

    side = "edge"

    def __init__(
        self,
        *,
        scheme: Scheme,
        draft_lm: Any,
        alignment: VocabAlignment,
        prompt: str,
        prompt_draft_ids: list[int],
        settings: GenerationSettings,
        stopper: StopChecker,
    ) -> None:
        self.scheme, self.alignment, self.settings, self.stopper = (
            scheme,
            alignment,
            settings,
            stopper,
        )
        self.prompt = prompt
        self.runner = ModelRunner(draft_lm)
        self.rng, _ = _rngs(settings.seed)
        self.common = alignment.in_common
        self.draft_ctx: list[int] = list(prompt_draft_ids)
        self.retokenizer = DraftRetokenizer(alignment)
        self.pending_echo: list[int] = []
        self.round: Round | None = None
        self.rejected_at = 0
        self.counters: dict[str, int] = {}
        self.accepted_per_round: list[int] = []
        self._rounds = 0

    def count(self, name: str, k: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + k

    # ---- event entry point
    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Start):
            request = wire.StartRequest(0, self.prompt, self.settings.to_dict())
            return [Send(request), *self._begin_round()]
        if isinstance(event, ComputeDone):
            return self._on_compute(event)
        if isinstance(event, MessageReceived):
            try:
                return self._on_message(event.msg)
            except (ProtocolError, ValueError) as exc:  # a bad reply ends this request cleanly
                return [Send(wire.Error(1, str(exc))), Finish(f"error: {exc}")]
        raise ProtocolError(f"unknown event {event!r}")

    # ---- drafting
    def _begin_round(self) -> list[Action]:
        self.round = Round(self._rounds)
        self._rounds += 1
        plan = self.runner.plan(self.draft_ctx)
        return [Compute("sync", plan.cost, lambda: self.runner.run(plan)[-1])]

    def _draft_dist(self, logits: Any) -> tuple[Counts, np.ndarray]:
        projected = self.alignment.project_draft_logits(logits.float())
        counts = quantize(warp_probs(projected.unsqueeze(0), self.settings.sampling)[0])
        return counts, projected.detach().numpy()

    def _take(self, logits: Any) -> int:
        rnd = self.round
        counts, projected = self._draft_dist(logits)
        token = sample(counts, self.rng)
        rnd.tokens.append(token)
        rnd.probs.append(int(counts[token]))
        rnd.dists.append(counts)
        if self.scheme.keeps_draft_logits:
            rnd.draft_logits.append(projected)
        return int(self.alignment.target_to_draft[token])

    def _draft_rest(self, first_logits: Any) -> None:
        drafted = [self._take(first_logits)]
        for _ in range(self.settings.gamma - 1):
            plan = self.runner.plan(self.draft_ctx + drafted)
            drafted.append(self._take(self.runner.run(plan)[-1]))

    def _on_compute(self, event: ComputeDone) -> list[Action]:
        if event.tag == "sync":
            cost = ComputeCost(
                "forward", n=1, passes=self.settings.gamma - 1, context=len(self.draft_ctx)
            )
            logits = event.result
            if self.settings.gamma == 1:
                self._draft_rest(logits)
                return self._upload()
            return [Compute("draft", cost, lambda: self._draft_rest(logits))]
        if event.tag == "draft":
            return self._upload()
        raise ProtocolError(f"unknown computation {event.tag!r}")

    def dists_message(self, rnd: Round, positions: list[int]) -> wire.Message:
        """UL / U-HLM upload: the draft plus full draft distributions at `positions`."""
        return wire.DraftWithDists(
            rnd.index,
            committed=tuple(self.pending_echo),
            tokens=tuple(rnd.tokens),
            width=self.alignment.target_width,
            dist_positions=tuple(positions),
            dists=tuple(wire.Dist.from_dense(rnd.dists[i]) for i in positions),
        )

    def rejected_dist_message(self, rnd: Round, position: int) -> wire.Message:
        """SD's answer to the cloud: the rejected token and its full draft distribution."""
        return wire.DraftWithDists(
            rnd.index,
            tokens=(rnd.tokens[position],),
            width=self.alignment.target_width,
            dist_positions=(0,),
            dists=(wire.Dist.from_dense(rnd.dists[position]),),
        )

    def _upload(self) -> list[Action]:
        rnd = self.round
        if self.scheme.uploads_dists:
            msg = self.dists_message(rnd, self.scheme.upload_positions(self, rnd))
        else:
            msg = wire.Draft(
                rnd.index, tuple(self.pending_echo), tuple(rnd.tokens), tuple(rnd.probs)
            )
        self.pending_echo = []
        return [Send(msg)]

    # ---- replies
    def _on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.Error):
            return [Finish(f"error: cloud says {msg.message}")]
        rnd = self.round
        if rnd is None or getattr(msg, "round", None) != rnd.index:
            raise ProtocolError(
                f"unexpected {type(msg).__name__} (round {getattr(msg, 'round', None)})"
            )
        if isinstance(msg, wire.VerifyResult) and msg.accepted == len(rnd.tokens):
            if msg.token is None:
                raise ProtocolError("all tokens accepted but no bonus token")
            return self.finish_round(rnd, msg.accepted, msg.token, decided_by_edge=False)
        return self.scheme.edge_on_reject(self, rnd, msg)

    def finish_round(
        self, rnd: Round, accepted: int, token: int, *, decided_by_edge: bool
    ) -> list[Action]:
        """Commit accepted drafts plus the bonus/replacement token, then go on or stop."""
        self.accepted_per_round.append(accepted)
        new = [*rnd.tokens[:accepted], int(token)]
        actions, done = emit_tokens(self.stopper, new)
        if done:
            return actions
        if decided_by_edge:
            self.pending_echo.append(int(token))
        for t in new:
            self._sync_draft_context(t)
        return [*actions, *self._begin_round()]

    def _sync_draft_context(self, token: int) -> None:
        """Spell a finalised target token in the draft's vocabulary. Bytes the draft vocabulary
        cannot spell are left out of the draft context (counted): the draft only proposes, so
        this costs acceptance, never exactness."""
        try:
            self.draft_ctx.extend(self.retokenizer.push(token))
        except ValueError:
            self.count("draft_unspellable_tokens")


# ============================================================================ the cloud


class SpecCloud:
    """Cloud side: prefill on request, verify each draft in one pass, answer per scheme."""

    side = "cloud"

    def __init__(
        self,
        *,
        scheme: Scheme,
        target_lm: Any,
        alignment: VocabAlignment,
        encode_prompt: Callable[[str], list[int]],
    ) -> None:
        self.scheme, self.alignment, self.encode_prompt = scheme, alignment, encode_prompt
        self.runner = ModelRunner(target_lm)
        self.common = alignment.in_common
        self.settings: GenerationSettings | None = None
        self.context: list[int] = []
        self.rejection: Rejection | None = None
        self.pending: Any = None
        self.rng = np.random.default_rng(0)
        self.counters: dict[str, int] = {}

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Start):
            return []
        if isinstance(event, ComputeDone):
            return self._on_compute(event)
        if isinstance(event, MessageReceived):
            try:
                return self._on_message(event.msg)
            except (ProtocolError, ValueError) as exc:
                return [Send(wire.Error(1, str(exc))), Finish(f"error: {exc}")]
        raise ProtocolError(f"unknown event {event!r}")

    def _on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.StartRequest):
            self.settings = GenerationSettings.from_dict(msg.settings)
            _, self.rng = _rngs(self.settings.seed)
            self.context = self.encode_prompt(msg.prompt)
            plan = self.runner.plan(self.context)
            return [Compute("prefill", plan.cost, lambda: self.runner.run(plan))]
        if isinstance(msg, wire.Close):
            return [Finish("closed by edge")]
        if self.settings is None:
            raise ProtocolError(f"{type(msg).__name__} before StartRequest")
        follow_up = (
            self.rejection is not None and getattr(msg, "round", None) == self.rejection.index
        )
        if follow_up:
            return self._reply(self.scheme.cloud_on_request(self, self.rejection, msg))
        if isinstance(msg, wire.Draft | wire.DraftWithDists) and msg.tokens:
            return self._verify(msg)
        raise ProtocolError(f"unexpected {type(msg).__name__}")

    def _reply(self, reply: wire.Message) -> list[Action]:
        """Send a reply; a token the cloud chose itself joins its context at once."""
        if isinstance(reply, wire.VerifyResult) and reply.token is not None:
            self.context.append(reply.token)
        return [Send(reply)]

    def _verify(self, msg: Any) -> list[Action]:
        self.context.extend(msg.committed)
        self.pending = msg
        desired = self.context + list(msg.tokens)
        rows = len(msg.tokens) + 1
        plan = self.runner.plan(desired, rows)
        valid, params = self.alignment.target_valid, self.settings.sampling

        def run() -> list[Counts]:
            logits = self.runner.run(plan)[-rows:]
            return [target_counts(row, params, valid) for row in logits]

        return [Compute("verify", plan.cost, run)]

    def _on_compute(self, event: ComputeDone) -> list[Action]:
        if event.tag == "prefill":
            return []
        if event.tag != "verify":
            raise ProtocolError(f"unknown computation {event.tag!r}")
        msg, targets = self.pending, event.result
        tokens = list(msg.tokens)
        draft_counts, unverified, dists = self._draft_side(msg, tokens)
        accepted = verify_chain(tokens, draft_counts, targets, self.rng, unverified=unverified)
        self.context.extend(tokens[:accepted])
        self.count("rounds")
        if accepted == len(tokens):
            self.rejection = None
            bonus = sample(targets[-1], self.rng)
            return self._reply(wire.VerifyResult(msg.round, accepted, token=bonus))
        self.count("rejections")
        self.rejection = Rejection(msg.round, accepted, targets[accepted], dists.get(accepted))
        return self._reply(self.scheme.cloud_reply(self, self.rejection))

    def _draft_side(self, msg: Any, tokens: list[int]) -> tuple[list[int], list[bool] | None, dict]:
        if isinstance(msg, wire.Draft):
            return list(msg.probs), None, {}
        dists = {pos: d.to_dense() for pos, d in zip(msg.dist_positions, msg.dists, strict=True)}
        probs = [int(dists[i][t]) if i in dists else PROB_SCALE for i, t in enumerate(tokens)]
        unverified = [i not in dists for i in range(len(tokens))]
        return probs, unverified, dists

    def count(self, name: str, k: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + k
