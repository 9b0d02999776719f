"""The one link model (`wanspec.link`): its rules one by one, and the simulator's channel and the
WAN proxy's shaper giving the same times for the same traffic."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from wanspec.link import MSS, DirectionSpec, Shaper, Slot, failures, segments
from wanspec.net.shaping import link_specs
from wanspec.sim import Link

DIRECTIONS = {"up": 0, "down": 1}


def _traffic(n: int, seed: int) -> list[tuple[float, int]]:
    """(send time, bytes): bursts that queue, idle gaps, empty and multi-segment messages."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += float(rng.exponential(0.02)) if rng.random() < 0.6 else 0.0
        size = int(rng.choice([0, 1, 40, MSS, MSS + 1, 5 * MSS, 20_000]))
        out.append((t, size))
    return out


def _slots(shaper: Shaper, traffic: list[tuple[float, int]]) -> list[Slot]:
    return [shaper.admit(t, nbytes) for t, nbytes in traffic]


# ----------------------------------------------------------------------------- one model, two users
@pytest.mark.parametrize("direction", ["up", "down"])
def test_simulator_channel_and_proxy_shaper_give_the_same_times(direction: str) -> None:
    link = Link(
        bandwidth_bps=2e6,
        uplink_bps=3e5,
        rtt_s=0.04,
        jitter_s=0.015,
        loss=0.2,
        retransmit_s=0.07,
        seed=11,
    )
    rate = 3e5 if direction == "up" else 2e6
    spec = DirectionSpec(rate_bps=rate, delay_s=0.02, jitter_s=0.015, loss=0.2, rto_s=0.07)
    assert link_specs(link)[DIRECTIONS[direction]] == spec  # the proxy's view of this link
    shaper = Shaper(spec, seed=[11, DIRECTIONS[direction]])
    channel = link.channel(direction)
    traffic = _traffic(3000, seed=5)
    sim = [channel.transmit(t, 8 * nbytes) for t, nbytes in traffic]
    proxy = _slots(shaper, traffic)
    assert [(s.start, s.sent, s.arrival, s.retries) for s in sim] == [
        (p.start, p.sent, p.deliver, p.retries) for p in proxy
    ]
    retries = np.array([s.retries for s in sim])
    queued = sum(s.start > t for s, (t, _) in zip(sim, traffic, strict=True))
    held = sum(b.arrival == a.arrival for a, b in itertools.pairwise(sim))
    assert retries.max() >= 2 and (retries > 0).mean() > 0.1  # loss really was on
    assert queued > 300 and held > 100  # FIFO queueing and head-of-line blocking happened


# ----------------------------------------------------------------------------- serialisation
def test_fifo_serialisation_at_the_rate_and_no_debt_after_idle() -> None:
    shaper = Shaper(DirectionSpec(rate_bps=1e6, delay_s=0.01))
    slots = [shaper.admit_bits(0.0, bits) for bits in (10_000, 5_000, 3)]
    assert [s.start for s in slots] == pytest.approx([0.0, 0.010, 0.015], abs=1e-12)
    assert [s.sent for s in slots] == pytest.approx([0.010, 0.015, 0.015003], abs=1e-12)
    assert [s.deliver for s in slots] == pytest.approx([0.020, 0.025, 0.025003], abs=1e-12)
    idle = shaper.admit(5.0, 125)
    assert (idle.start, idle.sent, idle.deliver) == pytest.approx((5.0, 5.001, 5.011))
    assert Shaper(DirectionSpec(rate_bps=1e6)).admit(0.0, 125) == Shaper(
        DirectionSpec(rate_bps=1e6)
    ).admit_bits(0.0, 1000)


def test_infinite_rate_serialises_nothing_but_still_loses_segments() -> None:
    shaper = Shaper(DirectionSpec(delay_s=0.05, loss=0.01), seed=2)
    slots = [shaper.admit(t * 1.0, 10**6) for t in range(300)]  # 691 segments each
    assert all(s.start == s.sent == t * 1.0 for t, s in enumerate(slots))
    assert all(s.deliver == t * 1.0 + 0.05 + s.retries * 0.1 for t, s in enumerate(slots))
    hit = np.mean([s.retries > 0 for s in slots])
    assert hit == pytest.approx(1 - 0.99 ** segments(10**6), abs=0.01)  # ≈ 0.999


# ----------------------------------------------------------------------------- jitter and order
def test_jitter_is_half_normal_and_never_reorders() -> None:
    spec = DirectionSpec(rate_bps=1e7, delay_s=0.02, jitter_s=0.01)
    sparse = _slots(Shaper(spec, seed=1), [(t, 100) for t in range(5000)])
    extra = np.array([s.deliver - s.sent - 0.02 for s in sparse])
    assert extra.min() >= -1e-12
    assert extra.mean() == pytest.approx(0.01 * math.sqrt(2 / math.pi), rel=0.05)
    dense = _slots(Shaper(spec, seed=1), [(k * 2e-4, 100) for k in range(5000)])
    jitter_stream = np.random.default_rng(np.random.SeedSequence(1).spawn(2)[0])
    jitter = np.abs(jitter_stream.standard_normal(5000)) * 0.01  # the first stream: jitter
    arrivals = np.array([s.sent for s in dense]) + 0.02 + jitter
    deliveries = np.array([s.deliver for s in dense])
    assert np.all(np.diff(deliveries) >= 0)  # in order ...
    assert (deliveries > arrivals).sum() > 500  # ... though many would have overtaken
    assert np.array_equal(deliveries, np.maximum.accumulate(arrivals))  # held back, no more


# ----------------------------------------------------------------------------- loss
def test_each_failed_attempt_costs_one_rto_and_no_reserialisation() -> None:
    spec = DirectionSpec(rate_bps=1e5, delay_s=0.01, loss=0.3, rto_s=0.05)  # MSS: 116 ms to send
    slots = _slots(Shaper(spec, seed=4), [(t * 10.0, MSS) for t in range(20_000)])
    retries = np.array([s.retries for s in slots])
    waits = np.array([s.deliver - s.sent - 0.01 for s in slots])
    assert waits == pytest.approx(retries * 0.05, abs=1e-9)
    for k in (1, 2, 3):  # one segment: P(retries >= k) = loss^k
        assert (retries >= k).mean() == pytest.approx(0.3**k, abs=4 * math.sqrt(0.3**k / 20_000))


def test_a_large_message_waits_for_its_unluckiest_segment() -> None:
    loss, n = 0.05, 12
    spec = DirectionSpec(delay_s=0.01, loss=loss)
    retries = np.array([s.retries for s in _slots(Shaper(spec, seed=6), [(0.0, n * MSS)] * 20_000)])
    for k in (1, 2):  # the maximum of n independent geometrics
        expected = 1 - (1 - loss**k) ** n
        assert (retries >= k).mean() == pytest.approx(
            expected, abs=4 * math.sqrt(expected / 20_000)
        )


def test_loss_draws_one_uniform_per_segment_from_its_own_stream() -> None:
    """The retries are exactly the inversion of the largest of a message's segment uniforms,
    drawn from the second stream spawned from the seed: pins segment counting (bits → bytes →
    MSS) and the stream layout."""
    loss, seed = 0.4, [7, 1]
    replica = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
    shaper = Shaper(DirectionSpec(delay_s=0.01, loss=loss), seed=seed)
    sizes = [0, 1, 7, 8, 8 * MSS, 8 * MSS + 1, 8 * 3 * MSS, 123_457] * 50
    for bits in sizes:
        nsegments = -(-bits // (8 * MSS))
        expected = failures(float(replica.random(nsegments).max()), loss) if nsegments else 0
        assert shaper.admit_bits(0.0, bits).retries == expected, bits


def test_loss_on_leaves_the_jitter_draws_unchanged() -> None:
    def deliveries(loss: float) -> list[Slot]:
        spec = DirectionSpec(rate_bps=1e6, delay_s=0.01, jitter_s=0.005, loss=loss, rto_s=0.3)
        return _slots(Shaper(spec, seed=[3, 0]), [(t * 10.0, 4 * MSS) for t in range(2000)])

    lossy, clean = deliveries(0.3), deliveries(0.0)
    assert sum(s.retries > 0 for s in lossy) > 500
    for a, b in zip(lossy, clean, strict=True):
        assert a.deliver == pytest.approx(b.deliver + a.retries * 0.3, abs=1e-9)


def test_geometric_inversion() -> None:
    assert failures(0.999, 0.0) == 0
    assert [failures(u, 0.5) for u in (0.0, 0.49, 0.5, 0.74, 0.75, 0.9)] == [0, 0, 1, 1, 2, 3]
    u = np.random.default_rng(0).random(50_000)
    drawn = np.array([failures(float(x), 0.2) for x in u])
    assert drawn.mean() == pytest.approx(0.2 / 0.8, abs=0.01)


# ----------------------------------------------------------------------------- seeding and settings
def test_seeded_streams_are_reproducible_and_per_direction() -> None:
    link = Link(1e6, rtt_s=0.05, jitter_s=0.01, loss=0.2, seed=3)
    traffic = [(t * 1e-3, 3 * MSS) for t in range(500)]

    def run(direction: str) -> list[tuple[float, int]]:
        channel = link.channel(direction)
        return [(tx.arrival, tx.retries) for tx in (channel.transmit(t, 8 * b) for t, b in traffic)]

    assert run("up") == run("up") and run("up") != run("down")


def test_link_spec_is_the_links_direction() -> None:
    link = Link(1e6, rtt_s=0.08, jitter_s=0.002, loss=0.01, downlink_bps=5e6)
    up, down = link_specs(link)
    assert (up.rate_bps, down.rate_bps, up.delay_s, up.jitter_s, up.loss) == (
        1e6,
        5e6,
        0.04,
        0.002,
        0.01,
    )
    assert up.timeout_s == link.timeout_s == 0.08
    assert Link(1e6, rtt_s=0.08, retransmit_s=0.3).spec("down").timeout_s == 0.3
    with pytest.raises(ValueError, match="direction"):
        link.spec("sideways")
