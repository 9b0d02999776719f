"""xcosd-auto: the edge chooses HR or SR-DV per round, the Draft tells the cloud, and both sides
hold the round to that mechanism.

The laws are enumerated in tests/test_protocols_exact_law.py (the round forced to each
mechanism) and pooled over many positions with both mechanisms mixed in one run in
tests/test_protocols_pooled_law.py; the policy alone in tests/test_resample_choice.py. Here: the
choice is made before the round is drafted and travels in its Draft; a follow-up or reply that
belongs to the other mechanism is refused as the peer's error; on the simulator the measured
choice follows the link; and without a clock the edge keeps SR-DV.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from wanspec import wire
from wanspec.models.jobs import session_executor
from wanspec.protocols.base import (
    Compute,
    ComputeDone,
    ErrorCode,
    MessageReceived,
    Send,
    Start,
)
from wanspec.protocols.resample_choice import Mechanism, MechanismChooser
from wanspec.sim import Link
from worlds import FLAT_PROFILE, PROMPT_IDS, World, deliver, refusal, small_residual_world

HR, SRDV = Mechanism.HR, Mechanism.SRDV
GAMMA = 2


class _Pinned(MechanismChooser):
    """A chooser that always picks `mechanism` and counts how often it was asked."""

    def __init__(self, mechanism: Mechanism) -> None:
        super().__init__()
        self.mechanism, self.asked = mechanism, 0

    def choose(self) -> Mechanism:
        self.asked += 1
        return self.mechanism


def _impossible(world: World) -> int:
    """A common token the target cannot produce after the prompt: a draft of it is rejected."""
    world.target.reset()
    logits = world.target.extend(PROMPT_IDS)[-1].numpy()
    world.target.reset()
    common = world.alignment.common_target_ids
    return int(common[np.argmin(logits[common])])


# ============================================================================ the edge


def _ack(edge: Any) -> wire.HelloAck:
    fp = edge.fingerprints
    return wire.HelloAck(wire.WIRE_VERSION, fp.target_model, fp.target_tokenizer, {})


def _edge_with_a_draft_up(world: World, mechanism: Mechanism, **settings: Any) -> tuple:
    """An xcosd-auto edge pinned to `mechanism`, past the handshake, its first draft sent;
    the edge, its chooser and the Draft."""
    edge = world.edge("xcosd-auto", max_new_tokens=20, gamma=GAMMA, seed=4, **settings)
    chooser = edge.chooser = _Pinned(mechanism)
    actions = edge.handle(Start())
    assert chooser.asked == 1 and edge.round.srdv == (mechanism is SRDV)  # before any draft job
    assert edge.handle(MessageReceived(_ack(edge))) == []
    run = session_executor(world.draft)
    while not any(isinstance(a, Send) and isinstance(a.msg, wire.Draft) for a in actions):
        (compute,) = [a for a in actions if isinstance(a, Compute)]
        actions = edge.handle(ComputeDone(compute.job_id, run(compute.job)))
        assert chooser.asked == 1  # drafting chooses nothing
    (draft,) = [a.msg for a in actions if isinstance(a, Send)]
    return edge, chooser, draft


@pytest.mark.parametrize("mechanism", [HR, SRDV])
def test_the_edge_chooses_before_the_rounds_first_draft_job_and_sends_the_choice(
    hetero_world: World, mechanism: Mechanism
) -> None:
    _, _, draft = _edge_with_a_draft_up(hetero_world, mechanism)
    assert len(draft.tokens) == GAMMA and draft.srdv == (mechanism is SRDV)
    assert wire.decode(wire.encode(draft)) == draft


def test_an_srdv_round_refuses_an_hr_verdict_and_an_o_token(hetero_world: World) -> None:
    edge, _, _ = _edge_with_a_draft_up(hetero_world, SRDV, srdv_k=1, srdv_m=2)
    width = len(hetero_world.alignment.common_target_ids)
    hr_verdict = wire.VerifyResult(0, 0, dist=wire.Dist(width, [], [], 32), theta_o=2**32 - 1)
    reason = "srdv: unexpected VerifyResult at a rejection"
    assert refusal(deliver(edge, hr_verdict)) == (ErrorCode.PROTOCOL, reason)

    edge, _, draft = _edge_with_a_draft_up(hetero_world, SRDV, srdv_k=1, srdv_m=2)
    doomed = ((draft.tokens[0], 1e-12),)  # p̃(y) / q(y) > 1: rejected surely, so more are asked
    (ask,) = deliver(edge, wire.VerifyResult(0, 0, candidates=doomed))
    assert ask.msg == wire.CandidatesRequest(0, 1)
    reason = "srdv: unexpected OToken at a rejection"
    o_token = wire.OToken(0, 286, "ĠĠ")
    assert refusal(deliver(edge, o_token)) == (ErrorCode.PROTOCOL, reason)


def test_an_hr_round_refuses_candidates(hetero_world: World) -> None:
    edge, _, _ = _edge_with_a_draft_up(hetero_world, HR, hr_piggyback=False)
    width = len(hetero_world.alignment.common_target_ids)
    all_in_o = wire.VerifyResult(0, 0, dist=wire.Dist(width, [], [], 32), theta_o=2**32 - 1)
    (ask,) = deliver(edge, all_in_o)  # region O surely, no O-sample along: the edge asks
    assert ask.msg == wire.ResampleRequest(0, wire.ResampleKind.O_SAMPLE)
    candidates = wire.Candidates(0, ((5, 0.5),), ())
    reason = "hr: unexpected Candidates at a rejection"
    assert refusal(deliver(edge, candidates)) == (ErrorCode.PROTOCOL, reason)


# ============================================================================ the cloud


def _cloud_ready(world: World, method: str = "xcosd-auto", **settings: Any) -> tuple:
    """A cloud waiting for the first draft (`World.ready_cloud`)."""
    return world.ready_cloud(method, max_new_tokens=20, gamma=GAMMA, **settings)


def _rejected(world: World, srdv: bool, **settings: Any) -> tuple:
    """A cloud that has just answered a round whose draft is rejected at once; the cloud and
    its verdict."""
    cloud, run = _cloud_ready(world, **settings)
    draft = wire.Draft(0, 0, (), (_impossible(world),), (65535,), srdv=srdv)
    (verify,) = deliver(cloud, draft)
    (reply,) = cloud.handle(ComputeDone(verify.job_id, run(verify.job)))
    assert reply.msg.accepted == 0
    assert cloud.inner.rejection.srdv == srdv
    return cloud, reply.msg


def test_the_cloud_answers_each_round_with_the_mechanism_its_draft_named(
    hetero_world: World,
) -> None:
    _, hr = _rejected(hetero_world, srdv=False)
    assert hr.dist is not None and hr.dist.width == 141 and hr.candidates is None
    _, srdv = _rejected(hetero_world, srdv=True)
    assert srdv.candidates is not None and srdv.dist is None


def _fallback(world: World, token: int) -> wire.DraftWithDists:
    counts = np.zeros(world.alignment.target_width, dtype=np.int64)
    counts[token] = 65535
    dist = wire.Dist.from_dense(counts)
    return wire.DraftWithDists(0, 0, tokens=(token,), width=300, dist_positions=(0,), dists=(dist,))


@pytest.mark.parametrize(
    ("srdv", "follow_up", "reason"),
    [
        (False, wire.CandidatesRequest(0, 4), "hr: unexpected CandidatesRequest"),
        (False, "fallback", "hr: unexpected DraftWithDists"),
        (
            True,
            wire.ResampleRequest(0, wire.ResampleKind.O_SAMPLE),
            "expected the draft distribution of the rejected position",
        ),
    ],
)
def test_a_follow_up_of_the_other_mechanism_is_the_peers_error(
    hetero_world: World, srdv: bool, follow_up: Any, reason: str
) -> None:
    cloud, _ = _rejected(hetero_world, srdv=srdv, hr_piggyback=False)
    if follow_up == "fallback":
        follow_up = _fallback(hetero_world, _impossible(hetero_world))
    assert refusal(deliver(cloud, follow_up)) == (ErrorCode.PROTOCOL, reason)


def test_the_round_own_follow_ups_are_answered(hetero_world: World) -> None:
    cloud, _ = _rejected(hetero_world, srdv=True, srdv_k=1)
    (more,) = deliver(cloud, wire.CandidatesRequest(0, 1))
    assert isinstance(more.msg, wire.Candidates)
    (token,) = deliver(cloud, _fallback(hetero_world, _impossible(hetero_world)))
    assert token.msg.token is not None


def test_a_method_that_does_not_choose_refuses_the_srdv_flag(hetero_world: World) -> None:
    for method in ("xcosd", "xcosd-e"):
        cloud, _ = _cloud_ready(hetero_world, method)
        draft = wire.Draft(0, 0, (), (5,), (65535,), srdv=True)
        reason = "draft for round 0: it asks for SR-DV, but this method does not choose per round"
        assert refusal(deliver(cloud, draft)) == (ErrorCode.PROTOCOL, reason)


def test_an_edge_refuses_a_chooser_for_a_method_that_does_not_choose(hetero_world: World) -> None:
    edge = hetero_world.edge("xcosd", max_new_tokens=4)
    assert edge.chooser is None
    kwargs = dict(
        scheme=edge.scheme,
        alignment=edge.alignment,
        prompt_draft_ids=PROMPT_IDS,
        method="xcosd",
        prompt="x",
        settings=edge.settings,
        fingerprints=edge.fingerprints,
        decode=edge.decode,
    )
    with pytest.raises(ValueError, match="does not choose a mechanism per round"):
        type(edge)(chooser=MechanismChooser(), **kwargs)


# ============================================================================ on the simulator


@pytest.fixture(scope="module")
def choice_world() -> World:
    return small_residual_world()


TOKENS = 300  # long enough for the first trial at 16 rejected rounds and a second, later one


def _auto_run(world: World, link: Link, seed: int, **settings: Any) -> tuple:
    sim, edge, cloud = world.run(
        "xcosd-auto", link=link, seed=seed, max_new_tokens=TOKENS, temperature=1.0, gamma=GAMMA,
        **settings,
    )  # fmt: skip
    assert len(sim.tokens) == TOKENS, sim.finish_reason
    by_mechanism = [edge.counters.get(f"rejections_{m}", 0) for m in Mechanism]
    assert sum(by_mechanism) == cloud.counters["rejections"]
    return sim, edge, cloud


@pytest.mark.parametrize(
    ("link", "best"),
    [
        # 100 kbit/s, 20 ms: HR's kilobyte of q costs more than SR-DV's extra round trips
        (Link(bandwidth_bps=1e5, rtt_s=0.02), SRDV),
        # 10 Mbit/s, 200 ms: q costs nothing, a round trip costs much
        (Link(bandwidth_bps=1e7, rtt_s=0.2), HR),
    ],
    ids=["slow-link", "fast-link-long-rtt"],
)
def test_the_measured_choice_ends_on_the_mechanism_the_link_favours(
    choice_world: World, link: Link, best: Mechanism
) -> None:
    for seed in range(3):
        _, edge, _ = _auto_run(choice_world, link, seed)
        chooser = edge.chooser
        assert chooser.current is best, (seed, chooser.mean)
        # the other was measured, and its last trial did not beat the incumbent by the margin
        assert all(chooser.seen[m] >= chooser.trials[m] for m in Mechanism), chooser.seen
        assert chooser.mean[best.other] >= (1 - chooser.margin) * chooser.mean[best]
        if best is SRDV:  # HR, dear here, is tried rarely: at 16 rejected rounds, then 48
            assert edge.counters["rejections_hr"] <= 2 and chooser.switches == 0


def test_the_edge_prices_an_hr_round_from_the_link_it_measured(choice_world: World) -> None:
    """Before HR's first trial the chooser has its predicted cost: a verdict plus q over the
    common vocabulary (a byte per common id at least) at the downlink rate the edge fitted."""
    _, edge, _ = _auto_run(choice_world, Link(bandwidth_bps=1e5, rtt_s=0.02), seed=0)
    costs = edge.link.costs()
    assert costs.down_s_per_bit == pytest.approx(1e-5, rel=0.05)
    assert costs.trip_s == pytest.approx(0.02, rel=0.1)
    bits = 8 * int(edge.common.sum())
    expected = costs.trip_s + costs.verify_s + bits * costs.down_s_per_bit
    assert edge.chooser.predicted[HR] == pytest.approx(expected, rel=0.05)


def test_a_run_is_reproducible_on_the_same_link_and_timing(choice_world: World) -> None:
    link = Link(bandwidth_bps=3e5, rtt_s=0.05, jitter_s=0.01, seed=3)
    a, edge_a, _ = _auto_run(choice_world, link, seed=5)
    b, edge_b, _ = _auto_run(choice_world, link, seed=5)
    assert a.tokens == b.tokens and a.bits == b.bits and a.duration_s == b.duration_s
    assert edge_a.counters == edge_b.counters


@pytest.mark.parametrize("mechanism", [HR, SRDV])
def test_with_the_choice_pinned_the_tokens_do_not_depend_on_timing(
    hetero_world: World, mechanism: Mechanism
) -> None:
    """The measured choice follows the timing (so do the tokens: see METHODS.md); a pinned
    one leaves the machines as timing-blind as every other method's."""
    settings = dict(seed=21, max_new_tokens=16, temperature=1.3, gamma=3)
    runs = []
    for k in range(3):
        edge, cloud = hetero_world.machines("xcosd-auto", **settings)
        edge.chooser = _Pinned(mechanism)
        link = Link(bandwidth_bps=10 ** (4 + k), rtt_s=0.01 * (k + 1), jitter_s=0.02, seed=k)
        runs.append(hetero_world.simulate(edge, cloud, link, _Jittered(k)))
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens
    assert len({r.duration_s for r in runs}) == 3


class _Jittered:
    """Every computation's price scaled by U(0.3, 3): the same work at other times."""

    def __init__(self, seed: int) -> None:
        self.name, self.rng = "jittered", np.random.default_rng(seed)

    def seconds(self, cost: Any, wall_s: Any = None) -> float:
        return FLAT_PROFILE.seconds(cost) * float(self.rng.uniform(0.3, 3.0))


class _NoClock:
    """An edge whose driver stamps no clock: its events arrive without `at`."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine

    def handle(self, event: Any) -> list[Any]:
        if isinstance(event, Start | MessageReceived | ComputeDone):
            event = dataclasses.replace(event, at=None)
        return self.machine.handle(event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.machine, name)


def test_without_a_clock_every_round_is_srdv(choice_world: World) -> None:
    edge, cloud = choice_world.machines(
        "xcosd-auto", seed=1, max_new_tokens=60, temperature=1.0, gamma=GAMMA
    )
    sim = choice_world.simulate(_NoClock(edge), cloud, Link(bandwidth_bps=1e7, rtt_s=0.2))
    assert len(sim.tokens) == 60 and edge.now is None
    assert edge.chooser.clockless and edge.chooser.mean == {}
    assert edge.counters["rejections_srdv"] == cloud.counters["rejections"] > 3
    assert "rejections_hr" not in edge.counters and "hr_region_C" not in edge.counters
