"""Which X-CoSD mechanism resolves the next round's rejection: HR or SR-DV, from what each cost.

HR ships q over the common vocabulary at every rejection (bandwidth: its cost grows without
bound as the link slows); SR-DV ships K candidates and sometimes needs more round trips
(latency: at worst M more). Which is cheaper depends on the link, so the edge measures: it feeds
the chooser, once per rejected round, the mechanism that round used and the seconds from the
round's draft leaving to its rejected position being resolved. A fully accepted round costs
both the same and is not fed. A pure policy: no clock, no I/O.

- Start on `fallback` (SR-DV), whose worst case is bounded; nothing is tried blindly at first.
- The incumbent's mean is an EWMA (`weight`) seeded by its first observation.
- Exploration is budgeted in cost, not rounds. The other mechanism is tried once both
  (a) the incumbent has had at least `gap` rejected rounds since the last trial (`gap` starts
  at `first_retry`, doubles after a trial that does not win, resets after a switch), and
  (b) the incumbent has spent at least `explore_ratio` × the trial's expected cost since the
  last trial, the expected cost being `trials[other] × mean[other]`; before the other was
  ever measured, its predicted cost from the link (`predict`: HR's q over C at the measured
  downlink rate), or 0 without one. Time spent trying a much worse mechanism is so about
  1/(1 + explore_ratio) of the run at most, however slow the link, and on a link where even
  the prediction is many times the incumbent's cost a short request never tries it.
- A trial is `trials[m]` rejected rounds of the other mechanism m: HR 1 (its cost is steady and
  may be huge), SR-DV 2 (one round trip or several: one sample misleads). Its plain mean
  replaces the other's stale one; the other takes over only when that is lower than the
  incumbent's mean by more than `margin` (hysteresis against noise).
- Without clock stamps (a cost of None) there is nothing to compare: `fallback` for good.

The choice for a round is made before the round is drafted and depends only on earlier rounds,
so each round's law is its mechanism's own (both are exact).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping


class Mechanism(enum.StrEnum):
    """How a rejected position is resolved."""

    HR = "hr"  # q̂ over C and θ̂_o come down; the edge picks the region
    SRDV = "srdv"  # K candidates y ~ q with q(y) come down; the edge accepts one

    @property
    def other(self) -> Mechanism:
        return Mechanism.SRDV if self is Mechanism.HR else Mechanism.HR


TRIAL_ROUNDS = {Mechanism.HR: 1, Mechanism.SRDV: 2}


class MechanismChooser:
    """Chooses HR or SR-DV for each round from the measured cost of earlier rejected rounds."""

    def __init__(
        self,
        *,
        trials: Mapping[Mechanism, int] | None = None,
        weight: float = 0.2,
        margin: float = 0.10,
        first_retry: int = 16,
        explore_ratio: float = 4.0,
        fallback: Mechanism = Mechanism.SRDV,
    ) -> None:
        trials = {Mechanism(m): n for m, n in (TRIAL_ROUNDS if trials is None else trials).items()}
        if set(trials) != set(Mechanism) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in trials.values()
        ):
            raise ValueError(f"trials must give each mechanism a positive integer, got {trials!r}")
        if not (isinstance(weight, int | float) and 0.0 < weight <= 1.0):
            raise ValueError(f"weight must be in (0, 1], got {weight!r}")
        if not (isinstance(margin, int | float) and 0.0 <= margin < 1.0):
            raise ValueError(f"margin must be in [0, 1), got {margin!r}")
        if not (isinstance(first_retry, int) and first_retry >= 1):
            raise ValueError(f"first_retry must be a positive integer, got {first_retry!r}")
        if not (
            isinstance(explore_ratio, int | float)
            and math.isfinite(explore_ratio)
            and explore_ratio >= 0
        ):
            raise ValueError(f"explore_ratio must be finite and >= 0, got {explore_ratio!r}")
        self.trials: dict[Mechanism, int] = trials
        self.weight, self.margin = weight, margin
        self.first_retry, self.explore_ratio = first_retry, explore_ratio
        self.fallback = Mechanism(fallback)
        self.current = self.fallback  # the incumbent
        self.mean: dict[Mechanism, float] = {}
        self.predicted: dict[Mechanism, float] = {}  # from the link, until measured
        self.seen = dict.fromkeys(Mechanism, 0)  # rejected rounds observed per mechanism
        self.gap = first_retry  # the incumbent's rejected rounds before the other is tried
        self.since_trial = 0  # the incumbent's rejected rounds since the last trial
        self.spent = 0.0  # and their summed cost
        self.trying: list[float] = []  # the costs of the trial under way
        self.clockless = False
        self.switches = 0

    def trial_cost(self) -> float:
        """The expected cost of a trial of the other mechanism: measured, else predicted, else
        0."""
        other = self.current.other
        return self.trials[other] * self.mean.get(other, self.predicted.get(other, 0.0))

    def predict(self, mechanism: Mechanism, seconds: float) -> None:
        """What a rejected round of `mechanism` should cost on the link as measured so far;
        it stands in for the mechanism's mean until a trial measures it."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be finite and non-negative, got {seconds!r}")
        self.predicted[Mechanism(mechanism)] = float(seconds)

    def choose(self) -> Mechanism:
        """The mechanism for the next round."""
        if self.clockless:
            return self.fallback
        # a trial under way keeps both gates open: the incumbent's rounds and spend are frozen
        if self.since_trial >= self.gap and self.spent >= self.explore_ratio * self.trial_cost():
            return self.current.other
        return self.current

    def observe(self, mechanism: Mechanism, seconds: float | None) -> None:
        """A rejected round resolved by `mechanism` took `seconds` from its draft's send to its
        resolution (None: the driver stamps no clock)."""
        if not isinstance(mechanism, Mechanism):
            raise TypeError(f"mechanism must be a Mechanism, got {mechanism!r}")
        if seconds is None:
            self.clockless = True
            return
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"seconds must be a number or None, got {seconds!r}")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be finite and non-negative, got {seconds!r}")
        if self.clockless:
            return
        self.seen[mechanism] += 1
        if mechanism is self.current:
            old = self.mean.get(mechanism)
            self.mean[mechanism] = seconds if old is None else old + self.weight * (seconds - old)
            self.since_trial += 1
            self.spent += seconds
        else:
            self._tried(mechanism, float(seconds))

    def _tried(self, mechanism: Mechanism, seconds: float) -> None:
        """One rejected round of the mechanism on trial; after `trials[mechanism]`, decide."""
        self.trying.append(seconds)
        if len(self.trying) < self.trials[mechanism]:
            return
        self.mean[mechanism] = sum(self.trying) / len(self.trying)  # the old mean is stale
        self.trying, self.since_trial, self.spent = [], 0, 0.0
        incumbent = self.mean.get(self.current)
        if incumbent is not None and self.mean[mechanism] < (1.0 - self.margin) * incumbent:
            self.current, self.gap = mechanism, self.first_retry
            self.switches += 1
        else:
            self.gap *= 2
