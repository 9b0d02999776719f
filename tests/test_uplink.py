"""The edge's uplink model: the rate fitted from lone chains' windows behind its own sends, and
the room it leaves for forks before the next chain leaves."""

from __future__ import annotations

import math

import pytest

from wanspec.protocols.uplink import RATES_BPS, UplinkModel

STEP = math.log(RATES_BPS[1] / RATES_BPS[0])  # the grid's ratio between neighbouring rates


def _true_windows(rate: float, rest: float, model: UplinkModel) -> None:
    """Chains sent alone, some right behind a burst of forks: each window is its wait behind
    the burst, its own transmission and `rest`, exactly as an uplink of `rate` gives."""
    t = 0.0
    for burst, chain in [(0, 1_500), (12_000, 1_400), (0, 1_600), (30_000, 1_500), (4_000, 900)]:
        if burst:
            model.sent(t, burst)
        ticket = model.sent(t, chain)
        window = (burst + chain) / rate + rest
        model.answered(ticket, t, window)
        t += window + 1.0  # the link is idle again before the next chain


@pytest.mark.parametrize("rate", [5e4, 1e6, 2.3e7])
def test_the_rate_is_recovered_from_windows_behind_bursts(rate: float) -> None:
    model = UplinkModel()
    _true_windows(rate, 0.35, model)
    fitted = model.rate_bps()
    assert fitted is not None and abs(math.log(fitted / rate)) <= STEP / 2 + 1e-9


def test_nothing_is_known_before_two_windows() -> None:
    """One window fits every rate alike (its rest absorbs the transmission)."""
    model = UplinkModel()
    assert model.rate_bps() is None and model.room_bits(0.0, 1.0) is None
    model.answered(model.sent(0.0, 1_000), 0.0, 0.4)
    assert model.rate_bps() is None and model.room_bits(1.0, 1.0) is None


def test_windows_that_cannot_tell_rates_apart_give_the_slowest_they_allow() -> None:
    """Equal chains on an idle link fit every rate fast enough to send one within its window
    alike: the fit takes the slowest of those (what the windows show, at least), so it errs
    toward holding forks back. The fastest, once taken, flooded a 50 kbit/s uplink with forks,
    and the chains sent alone that could correct it then hardly came."""
    model = UplinkModel()
    for k in range(4):
        model.answered(model.sent(10.0 * k, 10_000), 10.0 * k, 0.05)
    assert model.rate_bps() == min(r for r in RATES_BPS if 10_000 / r <= 0.05)


@pytest.mark.parametrize("rate", [5e4, 1e6, 2.3e7])
def test_windows_behind_bursts_pin_the_rate_down(rate: float) -> None:
    model = UplinkModel()
    _true_windows(rate, 0.35, model)
    assert model.pinned_rate_bps() == model.rate_bps()


def test_small_chains_on_a_fast_link_leave_the_rate_unpinned() -> None:
    """Chains of a few hundred bits on a 100 Mbit/s link: their windows fit every rate down to
    the one that would fill a window alike, and the slowest of those (what forks are held to)
    is a thousandth of the link's. Priced at it, a chain's p̃ looked too dear to send, so no
    window ever carried enough bits to correct it: no rate is pinned down."""
    model, t = UplinkModel(), 0.0
    for bits, verdict in ((160, 64), (300, 320), (160, 64), (230, 320)):
        window = bits / 1e8 + 0.3 + verdict / 1e8
        model.answered(model.sent(t, bits), t, window, verdict_bits=verdict)
        t += 10.0
    slowest = model.rate_bps()
    assert slowest is not None and slowest < 1e6
    assert model.pinned_rate_bps() is None


def test_a_rate_that_would_make_a_window_too_short_is_never_fitted() -> None:
    """These two windows have equal rests only at ≈ 497 kbit/s, where the first chain's own
    transmission (2 ms) would outlast its window (1 ms): a negative rest rules that rate out."""
    model = UplinkModel()
    windows = [(1_000, 0.001), (100_000, 0.2)]
    for k, (bits, seconds) in enumerate(windows):
        model.answered(model.sent(10.0 * k, bits), 10.0 * k, seconds)
    fitted = model.rate_bps()
    assert fitted is not None
    assert all(bits / fitted <= seconds for bits, seconds in windows)


def test_a_faster_rate_that_fits_a_few_windows_by_chance_is_not_taken() -> None:
    """Three chains alone at 50 kbit/s; the third's verdict is a rejection's (320 bits, 5 ms
    more on the way down than a full acceptance's 64). A rate five times faster leaves the
    three rests nearly equal, and taken, it flooded that uplink with forks for seconds: within
    what the verdicts' sizes explain, the slower rate wins."""
    model, t = UplinkModel(), 0.0
    for bits, verdict in ((1_224, 64), (1_224, 64), (900, 320)):
        window = bits / 5e4 + 0.2 + verdict / 5e4
        model.answered(model.sent(t, bits), t, window, verdict_bits=verdict)
        t += 10.0
    fitted = model.rate_bps()
    assert fitted is not None and abs(math.log(fitted / 5e4)) <= STEP / 2 + 1e-9


def test_room_is_what_drains_by_the_deadline_behind_the_queue() -> None:
    model = UplinkModel()
    _true_windows(1e6, 0.35, model)
    rate = model.rate_bps()
    assert rate is not None
    t = 100.0  # the link idle: all of `within` is room
    assert model.room_bits(t, 0.2) == pytest.approx(rate * 0.2)
    model.sent(t, 50_000)  # now a backlog of 50 kbit
    assert model.room_bits(t, 0.2) == pytest.approx(max(0.0, rate * 0.2 - 50_000))
    assert model.room_bits(t, 0.01) == 0.0
