"""The timing model of one direction of an emulated WAN link, without any I/O (sans-IO).

`WanProxy` asks a `Shaper` when each chunk it read is serialised and when it may be delivered;
keeping the arithmetic here makes it testable without clocks or sockets. The model is the one
`wanspec.sim.link` uses for messages, applied to the chunks a TCP proxy sees:

- serialisation: FIFO at `rate_bps`; a chunk starts when the link is free, lasts len·8/rate;
- propagation: `delay_s` (one way, rtt/2) plus half-normal jitter `|N(0, jitter_s)|`;
- loss: TCP hides it, so it shows up as delay. Each MSS-sized segment of a chunk is lost
  independently with probability `loss`, and every failed attempt costs one retransmission
  timeout `rto_s` (default one RTT); the chunk waits for its unluckiest segment;
- order: a chunk is never delivered before the one ahead of it (TCP is a byte stream), so jitter
  and losses cannot reorder; a late chunk holds back those behind it (head-of-line blocking).

Jitter and loss draw from separate seeded streams, so turning loss on leaves the jitter sequence
unchanged, and two runs with the same seed see the same delays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from wanspec.net.segments import segments


@dataclass(frozen=True)
class DirectionSpec:
    """One direction of the emulated link. `rate_bps = inf` means no serialisation delay;
    `rto_s = None` means one RTT, i.e. twice this direction's `delay_s`."""

    rate_bps: float = math.inf
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    rto_s: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.rate_bps, int | float) and self.rate_bps > 0):
            raise ValueError(f"rate_bps must be > 0 (math.inf for no limit), got {self.rate_bps!r}")
        for name in ("delay_s", "jitter_s", "rto_s"):
            value = getattr(self, name)
            if value is None and name == "rto_s":
                continue
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not (isinstance(self.loss, int | float) and 0.0 <= self.loss < 1.0):
            raise ValueError(f"loss must satisfy 0 <= loss < 1, got {self.loss!r}")

    @property
    def timeout_s(self) -> float:
        """The retransmission timeout charged per failed attempt."""
        return 2 * self.delay_s if self.rto_s is None else self.rto_s

    def describe(self) -> str:
        """One line for people: `1 Mbit/s, 25 ms one way, jitter 5 ms, loss 1%`."""
        rate = "unlimited" if math.isinf(self.rate_bps) else f"{self.rate_bps / 1e6:g} Mbit/s"
        parts = [rate, f"{self.delay_s * 1e3:g} ms one way"]
        if self.jitter_s:
            parts.append(f"jitter {self.jitter_s * 1e3:g} ms")
        if self.loss:
            parts.append(f"loss {self.loss:.2%} (rto {self.timeout_s * 1e3:g} ms)")
        return ", ".join(parts)

    def serialise_s(self, nbytes: int) -> float:
        """Time the link needs to put `nbytes` on the wire."""
        return nbytes * 8 / self.rate_bps


@dataclass(frozen=True)
class Slot:
    """When one chunk finished serialising (`sent`) and when it may be delivered; `retries`
    is the number of retransmission timeouts it waited."""

    sent: float
    deliver: float
    retries: int


class Shaper:
    """The mutable state of one direction: when the link is next free, the last delivery time
    and the seeded random streams. Times are in any consistent clock (the proxy uses the loop's)."""

    def __init__(self, spec: DirectionSpec, seed: int | list[int] = 0) -> None:
        self.spec = spec
        root = np.random.SeedSequence(seed)
        jitter_seed, loss_seed = root.spawn(2)
        self._jitter = np.random.default_rng(jitter_seed)
        self._loss = np.random.default_rng(loss_seed)
        self.busy_until = -math.inf
        self._last_delivery = -math.inf

    def admit(self, now: float, nbytes: int) -> Slot:
        """Schedule a chunk of `nbytes` handed to the link at `now` (0 bytes: a FIN)."""
        spec = self.spec
        sent = max(now, self.busy_until) + spec.serialise_s(nbytes)
        self.busy_until = sent
        retries = self._failed_attempts(segments(nbytes))
        jitter = abs(float(self._jitter.standard_normal())) * spec.jitter_s
        arrival = sent + spec.delay_s + jitter + retries * spec.timeout_s
        self._last_delivery = max(self._last_delivery, arrival)
        return Slot(sent=sent, deliver=self._last_delivery, retries=retries)

    def _failed_attempts(self, nsegments: int) -> int:
        """Failed attempts of the unluckiest of `nsegments` segments (geometric per segment)."""
        if self.spec.loss == 0.0 or nsegments == 0:
            return 0
        return int(self._loss.geometric(1.0 - self.spec.loss, size=nsegments).max()) - 1


def link_specs(link: Any) -> tuple[DirectionSpec, DirectionSpec]:
    """(up, down) specs emulating a simulator `Link` (anything with its `up_bps`, `down_bps`,
    `rtt_s`, `jitter_s`, `loss`, `retransmit_s`), so a proxy and the simulator see one WAN."""
    shared = (link.rtt_s / 2, link.jitter_s, link.loss, link.retransmit_s)
    return DirectionSpec(link.up_bps, *shared), DirectionSpec(link.down_bps, *shared)
