"""The pure policy that picks HR or SR-DV per round (`wanspec.protocols.resample_choice`).

Fed costs by hand: the warm-up order, the cheaper mechanism kept, hysteresis against a small
gain, the geometric re-try schedule, a switch when the link changes, a driver without a clock,
and input it must refuse.
"""

from __future__ import annotations

import math

import pytest

from wanspec.protocols.resample_choice import Mechanism, MechanismChooser

HR, SRDV = Mechanism.HR, Mechanism.SRDV


def _feed(chooser: MechanismChooser, cost: dict[Mechanism, float], rounds: int) -> list:
    """`rounds` rejected rounds, each resolved by what the chooser picks at the cost `cost`
    gives that mechanism; the mechanisms picked, in order."""
    picked = []
    for _ in range(rounds):
        mechanism = chooser.choose()
        picked.append(mechanism)
        chooser.observe(mechanism, cost[mechanism])
    return picked


def test_the_warm_up_tries_srdv_then_hr_then_keeps_the_cheaper() -> None:
    for cheaper, dearer in ((HR, SRDV), (SRDV, HR)):
        chooser = MechanismChooser(trial=2)
        picked = _feed(chooser, {cheaper: 1.0, dearer: 2.0}, 4 + 7)
        assert picked[:4] == [SRDV, SRDV, HR, HR]
        assert picked[4:] == [cheaper] * 7 and chooser.current is cheaper
        assert chooser.mean == {cheaper: 1.0, dearer: 2.0}


def test_fully_accepted_rounds_are_not_fed_so_a_choice_repeats_until_a_rejection() -> None:
    chooser = MechanismChooser(trial=1)
    assert [chooser.choose() for _ in range(5)] == [SRDV] * 5
    chooser.observe(SRDV, 1.0)
    assert [chooser.choose() for _ in range(5)] == [HR] * 5


def test_the_other_mechanism_is_re_tried_after_8_16_32_rounds_of_the_incumbent() -> None:
    chooser = MechanismChooser(trial=1, first_retry=8)
    picked = _feed(chooser, {HR: 1.0, SRDV: 3.0}, 2 + 8 + 1 + 16 + 1 + 32 + 1 + 5)
    retries = [i for i, m in enumerate(picked) if m is SRDV][1:]  # after the warm-up's
    assert retries == [2 + 8, 2 + 8 + 1 + 16, 2 + 8 + 1 + 16 + 1 + 32]
    assert chooser.gap == 64 and chooser.switches == 0 and chooser.current is HR


def test_a_re_try_takes_trial_rounds_and_replaces_the_stale_mean() -> None:
    chooser = MechanismChooser(trial=3, first_retry=2)
    _feed(chooser, {HR: 1.0, SRDV: 3.0}, 6 + 2)
    assert chooser.mean[SRDV] == 3.0
    picked = _feed(chooser, {HR: 1.0, SRDV: 5.0}, 3)
    assert picked == [SRDV] * 3 and chooser.mean[SRDV] == 5.0  # plain mean, the old 3.0 gone
    assert chooser.choose() is HR and chooser.gap == 4


def test_a_small_gain_does_not_switch_but_a_clear_one_does() -> None:
    chooser = MechanismChooser(trial=1, first_retry=4, margin=0.10)
    _feed(chooser, {HR: 1.0, SRDV: 2.0}, 2 + 4)  # HR the incumbent, mean 1.0
    _feed(chooser, {HR: 1.0, SRDV: 0.91}, 1)  # 9 % cheaper: within the margin
    assert chooser.current is HR and chooser.switches == 0 and chooser.gap == 8
    _feed(chooser, {HR: 1.0, SRDV: 0.89}, 8 + 1)  # 11 % cheaper: switch, wait reset
    assert chooser.current is SRDV and chooser.switches == 1 and chooser.gap == 4


def test_a_link_that_changes_is_followed_both_ways() -> None:
    """Slow link: SR-DV costs less; fast link with a long RTT: HR does. The chooser follows
    each change within a re-try period, and mostly runs the cheaper mechanism."""
    chooser = MechanismChooser()
    slow, fast = {HR: 0.30, SRDV: 0.12}, {HR: 0.20, SRDV: 0.40}
    for cost, best in ((slow, SRDV), (fast, HR), (slow, SRDV)):
        picked = _feed(chooser, cost, 60)
        assert chooser.current is best
        assert picked[-30:].count(best) >= 26


def test_the_mean_of_the_incumbent_moves_by_its_weight() -> None:
    chooser = MechanismChooser(trial=1, weight=0.25)
    _feed(chooser, {HR: 1.0, SRDV: 4.0}, 2)
    chooser.observe(HR, 3.0)
    assert chooser.mean[HR] == pytest.approx(1.5)


def test_without_clock_stamps_it_keeps_srdv_and_never_switches() -> None:
    chooser = MechanismChooser()
    for _ in range(50):
        mechanism = chooser.choose()
        assert mechanism is SRDV
        chooser.observe(mechanism, None)
    assert chooser.clockless and chooser.mean == {} and chooser.switches == 0
    chooser.observe(HR, 0.001)  # a stamp later changes nothing: the run has no clock
    assert chooser.choose() is SRDV and chooser.mean == {}


def test_a_clock_lost_mid_run_freezes_on_the_fallback() -> None:
    chooser = MechanismChooser(trial=1, fallback=HR)
    _feed(chooser, {HR: 2.0, SRDV: 1.0}, 3)
    assert chooser.current is SRDV
    chooser.observe(SRDV, None)
    assert [chooser.choose() for _ in range(3)] == [HR] * 3


@pytest.mark.parametrize(
    ("mechanism", "seconds", "error"),
    [
        ("hr", 1.0, TypeError),
        (None, 1.0, TypeError),
        (HR, -0.5, ValueError),
        (HR, math.nan, ValueError),
        (HR, math.inf, ValueError),
        (HR, "1.0", TypeError),
        (HR, True, TypeError),
    ],
)
def test_bad_observations_are_refused_and_change_nothing(mechanism, seconds, error) -> None:
    chooser = MechanismChooser(trial=1)
    with pytest.raises(error):
        chooser.observe(mechanism, seconds)
    assert chooser.seen == {HR: 0, SRDV: 0} and chooser.mean == {} and not chooser.clockless


@pytest.mark.parametrize(
    "settings",
    [
        {"trial": 0},
        {"trial": 1.5},
        {"weight": 0.0},
        {"weight": 1.5},
        {"margin": -0.1},
        {"margin": 1.0},
        {"first_retry": 0},
        {"fallback": "neither"},
    ],
)
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(ValueError):
        MechanismChooser(**settings)


def test_zero_cost_rounds_are_valid() -> None:
    """A link with no delay and compute at no cost: every round costs 0; a tie keeps SR-DV."""
    chooser = MechanismChooser()
    picked = _feed(chooser, {HR: 0.0, SRDV: 0.0}, 30)
    assert chooser.current is SRDV and chooser.switches == 0 and picked.count(HR) == 2 + 2
