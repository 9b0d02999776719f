"""The uplink's rate as the edge sees it, and how many bits it can still carry before a deadline.

The edge knows every message it sent (when, how many bits) and, for a chain sent alone, when its
verdict came back. Under an uplink of rate r each message leaves once those before it have gone
out, so a chain's window is its wait behind earlier sends, its own transmission and a constant
rest (the round trip, the verification, the verdict's way down). The fitted r is the one under
which those rests vary least (`UplinkModel.rate_bps`), up to what the verdicts' sizes make them
vary on the way down, the slowest of those that fit alike. `deepspec-tree` sends a tree's forks
only while the uplink, at that rate, can carry them before the next chain leaves, so they never
delay it; it prices a chain's p̃ only at a rate the windows pin down (`pinned_rate_bps`).

Pure: times are the driver's clock, passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

RATES_BPS = np.geomspace(1e4, 1e11, 71)  # the rates tried: 10 kbit/s … 100 Gbit/s, ≈ 26 % apart
EXCHANGES = 32  # the windows kept
KNOWN_AFTER = 2  # windows before the fit is trusted: one window fits every rate alike
RELATIVE_SLACK = 1e-3  # rates fitting within this of the best count as ties (the slowest wins)
# the windows tell the rate apart only while the rates fitting them alike (the ties) span at most
# this factor: messages that take no measurable time at any rate tie every rate down to the
# slowest that leaves no window too short
PINNED_SPAN = 10.0


@dataclass
class UplinkModel:
    """What the edge sent and how its lone chains' windows came out (see the module docstring).

    Per rate tried it keeps when the uplink would be through everything sent so far; a send's
    ticket is that, right after it, so a window's wait and transmission under each rate are its
    ticket less its send time."""

    through: np.ndarray = field(default_factory=lambda: np.full(len(RATES_BPS), -np.inf))
    rests: deque[np.ndarray] = field(default_factory=lambda: deque(maxlen=EXCHANGES))
    verdict_bits: deque[int] = field(default_factory=lambda: deque(maxlen=EXCHANGES))
    fitted: int | None = None  # the index in RATES_BPS of the fitted rate
    fastest_tie: int | None = None  # the index of the fastest rate fitting as well

    def sent(self, at: float, bits: int) -> np.ndarray:
        """Log a message given to the link at `at`; its ticket, for `answered`."""
        self.through = np.maximum(self.through, at) + bits / RATES_BPS
        return self.through.copy()

    def answered(
        self, ticket: np.ndarray, sent_at: float, seconds: float, verdict_bits: int = 0
    ) -> None:
        """The verdict (of `verdict_bits`) on the chain sent alone at `sent_at` came `seconds`
        later."""
        self.rests.append(seconds - (ticket - sent_at))
        self.verdict_bits.append(verdict_bits)
        self.fitted, self.fastest_tie = self._fit()

    def _fit(self) -> tuple[int, int]:
        """The rate whose rests (window less wait and transmission) vary least among those
        that leave none negative; among ties the slowest: windows that never waited cannot
        tell fast rates apart, and a rate guessed too fast floods the uplink with forks (a
        chain sent alone, which could correct it, then seldom comes), one too slow only holds
        some back. A verdict's way down varies with its size (a full acceptance's is a few
        bytes, a rejection's carries a token): at a rate, rests spread within the verdicts'
        spread of bits over it, on a downlink no slower, count as a tie, or a few windows
        can fit a far faster rate a little better by chance."""
        rests = np.array(self.rests)  # windows × rates
        spread = rests.std(axis=0)
        feasible = rests.min(axis=0) >= 0.0  # no window shorter than its own wait and sending
        if feasible.any():
            spread[~feasible] = np.inf
        best = spread.min()
        noise = float(np.std(self.verdict_bits)) / RATES_BPS
        ties = np.flatnonzero(spread <= best + RELATIVE_SLACK * max(best, 1e-12) + noise)
        return int(ties.min()), int(ties.max())

    def rate_bps(self) -> float | None:
        """The fitted rate (None before `KNOWN_AFTER` windows were seen)."""
        if self.fitted is None or len(self.rests) < KNOWN_AFTER:
            return None
        return float(RATES_BPS[self.fitted])

    def pinned_rate_bps(self) -> float | None:
        """The fitted rate where the windows pin it down (their ties span at most
        `PINNED_SPAN`), else None. The slowest tie is safe for what may flood the uplink, but a
        price at it may be far too high: small messages on a fast link tie every rate down to
        the slowest that leaves no window too short."""
        rate = self.rate_bps()
        if rate is None or self.fastest_tie is None:
            return None
        return rate if RATES_BPS[self.fastest_tie] <= PINNED_SPAN * rate else None

    def room_bits(self, at: float, within_s: float) -> float | None:
        """Bits that, given to the link at `at`, are through it by `at + within_s` behind what is
        already queued (None before the rate is known)."""
        rate = self.rate_bps()
        if rate is None or self.fitted is None:
            return None
        backlog = max(0.0, float(self.through[self.fitted]) - at)
        return max(0.0, rate * (within_s - backlog))
