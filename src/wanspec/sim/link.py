"""WAN link model for the simulator: per-direction bandwidth, propagation delay, jitter, loss.

A `Link` is an immutable description (it is also the public `wanspec.Link`); the simulator asks it
for one `Channel` per direction, which holds the mutable state (FIFO queue, seeded random stream).

Model of one message of `bits` sent at time t in one direction:

- serialisation: the sender's queue is FIFO, so it starts at `max(t, end of the previous
  message's serialisation)` and lasts `bits / bandwidth` seconds;
- propagation: `rtt/2 + |N(0, jitter)|` (half-normal jitter: never negative, mean
  `jitter·√(2/π)`);
- loss: each attempt is lost independently with probability `loss`; a lost attempt is noticed by a
  timeout of `retransmit_s` (default one RTT) after it was serialised, and the resend is serialised
  again (charged to this message only, i.e. resends are assumed to use spare capacity);
- ordering: delivery is in order (a reliable byte stream, like TCP): a message never arrives
  before its predecessor, so jitter and losses cannot reorder, and a late message holds back the
  ones behind it (head-of-line blocking).

Every message draws exactly one uniform (loss) and one normal (jitter) from the direction's own
stream, seeded by `(seed, direction)`, so runs are reproducible and two links that differ only in
`loss` or `jitter_s` see the same random numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Direction = Literal["up", "down"]
_DIRECTION_INDEX: dict[str, int] = {"up": 0, "down": 1}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class Link:
    """A WAN link between the edge and the cloud (uplink = edge→cloud, downlink = cloud→edge).

    bandwidth_bps applies to both directions unless uplink_bps / downlink_bps override it;
    `math.inf` means no serialisation delay. rtt_s is the round-trip propagation delay (one way =
    rtt/2). jitter_s is the scale of the half-normal extra one-way delay. loss is the per-message
    loss probability, retransmit_s the timeout before a resend (default: one RTT).
    """

    bandwidth_bps: float
    rtt_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    uplink_bps: float | None = None
    downlink_bps: float | None = None
    retransmit_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("bandwidth_bps", "uplink_bps", "downlink_bps"):
            value = getattr(self, name)
            if value is not None or name == "bandwidth_bps":
                _check(_positive(value), f"{name} must be > 0, got {value!r}")
        for name in ("rtt_s", "jitter_s", "retransmit_s"):
            value = getattr(self, name)
            if value is not None or name != "retransmit_s":
                _check(_finite_nonneg(value), f"{name} must be finite and >= 0, got {value!r}")
        _check(
            isinstance(self.loss, int | float) and 0.0 <= self.loss < 1.0,
            f"loss must satisfy 0 <= loss < 1, got {self.loss!r}",
        )
        _check(
            isinstance(self.seed, int | np.integer)
            and not isinstance(self.seed, bool)
            and self.seed >= 0,
            f"seed must be a non-negative int, got {self.seed!r}",
        )

    @property
    def up_bps(self) -> float:
        return self.bandwidth_bps if self.uplink_bps is None else self.uplink_bps

    @property
    def down_bps(self) -> float:
        return self.bandwidth_bps if self.downlink_bps is None else self.downlink_bps

    @property
    def one_way_s(self) -> float:
        return self.rtt_s / 2

    @property
    def timeout_s(self) -> float:
        """Delay before a lost message is resent."""
        return self.rtt_s if self.retransmit_s is None else self.retransmit_s

    def channel(self, direction: Direction) -> Channel:
        """A fresh FIFO channel for one direction ("up" = edge→cloud, "down" = cloud→edge)."""
        if direction not in _DIRECTION_INDEX:
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        bps = self.up_bps if direction == "up" else self.down_bps
        rng = np.random.default_rng([self.seed, _DIRECTION_INDEX[direction]])
        return Channel(self, bps, rng)


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0 and not math.isnan(x)


def _finite_nonneg(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


@dataclass(frozen=True)
class Transmission:
    """What happened to one message: queue wait ended at `start`, serialised by `sent`,
    `retries` resends, delivered at `arrival`."""

    start: float
    sent: float
    arrival: float
    retries: int


class Channel:
    """One direction of a link: FIFO serialisation, in-order delivery, seeded jitter and loss."""

    def __init__(self, link: Link, bps: float, rng: np.random.Generator) -> None:
        self.link = link
        self.bps = bps
        self._rng = rng
        self._busy_until = 0.0
        self._last_arrival = 0.0

    def transmit(self, t: float, bits: int) -> Transmission:
        """Send `bits` at virtual time t; returns when it is delivered."""
        if isinstance(bits, bool) or not isinstance(bits, int | np.integer) or bits < 0:
            raise ValueError(f"message size must be a non-negative int of bits, got {bits!r}")
        u, z = self._rng.random(), self._rng.standard_normal()
        serialise = bits / self.bps
        start = max(t, self._busy_until)
        sent = start + serialise
        self._busy_until = sent
        retries = _failures(u, self.link.loss)
        resend = retries * (self.link.timeout_s + serialise)
        propagation = self.link.one_way_s + abs(z) * self.link.jitter_s
        arrival = max(sent + resend + propagation, self._last_arrival)
        self._last_arrival = arrival
        return Transmission(start=start, sent=sent, arrival=arrival, retries=retries)


def _failures(u: float, loss: float) -> int:
    """Number of lost attempts before the first success (geometric, P(K >= k) = loss^k),
    by inversion of one uniform u in [0, 1)."""
    if loss == 0.0:
        return 0
    return math.floor(math.log1p(-u) / math.log(loss))


# Named WAN settings, each with the public figures it rests on. AceSpec: "AceSpec: An Asymmetric
# Edge-Cloud Collaborative Framework for Communication-Efficient LLM Inference" (its testbed caps
# bandwidth with Linux tc: 100 Mbps baseline, §V-A; swept down to 10 kbps, flat to 50 kbps, §V-C).
# DSSD: the RTT ∈ {0, 20, 50} ms sweep of github.com/JasonNing96/DSSD-Efficient-Edge-Computing
# (search_H800.sh).
LINK_PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "wan-metro": (
        {"bandwidth_bps": 100e6, "rtt_s": 0.020},
        "DSSD's low-RTT point (20 ms); AceSpec's baseline bandwidth (100 Mbps, §V-A)",
    ),
    "wan-5g": (
        {"bandwidth_bps": 150e6, "uplink_bps": 20e6, "downlink_bps": 150e6, "rtt_s": 0.050},
        "Ookla Speedtest global 5G medians (≈21 Mbps up / 166 down, Q3 2021, Ookla's "
        "'Growing and Slowing' 5G report, 2021); DSSD's 50 ms point",
    ),
    "wan-4g": (
        {"bandwidth_bps": 20e6, "uplink_bps": 6e6, "downlink_bps": 20e6, "rtt_s": 0.060},
        "Opensignal US 4G Q1 2019 (6.3 / 21.3 Mbps, 44-66 ms; telecomengine.com/article/"
        "opensignal-benchmarks-5g-readiness-with-new-usa-analysis/); Ookla US mobile latency "
        "medians 59-61 ms (Verizon / T-Mobile / AT&T, Ookla Q3 report as quoted at "
        "unifiedguru.com/t-mobile-spectrum-top-mobile-and-fixed-broadband-speed-test-ratings)",
    ),
    "wan-intercontinental": (
        {"bandwidth_bps": 100e6, "rtt_s": 0.150},
        "AWS eu-west-1 ↔ ca-central-1 RTT 79 ms (fed135.medium.com, 'AWS region to region "
        "latency calculator'), doubled for access networks and distance",
    ),
    "wan-constrained": (
        {"bandwidth_bps": 50e3, "rtt_s": 0.100},
        "AceSpec's lowest non-degraded bandwidth (50 kbps, §V-C); RTT 100 ms assumed",
    ),
}


def link_preset(name: str, **overrides: Any) -> Link:
    """A named WAN setting (`LINK_PRESETS`), with optional field overrides (e.g. seed, jitter_s)."""
    if name not in LINK_PRESETS:
        raise ValueError(f"unknown link preset {name!r}; known: {', '.join(sorted(LINK_PRESETS))}")
    fields, _source = LINK_PRESETS[name]
    return Link(**{**fields, **overrides})
