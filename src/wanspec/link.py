"""The one WAN link model, sans-IO: when data handed to one direction of a link is delivered.

Both drivers time their traffic with it: the simulator each message (`wanspec.sim.link.Channel`,
size = the message's exact bits), the WAN proxy each chunk it reads from a socket
(`wanspec.net.proxy`). A `DirectionSpec` describes one direction, a `Shaper` holds its state
(when the link is next free, the last delivery, two seeded random streams); `Shaper.admit`
(bytes) or `Shaper.admit_bits` (bits) answers a `Slot`. The model is what TCP over a lossy path
does, which is what the proxy really carries. Data of `bits` handed over at time t:

- serialisation: FIFO at `rate_bps` (`inf` = none): it starts at `max(t, end of the previous
  serialisation)` (`Slot.start`) and ends `bits / rate_bps` later (`Slot.sent`);
- propagation: the one-way `delay_s` plus half-normal jitter `|N(0, jitter_s)|` (never
  negative, mean `jitter_s·√(2/π)`), one normal drawn per admission;
- loss: TCP hides it, so it shows up as delay. The data travels in `segments(ceil(bits/8))`
  segments of at most `MSS` bytes, each lost independently with probability `loss` per attempt;
  every failed attempt of a segment costs one retransmission timeout `timeout_s` (`rto_s`,
  default one RTT = 2·`delay_s`) and nothing is serialised again (resends use spare capacity).
  The data is delivered when its unluckiest segment is: `Slot.retries` is that segment's
  failed attempts, drawn by inversion of one uniform per segment (P(retries ≥ k) = loss^k per
  segment). No data (0 bits, e.g. a FIN) has no segment to lose;
- arrival: `sent + delay_s + jitter + retries · timeout_s`;
- order: data is never delivered before the data ahead of it (a reliable byte stream), so
  jitter and losses cannot reorder it, and late data holds back what follows (head-of-line
  blocking): `Slot.deliver = max(arrival, previous deliver)`.

Jitter and loss draw from two separate streams spawned from one seed (the simulator seeds with
(seed, direction), the proxy with (seed, connection, direction)), so a run is reproducible and
turning loss on leaves the jitter sequence unchanged; the loss stream is used only when
`loss > 0`.

`MSS`, `HEADER_BYTES` and `segments` are also the byte counters' estimate of TCP/IP overhead.
Both only approximate what a kernel does: real segmentation depends on Nagle, coalescing of
writes, TSO and the path MTU; the constants describe the common case of an Ethernet path (MTU
1500) carrying IPv4 and TCP with the timestamp option, which Linux enables by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MSS = 1448  # payload bytes per segment: 1500 − 20 (IPv4) − 20 (TCP) − 12 (timestamp option)
HEADER_BYTES = 52  # IPv4 + TCP headers of one such segment


def segments(nbytes: int) -> int:
    """Segments that carry `nbytes` of payload, each at most MSS long (0 bytes: no segment)."""
    if nbytes < 0:
        raise ValueError(f"a byte count must be >= 0, got {nbytes}")
    return -(-nbytes // MSS)


@dataclass(frozen=True)
class DirectionSpec:
    """One direction of a link. `rate_bps = inf` means no serialisation delay; `rto_s = None`
    means one RTT, i.e. twice this direction's `delay_s`."""

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
    """What the link did with one admission: serialisation from `start` to `sent`, delivery at
    `deliver`; `retries` is the failed attempts of its unluckiest segment."""

    start: float
    sent: float
    deliver: float
    retries: int


class Shaper:
    """The mutable state of one direction: when the link is next free, the last delivery time
    and the seeded jitter and loss streams. Times are in any consistent clock."""

    def __init__(self, spec: DirectionSpec, seed: int | Sequence[int] = 0) -> None:
        self.spec = spec
        jitter_seed, loss_seed = np.random.SeedSequence(seed).spawn(2)
        self._jitter = np.random.default_rng(jitter_seed)
        self._loss = np.random.default_rng(loss_seed)
        self.busy_until = -math.inf
        self._last_delivery = -math.inf

    def admit(self, now: float, nbytes: int) -> Slot:
        """Schedule `nbytes` of a byte stream handed to the link at `now` (0 bytes: a FIN)."""
        return self.admit_bits(now, 8 * nbytes)

    def admit_bits(self, now: float, bits: int) -> Slot:
        """Schedule `bits` (a message's exact size) handed to the link at `now`."""
        spec = self.spec
        start = max(now, self.busy_until)
        sent = start + bits / spec.rate_bps
        self.busy_until = sent
        retries = self._unluckiest_failures(segments(-(-bits // 8)))
        jitter = abs(float(self._jitter.standard_normal())) * spec.jitter_s
        arrival = sent + spec.delay_s + jitter + retries * spec.timeout_s
        self._last_delivery = max(self._last_delivery, arrival)
        return Slot(start=start, sent=sent, deliver=self._last_delivery, retries=retries)

    def _unluckiest_failures(self, nsegments: int) -> int:
        """Failed attempts of the unluckiest of `nsegments` segments, one uniform each."""
        if self.spec.loss == 0.0 or nsegments == 0:
            return 0
        return failures(float(self._loss.random(nsegments).max()), self.spec.loss)


def failures(u: float, loss: float) -> int:
    """Failed attempts before the first success, geometric with P(K >= k) = loss^k, by inversion
    of one uniform u in [0, 1); monotone in u, so the unluckiest segment holds the largest u."""
    if loss == 0.0:
        return 0
    return math.floor(math.log1p(-u) / math.log(loss))
