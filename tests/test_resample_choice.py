"""The pure policy that picks HR or SR-DV per round (`wanspec.protocols.resample_choice`).

Fed costs by hand: the start on SR-DV, the cheaper mechanism taken after a trial, hysteresis
against a small gain, the two gates on a trial (the incumbent's rounds and its cost since the
last trial), the gap's doubling and reset, each mechanism's trial length, the EWMA, a switch
when the link changes, a driver without a clock, and input it must refuse.
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


def _trials(picked: list, incumbent: Mechanism) -> list[int]:
    """The indices at which a trial of the other mechanism starts."""
    return [
        i
        for i, m in enumerate(picked)
        if m is not incumbent and (i == 0 or picked[i - 1] is incumbent)
    ]


def test_it_starts_on_srdv_and_tries_hr_only_after_first_retry_rounds() -> None:
    """No forced warm-up of HR: its cost is unbounded in the link rate."""
    chooser = MechanismChooser()
    assert chooser.first_retry == 16 and chooser.current is SRDV
    picked = _feed(chooser, {SRDV: 1.0, HR: 100.0}, 16 + 1 + 5)
    assert picked == [SRDV] * 16 + [HR] + [SRDV] * 5
    assert chooser.current is SRDV and chooser.mean == {SRDV: 1.0, HR: 100.0}


def test_the_fallback_is_where_it_starts() -> None:
    chooser = MechanismChooser(fallback=HR, first_retry=3)
    assert _feed(chooser, {SRDV: 5.0, HR: 1.0}, 3 + 2 + 1) == [HR] * 3 + [SRDV] * 2 + [HR]


@pytest.mark.parametrize(("start", "cheaper"), [(SRDV, HR), (HR, SRDV)])
def test_the_cheaper_takes_over_after_its_trial(start: Mechanism, cheaper: Mechanism) -> None:
    chooser = MechanismChooser(fallback=start, first_retry=4)
    cost = {start: 2.0, cheaper: 1.0}
    picked = _feed(chooser, cost, 4 + chooser.trials[cheaper] + 3)
    assert picked[:4] == [start] * 4 and picked[4:] == [cheaper] * (chooser.trials[cheaper] + 3)
    assert chooser.current is cheaper and chooser.switches == 1
    assert chooser.since_trial == 3 and chooser.gap == 4


def test_fully_accepted_rounds_are_not_fed_so_a_choice_repeats_until_a_rejection() -> None:
    chooser = MechanismChooser(first_retry=1, fallback=HR)
    assert [chooser.choose() for _ in range(5)] == [HR] * 5
    chooser.observe(HR, 1.0)
    assert [chooser.choose() for _ in range(5)] == [SRDV] * 5
    chooser.observe(SRDV, 3.0)  # one of SR-DV's two trial rounds: the trial goes on
    assert [chooser.choose() for _ in range(5)] == [SRDV] * 5
    chooser.observe(SRDV, 3.0)
    assert chooser.choose() is HR


def test_a_small_gain_does_not_switch_but_a_clear_one_does() -> None:
    chooser = MechanismChooser(first_retry=4, margin=0.10)
    _feed(chooser, {SRDV: 1.0, HR: 0.91}, 4 + 1)  # 9 % cheaper: within the margin
    assert chooser.current is SRDV and chooser.switches == 0 and chooser.gap == 8
    _feed(chooser, {SRDV: 1.0, HR: 0.89}, 8 + 1)  # 11 % cheaper: switch, gap reset
    assert chooser.current is HR and chooser.switches == 1 and chooser.gap == 4


def test_the_round_count_gate_waits_gap_rounds_doubling_and_resets_on_a_switch() -> None:
    """With the cost gate open (explore_ratio 0), trials start after 4, 8, 16 rejected rounds
    of the incumbent; a switch brings the gap back to 4."""
    chooser = MechanismChooser(first_retry=4, explore_ratio=0)
    picked = _feed(chooser, {SRDV: 1.0, HR: 3.0}, 4 + 1 + 8 + 1 + 16 + 1 + 3)
    assert _trials(picked, SRDV) == [4, 4 + 1 + 8, 4 + 1 + 8 + 1 + 16]
    assert chooser.gap == 32 and chooser.switches == 0
    picked = _feed(chooser, {SRDV: 1.0, HR: 0.5}, 29 + 1 + 4 + 2 + 8)
    assert picked == [SRDV] * 29 + [HR] * (1 + 4) + [SRDV] * 2 + [HR] * 8
    assert chooser.current is HR and chooser.switches == 1
    assert chooser.gap == 8  # reset to 4 by the switch, doubled by SR-DV's lost trial


def test_the_cost_gate_waits_until_the_incumbent_spent_explore_ratio_times_a_trial() -> None:
    """HR measured 10× costlier than SR-DV: a trial of it (one round, 10 s) waits until SR-DV
    has spent 4 × 10 s since the last trial, not only the gap's rounds."""
    chooser = MechanismChooser(first_retry=2, explore_ratio=4)
    picked = _feed(chooser, {SRDV: 1.0, HR: 10.0}, 2 + 1 + 40 + 1 + 40 + 1)
    assert _trials(picked, SRDV) == [2, 2 + 1 + 40, 2 + 1 + 40 + 1 + 40]
    assert chooser.gap == 16  # the round gate (4, 8) was open long before


def test_a_predicted_cost_gates_the_first_trial_until_a_measured_one_replaces_it() -> None:
    """HR predicted at 10 s from the link: its first trial waits until SR-DV has spent 40 s, not
    only the 2 rounds of the gap; once measured (at 1 s) the prediction no longer counts."""
    chooser = MechanismChooser(first_retry=2, explore_ratio=4)
    chooser.predict(HR, 10.0)
    picked = _feed(chooser, {SRDV: 1.0, HR: 1.0}, 40 + 1)
    assert _trials(picked, SRDV) == [40]
    assert chooser.mean[HR] == 1.0 and chooser.trial_cost() == 1.0
    with pytest.raises(ValueError, match="finite"):
        chooser.predict(HR, math.inf)


def test_the_cost_gate_counts_the_trial_length_of_srdv() -> None:
    """SR-DV measured 10× costlier than HR: its two-round trial is expected to cost 20, so HR
    spends 4 × 20 before it."""
    chooser = MechanismChooser(first_retry=1, fallback=HR, explore_ratio=4)
    picked = _feed(chooser, {HR: 1.0, SRDV: 10.0}, 1 + 2 + 80 + 2 + 1)
    assert _trials(picked, HR) == [1, 1 + 2 + 80]


def test_time_spent_trying_a_much_worse_mechanism_is_bounded_by_the_explore_ratio() -> None:
    chooser = MechanismChooser(explore_ratio=4)
    cost = {SRDV: 0.05, HR: 10.0}  # HR at a slow link
    picked = _feed(chooser, cost, 2000)
    assert picked[16] is HR and picked.count(HR) == 3  # the first trial, on rounds alone
    after = picked[17:]
    spent = {m: after.count(m) * cost[m] for m in Mechanism}
    assert spent[HR] / (spent[HR] + spent[SRDV]) <= 1 / (1 + 4), spent


def test_hr_is_tried_for_one_round_and_srdv_for_two_with_a_plain_mean() -> None:
    chooser = MechanismChooser(first_retry=2, explore_ratio=0)
    assert chooser.trials == {HR: 1, SRDV: 2}
    assert _feed(chooser, {SRDV: 2.0, HR: 1.0}, 2 + 1) == [SRDV, SRDV, HR]
    assert chooser.current is HR and chooser.mean[HR] == 1.0
    _feed(chooser, {HR: 1.0}, 2)
    assert _feed(chooser, {SRDV: 3.0}, 1) == [SRDV] and chooser.mean[SRDV] == 2.0  # trial on
    assert _feed(chooser, {SRDV: 5.0}, 1) == [SRDV] and chooser.mean[SRDV] == 4.0  # plain mean
    assert chooser.choose() is HR and chooser.gap == 4


def test_trial_lengths_can_be_set() -> None:
    chooser = MechanismChooser(first_retry=1, trials={HR: 3, SRDV: 1})
    assert _feed(chooser, {SRDV: 1.0, HR: 2.0}, 1 + 3 + 2) == [SRDV] + [HR] * 3 + [SRDV] * 2


def test_a_link_that_changes_is_followed_both_ways() -> None:
    """Slow link: SR-DV costs less; fast link with a long RTT: HR does. The chooser follows
    each change by the end of the gap it had reached, and mostly runs the cheaper mechanism."""
    chooser = MechanismChooser()
    slow, fast = {HR: 0.30, SRDV: 0.12}, {HR: 0.20, SRDV: 0.40}
    for cost, best in ((slow, SRDV), (fast, HR), (slow, SRDV)):
        wait = max(chooser.gap - chooser.since_trial, 0) + chooser.trials[best]
        picked, incumbents = [], []
        for _ in range(300):
            picked += _feed(chooser, cost, 1)
            incumbents.append(chooser.current)
        assert incumbents.index(best) < wait and set(incumbents[wait:]) == {best}
        assert picked[-100:].count(best) >= 95


def test_the_incumbents_mean_is_an_ewma_seeded_by_its_first_observation() -> None:
    chooser = MechanismChooser(weight=0.25)
    chooser.observe(SRDV, 3.0)
    assert chooser.mean == {SRDV: 3.0}
    chooser.observe(SRDV, 1.0)
    assert chooser.mean[SRDV] == pytest.approx(2.5)
    assert chooser.spent == 4.0 and chooser.since_trial == 2


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
    chooser = MechanismChooser(first_retry=1, fallback=HR)
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
    chooser = MechanismChooser()
    with pytest.raises(error):
        chooser.observe(mechanism, seconds)
    assert chooser.seen == {HR: 0, SRDV: 0} and chooser.mean == {} and not chooser.clockless
    assert chooser.trying == [] and chooser.spent == 0


@pytest.mark.parametrize(
    "settings",
    [
        {"trials": {HR: 0, SRDV: 2}},
        {"trials": {HR: 1, SRDV: 1.5}},
        {"trials": {HR: 1, SRDV: True}},
        {"trials": {HR: 1}},
        {"trials": {HR: 1, SRDV: 2, "neither": 1}},
        {"weight": 0.0},
        {"weight": 1.5},
        {"margin": -0.1},
        {"margin": 1.0},
        {"first_retry": 0},
        {"explore_ratio": -1},
        {"explore_ratio": math.inf},
        {"explore_ratio": math.nan},
        {"fallback": "neither"},
    ],
)
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(ValueError):
        MechanismChooser(**settings)


def test_zero_cost_rounds_are_valid() -> None:
    """A link with no delay and compute at no cost: every round costs 0; a tie keeps SR-DV."""
    chooser = MechanismChooser()
    picked = _feed(chooser, {HR: 0.0, SRDV: 0.0}, 60)
    assert chooser.current is SRDV and chooser.switches == 0 and picked.count(HR) == 2
