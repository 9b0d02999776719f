"""WAN links for the simulator: the public `wanspec.Link` and its per-direction `Channel`.

A `Link` is an immutable description; the simulator asks it for one `Channel` per direction,
which times each message (size = its exact bits) with the one link model the WAN proxy uses too,
`wanspec.link`, whose docstring states it. A channel's jitter and loss streams are seeded by
`(seed, direction)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from wanspec.link import DirectionSpec, Shaper
from wanspec.runtime import Direction

_DIRECTION_INDEX: dict[str, int] = {"up": 0, "down": 1}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class Link:
    """A WAN link between the edge and the cloud (uplink = edge→cloud, downlink = cloud→edge).

    bandwidth_bps applies to both directions unless uplink_bps / downlink_bps override it;
    `math.inf` means no serialisation delay. rtt_s is the round-trip propagation delay (one way =
    rtt/2). jitter_s is the scale of the half-normal extra one-way delay. loss is the loss
    probability of each attempt of each MSS-sized segment, retransmit_s the timeout each failed
    attempt costs (default: one RTT). The model: `wanspec.link`.
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
        """Delay each failed attempt of a segment costs."""
        return self.rtt_s if self.retransmit_s is None else self.retransmit_s

    def spec(self, direction: Direction) -> DirectionSpec:
        """One direction of this link in the shared model's terms (what the WAN proxy takes)."""
        _check_direction(direction)
        bps = self.up_bps if direction == "up" else self.down_bps
        return DirectionSpec(bps, self.one_way_s, self.jitter_s, self.loss, self.retransmit_s)

    def channel(self, direction: Direction) -> Channel:
        """A fresh FIFO channel for one direction ("up" = edge→cloud, "down" = cloud→edge)."""
        return Channel(self, direction)


def _check_direction(direction: str) -> None:
    if direction not in _DIRECTION_INDEX:
        raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0 and not math.isnan(x)


def _finite_nonneg(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


@dataclass(frozen=True)
class Transmission:
    """What happened to one message: queue wait ended at `start`, serialised by `sent`,
    delivered at `arrival`; `retries` is the failed attempts of its unluckiest segment."""

    start: float
    sent: float
    arrival: float
    retries: int


class Channel:
    """One direction of a link: the shared model (`wanspec.link.Shaper`) timing each message."""

    def __init__(self, link: Link, direction: Direction) -> None:
        spec = link.spec(direction)
        self.link = link
        self.bps = spec.rate_bps
        self._shaper = Shaper(spec, seed=[link.seed, _DIRECTION_INDEX[direction]])

    def transmit(self, t: float, bits: int) -> Transmission:
        """Send `bits` at virtual time t; returns when it is delivered."""
        if isinstance(bits, bool) or not isinstance(bits, int | np.integer) or bits < 0:
            raise ValueError(f"message size must be a non-negative int of bits, got {bits!r}")
        slot = self._shaper.admit_bits(t, int(bits))
        return Transmission(
            start=slot.start, sent=slot.sent, arrival=slot.deliver, retries=slot.retries
        )


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
