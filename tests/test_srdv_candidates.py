"""SR-DV's K and M chosen online (`srdv_k="auto"`, `srdv_m="auto"`): the pure model and link
fit of `protocols.candidates`, the machines' `FirstCandidates` exchange and refusals, and the
choice on the simulator. The law with K and M changing between rejections is pooled in
test_protocols_pooled_law.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from wanspec import wire
from wanspec.protocols.base import ComputeDone, ErrorCode, Send
from wanspec.protocols.candidates import (
    PRIOR_BETA,
    SWITCH_GAIN,
    CandidatePlanner,
    LinkCosts,
    LinkFit,
    resolution_seconds,
    set_failures,
)
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import Link
from worlds import PROMPT_IDS, World, deliver, refusal, small_residual_world

# ============================================================================ the model


def test_failures_average_over_positions_not_over_beta() -> None:
    # half the positions accept nothing, half accept a candidate with 1/2: two candidates fail
    # at (1 + 1/4)/2 of them, not at (1 − 1/4)^2
    assert set_failures([0.0, 0.5], k=2, sets=1) == pytest.approx(0.625)
    assert set_failures([0.0, 0.5], k=1, sets=2) == pytest.approx(0.625)
    assert set_failures([1.0], k=1, sets=1) == 0.0
    # before any position was seen: the prior β
    assert set_failures([], k=2, sets=1) == pytest.approx((1 - PRIOR_BETA) ** 2)


def test_resolution_seconds_by_hand() -> None:
    costs = LinkCosts(trip_s=0.1, up_s_per_bit=1e-4, down_s_per_bit=1e-3)
    # K = 2 candidates of 10 bits: 0.02 s on the verdict; a second set after 1/4 of them fail,
    # the fallback (0.1 s trip, 1000 bits up) after 1/16
    seconds = resolution_seconds(
        2, 2, [0.5], costs, candidate_bits=10, fallback_bits=1000
    )  # fmt: skip
    assert seconds == pytest.approx(0.02 + 0.25 * 0.12 + 0.0625 * 0.2)
    with pytest.raises(ValueError, match="at least 1"):
        resolution_seconds(0, 1, [0.5], costs, candidate_bits=10, fallback_bits=1000)


@pytest.mark.parametrize(("k", "m"), [(1, 1), (3, 2), (2, 4)])
def test_resolution_seconds_is_the_mean_of_the_process(k: int, m: int) -> None:
    """Play SR-DV out: sets of k candidates until one is accepted, the fallback after m."""
    rng = np.random.default_rng(0)
    betas = [0.1, 0.4, 0.7]
    costs = LinkCosts(trip_s=0.05, up_s_per_bit=2e-5, down_s_per_bit=1e-4)
    total, n = 0.0, 40_000
    for _ in range(n):
        beta = betas[rng.integers(len(betas))]
        seconds = k * 100 * 1e-4
        for s in range(1, m + 1):
            if rng.random() < 1 - (1 - beta) ** k:
                break
            seconds += 0.05 + (3000 * 2e-5 if s == m else k * 100 * 1e-4)
        total += seconds
    expected = resolution_seconds(k, m, betas, costs, candidate_bits=100, fallback_bits=3000)
    assert total / n == pytest.approx(expected, rel=0.02)


def _exchanges(fit: LinkFit, rtt: float, verify: float, up_bps: float, down_bps: float) -> None:
    """Verdicts (accepted and with candidates), candidate follow-ups and a fallback."""
    for up, down, verified in [
        (200, 40, True),
        (220, 700, True),
        (40, 700, False),
        (40, 1400, False),
        (9000, 60, False),
        (210, 60, True),
    ]:
        seconds = rtt + verified * verify + up / up_bps + down / down_bps
        fit.observe(up_bits=up, down_bits=down, seconds=seconds, verified=verified)


def test_the_link_fit_recovers_the_round_trip_and_both_rates() -> None:
    fit = LinkFit()
    _exchanges(fit, rtt=0.08, verify=0.15, up_bps=2e5, down_bps=1e6)
    costs = fit.costs()
    assert costs is not None
    assert costs.trip_s == pytest.approx(0.08, rel=1e-3)
    assert costs.up_s_per_bit == pytest.approx(1 / 2e5, rel=1e-2)
    assert costs.down_s_per_bit == pytest.approx(1 / 1e6, rel=1e-2)


def test_before_a_follow_up_a_trip_is_priced_like_a_verdict() -> None:
    fit = LinkFit()
    assert fit.costs() is None
    for up, down in [(200, 40), (220, 700), (210, 60)]:
        fit.observe(up_bits=up, down_bits=down, seconds=0.3 + down / 1e6, verified=True)
    costs = fit.costs()
    assert costs is not None and costs.trip_s == pytest.approx(0.3, rel=1e-3)


def test_the_link_fit_holds_a_term_at_zero_rather_than_below() -> None:
    fit = LinkFit()
    # more bits down came back sooner: a negative rate fits best, and is refused
    for down, seconds in [(100, 0.2), (1000, 0.19), (2000, 0.18), (3000, 0.17)]:
        fit.observe(up_bits=40, down_bits=down, seconds=seconds, verified=False)
    costs = fit.costs()
    assert costs is not None and costs.down_s_per_bit == 0.0 and costs.up_s_per_bit >= 0.0
    with pytest.raises(ValueError, match="finite"):
        fit.observe(up_bits=1, down_bits=1, seconds=float("nan"), verified=False)


def _planner(rtt: float, up_bps: float, down_bps: float, **kwargs: Any) -> CandidatePlanner:
    planner = CandidatePlanner(4, 2, k_max=16, m_max=8, **kwargs)
    _exchanges(planner.link, rtt=rtt, verify=0.15, up_bps=up_bps, down_bps=down_bps)
    planner.observe_candidates(4, 4 * 90)
    planner.observe_fallback(9000)
    for beta in (0.1, 0.3, 0.6):
        planner.observe_position(beta)
    return planner


def test_a_long_round_trip_on_a_fast_link_takes_many_candidates_and_one_set() -> None:
    planner = _planner(rtt=0.3, up_bps=1e7, down_bps=1e7)
    assert planner.replan() == (16, 1)
    assert planner.history == [(4, 2), (16, 1)]


def test_a_slow_uplink_takes_more_sets_before_the_fallback() -> None:
    # the fallback's 9000 bits take 0.9 s up; a set of candidates costs a 20 ms trip
    planner = _planner(rtt=0.02, up_bps=1e4, down_bps=1e7)
    k, m = planner.replan()
    assert m == 8 and k == 16


def test_a_slow_downlink_takes_fewer_candidates_per_set() -> None:
    # each 90-bit candidate costs 9 ms on the verdict: a 20 ms trip is cheaper
    planner = _planner(rtt=0.02, up_bps=1e4, down_bps=1e4)
    k, m = planner.replan()
    assert k < 8 and m >= 2


def test_the_plan_holds_unless_another_is_clearly_faster() -> None:
    planner = _planner(rtt=0.02, up_bps=1e4, down_bps=1e7)
    best = planner.replan()
    costs = planner.link.costs()

    def seconds(plan: tuple[int, int]) -> float:
        return resolution_seconds(
            *plan, list(planner.betas), costs, candidate_bits=90, fallback_bits=9000
        )  # fmt: skip

    close = next(
        (k, m)
        for k in range(1, 17)
        for m in range(1, 9)
        if (k, m) != best and seconds((k, m)) < seconds(best) / (1 - SWITCH_GAIN)
    )
    planner.k, planner.m = close
    assert planner.replan() == close  # within the switch gain: no change
    planner.k, planner.m = 1, 1
    assert seconds((1, 1)) > seconds(best) / (1 - SWITCH_GAIN)
    assert planner.replan() == best


def test_a_fixed_k_or_m_is_held() -> None:
    assert _planner(rtt=0.3, up_bps=1e7, down_bps=1e7, adapt_k=False).replan() == (4, 1)
    assert _planner(rtt=0.3, up_bps=1e7, down_bps=1e7, adapt_m=False).replan() == (16, 2)


def test_a_start_outside_the_caps_is_refused() -> None:
    with pytest.raises(ValueError, match="within"):
        CandidatePlanner(5, 2, k_max=4, m_max=8)


# ============================================================================ settings


def test_auto_sets_the_cap_and_the_switch() -> None:
    auto = GenerationSettings(srdv_k="auto", srdv_m="auto")
    assert (auto.srdv_k, auto.srdv_m, auto.adaptive_srdv_k, auto.adaptive_srdv_m) == (
        16,
        8,
        True,
        True,
    )
    assert auto.srdv_start == (4, 2)
    assert GenerationSettings(srdv_k=2, srdv_m="auto").srdv_start == (2, 2)
    assert GenerationSettings(srdv_k=7, srdv_m=3).srdv_start == (7, 3)
    with pytest.raises(ValueError, match="srdv_k"):
        GenerationSettings(srdv_k="often")


@pytest.mark.parametrize("method", ["xcosd", "acespec", "sd"])
def test_a_method_without_candidate_sets_refuses_auto(hetero_world: World, method: str) -> None:
    world = hetero_world if method == "xcosd" else World(shared=True)
    with pytest.raises(ValueError, match="srdv_m 'auto' needs a method that resolves"):
        world.edge(method, srdv_m="auto")


# ============================================================================ the machines


def _rejection(world: World, first: int | None = None, **settings: Any) -> tuple:
    """A cloud that has just answered a draft rejected at once (after `FirstCandidates(first)`,
    if given); the cloud and its verdict."""
    cloud, run = world.ready_cloud("xcosd-e", max_new_tokens=20, gamma=2, **settings)
    if first is not None:
        assert deliver(cloud, wire.FirstCandidates(first)) == []
    target = world.target
    target.reset()
    logits = target.extend(PROMPT_IDS)[-1].numpy()
    target.reset()
    common = world.alignment.common_target_ids
    impossible = int(common[np.argmin(logits[common])])
    (verify,) = deliver(cloud, wire.Draft(0, 0, (), (impossible,), (65535,)))
    (reply,) = cloud.handle(ComputeDone(verify.job_id, run(verify.job)))
    assert reply.msg.accepted == 0
    return cloud, reply.msg


@pytest.mark.parametrize("k", [1, 7, 16])
def test_the_first_set_has_the_k_the_edge_set(hetero_world: World, k: int) -> None:
    _, verdict = _rejection(hetero_world, srdv_k="auto", first=k)
    assert len(verdict.candidates) == k


def test_the_first_set_starts_at_the_default_k(hetero_world: World) -> None:
    _, verdict = _rejection(hetero_world, srdv_k="auto")
    assert len(verdict.candidates) == 4


def test_later_sets_have_the_k_each_request_asks(hetero_world: World) -> None:
    cloud, _ = _rejection(hetero_world, srdv_k="auto", srdv_m="auto")
    for k in (3, 16):
        (more,) = deliver(cloud, wire.CandidatesRequest(0, k))
        assert len(more.msg.candidates) == k
    reason = "17 candidates asked for, but the request's srdv_k allows at most 16"
    assert refusal(deliver(cloud, wire.CandidatesRequest(0, 17))) == (ErrorCode.LIMIT, reason)


def test_first_candidates_is_refused_where_k_is_fixed_or_past_the_cap(
    hetero_world: World,
) -> None:
    cloud, _ = hetero_world.ready_cloud("xcosd-e", srdv_k=4, srdv_m="auto")
    reason = "FirstCandidates, but this request does not choose SR-DV's K online"
    assert refusal(deliver(cloud, wire.FirstCandidates(2))) == (ErrorCode.PROTOCOL, reason)
    cloud, _ = hetero_world.ready_cloud("xcosd-e", srdv_k=6, adaptive_srdv_k=True)
    reason = "a first candidate set of 7, but the request's srdv_k allows at most 6"
    assert refusal(deliver(cloud, wire.FirstCandidates(7))) == (ErrorCode.LIMIT, reason)


def test_the_edge_sends_first_candidates_before_the_draft_it_applies_to(
    hetero_world: World,
) -> None:
    edge = hetero_world.edge("xcosd-e", srdv_k="auto", max_new_tokens=8)
    edge.candidates.k = 9  # as a replan would leave it
    edge.round.tokens, edge.round.probs = [5], [65535]
    edge.round.dists = []
    sends = [a.msg for a in edge._upload() if isinstance(a, Send)]
    assert [type(m) for m in sends] == [wire.FirstCandidates, wire.Draft]
    assert sends[0].k == 9 and edge.first_k == 9
    assert [type(a.msg) for a in edge._upload()] == [wire.Draft]  # unchanged: not again


# ============================================================================ on the simulator


@pytest.fixture(scope="module")
def choice_world() -> World:
    return small_residual_world()


@pytest.mark.parametrize(
    ("link", "wanted"),
    [
        (Link(bandwidth_bps=1e7, rtt_s=0.2), lambda k, m: k == 16 and m <= 2),
        (Link(bandwidth_bps=1e8, rtt_s=0.05), lambda k, m: k == 16 and m <= 2),
    ],
    ids=["long-rtt", "fast"],
)
def test_on_the_simulator_the_plan_follows_the_link(
    choice_world: World, link: Link, wanted: Any
) -> None:
    for seed in range(2):
        sim, edge, cloud = choice_world.run(
            "xcosd-e", link=link, seed=seed, max_new_tokens=120, temperature=1.0, gamma=4,
            srdv_k="auto", srdv_m="auto",
        )  # fmt: skip
        assert len(sim.tokens) == 120, sim.finish_reason
        planner = edge.candidates
        assert wanted(planner.k, planner.m), planner.history
        costs = planner.link.costs()
        assert costs.trip_s == pytest.approx(link.rtt_s, rel=0.05)
        # every change of K reached the cloud, and every set it sent was counted
        assert cloud.counters["first_candidates_set"] == edge.counters["first_candidates_set"] > 0
        assert edge.counters["srdv_candidates"] >= edge.counters["srdv_candidate_rounds"]
