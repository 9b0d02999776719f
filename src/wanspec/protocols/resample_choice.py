"""Which X-CoSD mechanism resolves the next round's rejection: HR or SR-DV, from what each cost.

HR ships q over the common vocabulary at every rejection (bandwidth); SR-DV ships K candidates
and sometimes needs more round trips (latency). Which is cheaper depends on the link, so the
edge measures: it feeds the chooser, once per rejected round, the mechanism that round used and
the seconds from the round's draft leaving to its rejected position being resolved. A fully
accepted round costs both the same and is not fed. A pure policy: no clock, no I/O.

- Warm-up: SR-DV for the first `trial` rejected rounds, then HR for as many; then the cheaper.
- Then the incumbent's running mean (EWMA, `weight`) is compared with the other's; the other
  takes over only when its mean is lower by more than `margin` (hysteresis against noise: an
  SR-DV round costs one round trip or several, as its candidates fall).
- Re-try: after `first_retry` rejected rounds of the incumbent the other is used for `trial`
  rejected rounds, whose plain mean replaces its stale one; a re-try that does not win doubles
  the wait before the next (8, 16, 32 …), so a costly mechanism is rarely re-tried while a link
  that changes is still noticed; a switch resets the wait.
- Without clock stamps (a cost of None) there is nothing to compare: `fallback` for good.

The choice for a round is made before the round is drafted and depends only on earlier rounds,
so each round's law is its mechanism's own (both are exact).
"""

from __future__ import annotations

import enum
import math


class Mechanism(enum.StrEnum):
    """How a rejected position is resolved."""

    HR = "hr"  # q̂ over C and θ̂_o come down; the edge picks the region
    SRDV = "srdv"  # K candidates y ~ q with q(y) come down; the edge accepts one

    @property
    def other(self) -> Mechanism:
        return Mechanism.SRDV if self is Mechanism.HR else Mechanism.HR


WARMUP_ORDER = (Mechanism.SRDV, Mechanism.HR)


class MechanismChooser:
    """Chooses HR or SR-DV for each round from the measured cost of earlier rejected rounds."""

    def __init__(
        self,
        *,
        trial: int = 2,
        weight: float = 0.2,
        margin: float = 0.10,
        first_retry: int = 8,
        fallback: Mechanism = Mechanism.SRDV,
    ) -> None:
        if not (isinstance(trial, int) and trial >= 1):
            raise ValueError(f"trial must be a positive integer, got {trial!r}")
        if not (isinstance(weight, int | float) and 0.0 < weight <= 1.0):
            raise ValueError(f"weight must be in (0, 1], got {weight!r}")
        if not (isinstance(margin, int | float) and 0.0 <= margin < 1.0):
            raise ValueError(f"margin must be in [0, 1), got {margin!r}")
        if not (isinstance(first_retry, int) and first_retry >= 1):
            raise ValueError(f"first_retry must be a positive integer, got {first_retry!r}")
        self.trial, self.weight, self.margin = trial, weight, margin
        self.first_retry = first_retry
        self.fallback = Mechanism(fallback)
        self.mean: dict[Mechanism, float] = {}
        self.seen = dict.fromkeys(Mechanism, 0)  # rejected rounds observed per mechanism
        self.current: Mechanism | None = None  # the incumbent, once warmed up
        self.gap = first_retry  # the incumbent's rejected rounds before the other is re-tried
        self.since_retry = 0
        self.retried: list[float] = []  # the costs of the re-try under way
        self.clockless = False
        self.switches = 0

    def choose(self) -> Mechanism:
        """The mechanism for the next round."""
        if self.clockless:
            return self.fallback
        if self.current is None:
            return next(m for m in WARMUP_ORDER if self.seen[m] < self.trial)
        if self.since_retry >= self.gap:
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
        if self.current is None:  # warm-up: plain means
            old, n = self.mean.get(mechanism, 0.0), self.seen[mechanism]
            self.mean[mechanism] = old + (seconds - old) / n
            if all(self.seen[m] >= self.trial for m in Mechanism):
                self.current = min(WARMUP_ORDER, key=lambda m: self.mean[m])
        elif mechanism is self.current:
            self.mean[mechanism] += self.weight * (seconds - self.mean[mechanism])
            self.since_retry += 1
        else:
            self._retried(mechanism, float(seconds))

    def _retried(self, mechanism: Mechanism, seconds: float) -> None:
        """One rejected round of the re-tried mechanism; after `trial` of them, decide."""
        assert self.current is not None
        self.retried.append(seconds)
        if len(self.retried) < self.trial:
            return
        self.mean[mechanism] = sum(self.retried) / len(self.retried)  # the old mean is stale
        self.retried, self.since_retry = [], 0
        if self.mean[mechanism] < (1.0 - self.margin) * self.mean[self.current]:
            self.current, self.gap = mechanism, self.first_retry
            self.switches += 1
        else:
            self.gap *= 2
