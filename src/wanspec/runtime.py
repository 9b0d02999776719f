"""What every driver does for one side of a run, without a clock or I/O: `SideRuntime`.

A driver hands a machine's actions to `SideRuntime.apply` with its own time, and does only what
needs its clock or its I/O: it sends the messages `apply` hands back (and reports their sizes to
`sent`), runs the jobs `start_next` gives it, and says when one ended (`end_job`). The runtime
keeps the rest, the same for the simulator (`wanspec.sim.request`) and the network driver
(`wanspec.net.driver`): the side's FIFO job queue, cancels (a queued job is dropped; the running
one's result is dropped when it ends), the emits with their times, the finish reason, messages
and bits by type, and compute seconds and jobs by `Purpose`.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from wanspec.protocols.base import Cancel, Compute, Emit, Finish, Send, Side

Direction = Literal["up", "down"]  # up: edge to cloud
SENDS_ON: dict[Side, Direction] = {"edge": "up", "cloud": "down"}  # where a side's messages go
Trace = Callable[..., None]  # trace(what, **info): a step the driver may want on record


@dataclass(frozen=True)
class EmitRecord:
    t: float
    side: Side
    token_ids: tuple[int, ...]


@dataclass
class TypeTally:
    """Messages and bits by message type (its class name), in the order types first appeared."""

    messages: dict[str, int] = field(default_factory=dict)
    bits: dict[str, int] = field(default_factory=dict)

    def add(self, msg: Any, bits: int) -> str:
        """Count one message of `bits`; returns its type name."""
        kind = type(msg).__name__
        self.bits[kind] = self.bits.get(kind, 0) + bits
        self.messages[kind] = self.messages.get(kind, 0) + 1
        return kind

    def pairs(self) -> dict[str, tuple[int, int]]:
        """(messages, bits) by type."""
        return {kind: (count, self.bits[kind]) for kind, count in self.messages.items()}

    def merged(self, other: TypeTally) -> TypeTally:
        """Both tallies together (one side's sent and received), this one's types first."""
        both = TypeTally(dict(self.messages), dict(self.bits))
        for kind, count in other.messages.items():
            both.messages[kind] = both.messages.get(kind, 0) + count
            both.bits[kind] = both.bits.get(kind, 0) + other.bits[kind]
        return both


@dataclass(frozen=True)
class TraceRecord:
    """One step of the run: `what` is recv | send | compute_start | compute_end | cancel | emit |
    finish, and on a shared cloud compute_piece (a long prefill's pass before its last piece).
    `send` records the message as the machine sent it, `recv` as the peer decoded it."""

    t: float
    side: Side
    what: str
    info: dict[str, Any]


@dataclass
class SimResult:
    """Everything measured during one request, the one record every driver returns: the
    simulator's of both sides (virtual seconds), or the network driver's of the one side it
    drove (`wanspec.net.driver.drive`, wall-clock seconds; the per-side dicts hold that side).

    `protocol_cpu_s` / `codec_cpu_s`: per side, the machines' own CPU the run was charged
    (handlers plus codec, and the codec's share of it), or None when it was not charged.
    `traffic_by_type`: (messages, bits) by type per direction, as the machine sent and decoded
    them (network driver only; its `bits` and `messages` count the connection's frames, which
    include a resumed session's replays)."""

    finish_reason: str
    duration_s: float
    emits: list[EmitRecord]
    bits: dict[Direction, int]
    messages: dict[Direction, int]
    bits_by_type: dict[str, int]
    messages_by_type: dict[str, int]
    compute_busy_s: dict[Side, float]
    compute_by_tag: dict[Side, dict[str, float]]  # busy seconds by the jobs' `Purpose`
    computes: dict[Side, int]
    retransmissions: dict[Direction, int]
    events: int
    computes_by_tag: dict[Side, dict[str, int]] = field(default_factory=dict)  # jobs by `Purpose`
    cloud_finish: str | None = None
    trace: list[TraceRecord] | None = None
    protocol_cpu_s: dict[Side, float] | None = None
    codec_cpu_s: dict[Side, float] | None = None
    handle_cpu_s: dict[Side, float] | None = None  # CPU measured in `handle` (network driver)
    traffic_by_type: dict[Direction, dict[str, tuple[int, int]]] = field(default_factory=dict)

    @property
    def tokens(self) -> list[int]:
        return [tok for rec in self.emits for tok in rec.token_ids]

    @property
    def token_times(self) -> list[float]:
        """The time at which each output token was emitted."""
        return [rec.t for rec in self.emits for _ in rec.token_ids]

    @property
    def ttft_s(self) -> float | None:
        """Time to first token (None if nothing was emitted)."""
        times = self.token_times
        return times[0] if times else None

    @property
    def decode_span(self) -> tuple[int, float]:
        """(tokens emitted after the first emit, seconds from the first emit to the last): the
        steady-state part of a run, which a per-cycle bound such as AceSpec's T_ideal describes
        (the first emit's tokens and the time to it belong to TTFT)."""
        if not self.emits:
            return 0, 0.0
        first = self.emits[0].t
        later = [rec for rec in self.emits if rec.t > first]
        return sum(len(rec.token_ids) for rec in later), (later[-1].t - first if later else 0.0)

    @property
    def tokens_per_s(self) -> float:
        n = len(self.token_times)
        return n / self.duration_s if self.duration_s > 0 else math.inf if n else 0.0

    @property
    def inter_token_s(self) -> list[float]:
        """Gaps between consecutive output tokens (0 within one multi-token emit)."""
        times = self.token_times
        return [b - a for a, b in itertools.pairwise(times)]


class QueuedCompute(NamedTuple):
    action: Compute
    at: float  # the driver's time when it was queued (or put back in line)


def job_label(action: Compute) -> str:
    """What a job is tallied by: its `Purpose`, or its job type for a machine that gave none."""
    return action.label or type(action.job).__name__


class SideRuntime:
    """One side's bookkeeping (see the module's docstring).

    `emits` and `sent` may be shared by a run's two sides (the simulator's two machines), so
    that one record keeps the order things happened in across both. `trace(what, **info)`, if
    given, is told each cancel, emit and finish."""

    def __init__(
        self,
        side: Side,
        *,
        emits: list[EmitRecord] | None = None,
        sent: TypeTally | None = None,
        trace: Trace | None = None,
    ) -> None:
        self.side = side
        self.queue: deque[QueuedCompute] = deque()
        self.running: int | None = None  # the job started and not yet ended
        self.running_cancelled = False  # its result is to be dropped
        self.emits: list[EmitRecord] = [] if emits is None else emits
        self.finish: str | None = None
        self.sent = TypeTally() if sent is None else sent
        self.received = TypeTally()
        self.busy_s = 0.0  # compute seconds charged, all jobs
        self.compute_s: dict[str, float] = {}  # the same by label
        self.computes: dict[str, int] = {}  # jobs run, by label
        self.trace = trace

    # ------------------------------------------------------------------ actions
    def apply(self, action: Any, now: float) -> Any | None:
        """Record one action at the driver's time `now`; returns the message of a `Send`, which
        the driver sends (None for every other action)."""
        if isinstance(action, Send):
            return action.msg
        if isinstance(action, Compute):
            self.queue.append(QueuedCompute(action, now))
        elif isinstance(action, Cancel):
            self.cancel(action.job_id)
        elif isinstance(action, Emit):
            tokens = tuple(int(t) for t in action.token_ids)
            self.emits.append(EmitRecord(now, self.side, tokens))
            self._trace("emit", token_ids=tokens)
        elif isinstance(action, Finish):
            self._trace("finish", reason=action.reason)
            self.finish = action.reason
        else:
            raise TypeError(f"{self.side} returned an unknown action {action!r}")
        return None

    def cancel(self, job_id: int) -> None:
        """Drop the job if it is queued; if it is running, drop its result when it ends."""
        queued = [q for q in self.queue if q.action.job_id != job_id]
        if len(queued) != len(self.queue):
            self.queue = deque(queued)
        elif self.running == job_id:
            self.running_cancelled = True
        self._trace("cancel", job_id=job_id)

    def _trace(self, what: str, **info: Any) -> None:
        if self.trace is not None:
            self.trace(what, **info)

    # ------------------------------------------------------------------ jobs
    @property
    def awaiting_results(self) -> bool:
        """A job is queued, or running with its result wanted."""
        return bool(self.queue) or (self.running is not None and not self.running_cancelled)

    def start_next(self) -> Compute:
        """Take the next queued job: it is running until `end_job`."""
        if self.running is not None:
            raise RuntimeError(f"{self.side} starts a job while job {self.running} runs")
        action = self.queue.popleft().action
        self.running, self.running_cancelled = action.job_id, False
        return action

    def end_job(self, job_id: int) -> bool:
        """The running job `job_id` is over: whether its result goes to the machine (False: it
        was cancelled while it ran, and its result is dropped)."""
        if job_id != self.running:
            raise RuntimeError(f"{self.side} ends job {job_id}, but job {self.running} runs")
        wanted = not self.running_cancelled
        self.running, self.running_cancelled = None, False
        return wanted

    def charge(self, label: str, seconds: float, *, job: bool = True) -> None:
        """`seconds` of compute by `label`; `job`: they are one job's (else a part of one)."""
        self.busy_s += seconds
        self.compute_s[label] = self.compute_s.get(label, 0.0) + seconds
        if job:
            self.computes[label] = self.computes.get(label, 0) + 1

    @property
    def jobs_run(self) -> int:
        return sum(self.computes.values())
