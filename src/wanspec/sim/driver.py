"""Discrete-event simulator: runs an edge and a cloud state machine on a virtual clock.

The machines are driven only through `handle(event) -> list[Action]`. Each side has one compute
resource and an executor (a function running a job on that side's own model session): `Compute`
actions run one at a time in FIFO order; the job is executed for real when the computation starts
(virtual time) and its result is delivered as `ComputeDone(job_id, result)` when the profile says
it ends; `Cancel` drops a queued job, or the result of the running one. `Send` encodes the
message with the wire codec, charges its exact size to the link (edge→cloud on the uplink,
cloud→edge on the downlink) and delivers the DECODED message as `MessageReceived(msg)`, so the
machines see exactly what a network peer would. Events are ordered by (virtual time, sequence
number), so runs are deterministic for deterministic machines, profiles and link seeds.

With `charge_cpu=True` the machines' own CPU takes virtual time too, as it does on real peers:
each `handle(event)` call, the encoding of every message a side sends and the decoding of every
message it receives are timed on this machine's wall clock (`time.perf_counter`) and charged to
that side. A side's protocol CPU is one serial time line: an event that comes while it is still
busy waits, and what a handler does (sends, jobs, emits, finishing) happens when its CPU time is
over. The models run beside it (a job that runs is not slowed by a handler), as the network
driver's event loop and model worker do; a job queued by a handler starts when the handler ends.
Off by default: wall-clock readings would make the virtual times differ from run to run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wanspec.jobs import Executor
from wanspec.protocols.base import (
    Cancel,
    Compute,
    ComputeDone,
    Emit,
    Event,
    Finish,
    MessageReceived,
    Send,
    Side,
    Start,
    StateMachine,
)
from wanspec.sim.link import Channel, Direction, Link
from wanspec.sim.profiles import Profile, load_profile

SizeFn = Callable[[Any], int]
Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]
_DIRECTION: dict[str, Direction] = {"edge": "up", "cloud": "down"}
_OTHER: dict[str, Side] = {"edge": "cloud", "cloud": "edge"}


class SimulationError(RuntimeError):
    """The simulated run could not complete."""


class SimulationDeadlock(SimulationError):
    """Both sides are idle, nothing is in flight, and the edge has not finished."""


class SimulationTimeout(SimulationError):
    """The virtual clock passed max_time, or more than max_events events were processed."""


@dataclass(frozen=True)
class EmitRecord:
    t: float
    side: Side
    token_ids: tuple[int, ...]


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
    """Everything measured during one simulated request (times in virtual seconds).

    `protocol_cpu_s` / `codec_cpu_s`: per side, the machines' own CPU the run was charged
    (handlers plus codec, and the codec's share of it), or None when it was not charged."""

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
    cloud_finish: str | None = None
    trace: list[TraceRecord] | None = None
    protocol_cpu_s: dict[Side, float] | None = None
    codec_cpu_s: dict[Side, float] | None = None

    @property
    def tokens(self) -> list[int]:
        return [tok for rec in self.emits for tok in rec.token_ids]

    @property
    def token_times(self) -> list[float]:
        """Virtual time at which each output token was emitted."""
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


@dataclass
class _Cpu:
    """The time line of a side's protocol CPU: when it is next free (virtual seconds). Sessions
    on one server share the server's (its one event loop)."""

    free_at: float = 0.0


@dataclass
class _Side:
    name: Side
    machine: StateMachine
    profile: Profile
    channel: Channel
    executor: Executor
    queue: deque[Compute] = field(default_factory=deque)
    busy: bool = False
    running: int | None = None  # job id of the computation under way
    cancelled: set[int] = field(default_factory=set)
    busy_s: float = 0.0
    by_tag: dict[str, float] = field(default_factory=dict)  # by `Purpose` (a job's label)
    computes: int = 0
    cpu: _Cpu = field(default_factory=_Cpu)
    cpu_s: float = 0.0  # protocol CPU charged: handlers and codec
    codec_s: float = 0.0  # its codec share


def _as_bits(size: Any, msg: Any) -> int:
    try:
        bits = operator.index(size)
    except TypeError:
        bits = -1
    if isinstance(size, bool) or bits < 0:
        raise ValueError(f"size_fn gave {size!r} for {type(msg).__name__}; expected int bits >= 0")
    return bits


def _wire_codec() -> Codec:
    from wanspec import wire

    return wire.encode, wire.decode


class _Simulation:
    def __init__(
        self,
        edge: StateMachine,
        cloud: StateMachine,
        link: Link,
        profiles: tuple[Profile, Profile],
        executors: tuple[Executor, Executor],
        size_fn: SizeFn | None,
        trace: bool,
        charge_cpu: bool = False,
    ) -> None:
        self.sides: dict[Side, _Side] = {
            "edge": _Side("edge", edge, profiles[0], link.channel("up"), executors[0]),
            "cloud": _Side("cloud", cloud, profiles[1], link.channel("down"), executors[1]),
        }
        self.size_fn = size_fn
        self.codec = _wire_codec() if size_fn is None else None
        self.heap: list[tuple[float, int, Side, Event]] = []
        self.seq = 0
        self.now = 0.0
        self.finish: str | None = None
        self.cloud_finish: str | None = None
        self.emits: list[EmitRecord] = []
        self.bits: dict[Direction, int] = {"up": 0, "down": 0}
        self.messages: dict[Direction, int] = {"up": 0, "down": 0}
        self.retransmissions: dict[Direction, int] = {"up": 0, "down": 0}
        self.bits_by_type: dict[str, int] = {}
        self.messages_by_type: dict[str, int] = {}
        self.trace: list[TraceRecord] | None = [] if trace else None
        self.events = 0
        self.charge_cpu = charge_cpu
        self.decode_s: dict[int, float] = {}  # id(MessageReceived) -> its decoding's CPU

    # ------------------------------------------------------------------ event queue
    def push(self, t: float, side: Side, event: Event) -> None:
        heapq.heappush(self.heap, (t, self.seq, side, event))
        self.seq += 1

    def record(self, side: Side, what: str, **info: Any) -> None:
        if self.trace is not None:
            self.trace.append(TraceRecord(self.now, side, what, info))

    def run(self, max_time: float, max_events: int) -> None:
        self.push(0.0, "cloud", Start())
        self.push(0.0, "edge", Start())
        while self.finish is None:
            if not self.heap:
                raise SimulationDeadlock(self._deadlock_message())
            t, _, side, event = heapq.heappop(self.heap)
            if t > max_time:
                raise SimulationTimeout(
                    f"virtual time passed max_time={max_time} s (next event at {t:.6g} s: "
                    f"{type(event).__name__} to {side}) before the edge finished"
                )
            self.events += 1
            if self.events > max_events:
                raise SimulationTimeout(
                    f"more than max_events={max_events} events by t={t:.6g} s; a livelock?"
                )
            self.now = t
            self.dispatch(self.sides[side], event)

    def _deadlock_message(self) -> str:
        note = f"; the cloud finished with {self.cloud_finish!r}" if self.cloud_finish else ""
        return (
            f"deadlock at t={self.now:.6g} s: both sides idle, no message or computation in "
            f"flight, and the edge has not sent Finish{note}"
        )

    # ------------------------------------------------------------------ one event
    def dispatch(self, side: _Side, event: Event) -> None:
        if self.charge_cpu and side.cpu.free_at > self.now:
            self.push(side.cpu.free_at, side.name, event)  # the side's CPU is busy until then
            return
        if isinstance(event, ComputeDone):
            side.busy, side.running = False, None
            self.record(side.name, "compute_end", job_id=event.job_id)
            if event.job_id in side.cancelled:
                side.cancelled.discard(event.job_id)
                self.start_next_compute(side)
                return
        elif isinstance(event, MessageReceived):
            self.record(side.name, "recv", type=type(event.msg).__name__, msg=event.msg)
        began = time.perf_counter()
        try:
            actions = side.machine.handle(event)
        except Exception as err:
            err.add_note(f"in {side.name}.handle({type(event).__name__}) at t={self.now:.6g} s")
            raise
        if self.charge_cpu:
            self.charge(side, time.perf_counter() - began)
            if isinstance(event, MessageReceived):
                decode_s = self.decode_s.pop(id(event), 0.0)
                side.codec_s += decode_s
                self.charge(side, decode_s)
        if not isinstance(actions, list | tuple):
            raise TypeError(
                f"{side.name}.handle() must return a list of actions, got {type(actions).__name__}"
            )
        for action in actions:
            self.apply(side, action)
        if self.charge_cpu:
            side.cpu.free_at = self.now
        if self.finish is None:
            self.start_next_compute(side)

    def charge(self, side: _Side, seconds: float) -> None:
        """`seconds` of `side`'s protocol CPU: what it does next happens that much later."""
        side.cpu_s += seconds
        self.now += seconds

    def apply(self, side: _Side, action: Any) -> None:
        if isinstance(action, Send):
            self.send(side, action.msg)
        elif isinstance(action, Compute):
            side.queue.append(action)
        elif isinstance(action, Cancel):
            self.cancel(side, action.job_id)
        elif isinstance(action, Emit):
            tokens = tuple(int(t) for t in action.token_ids)
            self.emits.append(EmitRecord(self.now, side.name, tokens))
            self.record(side.name, "emit", token_ids=tokens)
        elif isinstance(action, Finish):
            self.record(side.name, "finish", reason=action.reason)
            if side.name == "edge":
                self.finish = action.reason
            else:
                self.cloud_finish = action.reason
        else:
            raise TypeError(f"{side.name} returned an unknown action {action!r}")

    def cancel(self, side: _Side, job_id: int) -> None:
        queued = [c for c in side.queue if c.job_id != job_id]
        if len(queued) != len(side.queue):
            side.queue = deque(queued)
        elif side.running == job_id:
            side.cancelled.add(job_id)
        self.record(side.name, "cancel", job_id=job_id)

    def send(self, side: _Side, msg: Any) -> None:
        sent, decode_s = msg, 0.0
        if self.codec is not None:
            encode, decode = self.codec
            began = time.perf_counter()
            data = encode(msg)
            encoded = time.perf_counter()
            size, msg = 8 * len(data), decode(data)
            decode_s = time.perf_counter() - encoded
            if self.charge_cpu:  # encoding is the sender's CPU, decoding the receiver's
                side.codec_s += encoded - began
                self.charge(side, encoded - began)
        else:
            size = _as_bits(self.size_fn(msg), msg)
        direction = _DIRECTION[side.name]
        tx = side.channel.transmit(self.now, size)
        kind = type(msg).__name__
        self.bits[direction] += size
        self.messages[direction] += 1
        self.retransmissions[direction] += tx.retries
        self.bits_by_type[kind] = self.bits_by_type.get(kind, 0) + size
        self.messages_by_type[kind] = self.messages_by_type.get(kind, 0) + 1
        self.record(
            side.name,
            "send",
            type=kind,
            bits=size,
            arrival=tx.arrival,
            retries=tx.retries,
            msg=sent,
        )
        received = MessageReceived(msg, tx.arrival)
        if self.charge_cpu and decode_s:
            self.decode_s[id(received)] = decode_s
        self.push(tx.arrival, _OTHER[side.name], received)

    def start_next_compute(self, side: _Side) -> None:
        if side.busy or not side.queue:
            return
        action = side.queue.popleft()
        kind = action.label or type(action.job).__name__
        began = time.perf_counter()
        try:
            result = side.executor(action.job)
        except Exception as err:
            err.add_note(f"in {side.name} compute {kind} #{action.job_id} at t={self.now:.6g} s")
            raise
        wall_s = time.perf_counter() - began
        duration = side.profile.seconds(action.cost, wall_s)
        if not duration >= 0 or math.isinf(duration):
            raise ValueError(
                f"profile {side.profile.name!r} priced {action.cost} at {duration!r} s"
            )
        side.busy, side.running = True, action.job_id
        side.busy_s += duration
        side.by_tag[kind] = side.by_tag.get(kind, 0.0) + duration
        side.computes += 1
        self.record(side.name, "compute_start", job=kind, cost=action.cost, seconds=duration)
        self.push(
            self.now + duration, side.name, ComputeDone(action.job_id, result, self.now + duration)
        )

    def result(self) -> SimResult:
        assert self.finish is not None
        return SimResult(
            finish_reason=self.finish,
            duration_s=self.now,
            emits=self.emits,
            bits=self.bits,
            messages=self.messages,
            bits_by_type=self.bits_by_type,
            messages_by_type=self.messages_by_type,
            compute_busy_s={name: s.busy_s for name, s in self.sides.items()},
            compute_by_tag={name: dict(s.by_tag) for name, s in self.sides.items()},
            computes={name: s.computes for name, s in self.sides.items()},
            retransmissions=self.retransmissions,
            events=self.events,
            cloud_finish=self.cloud_finish,
            trace=self.trace,
            protocol_cpu_s=self.cpu_seconds("cpu_s"),
            codec_cpu_s=self.cpu_seconds("codec_s"),
        )

    def cpu_seconds(self, what: str) -> dict[Side, float] | None:
        if not self.charge_cpu:
            return None
        return {name: getattr(s, what) for name, s in self.sides.items()}


def simulate(
    edge: StateMachine,
    cloud: StateMachine,
    link: Link,
    edge_profile: Profile | str,
    cloud_profile: Profile | str,
    *,
    edge_executor: Executor,
    cloud_executor: Executor,
    size_fn: SizeFn | None = None,
    max_time: float = 1e5,
    max_events: int = 1_000_000,
    trace: bool = False,
    charge_cpu: bool = False,
) -> SimResult:
    """Run one request to the edge's `Finish` and return its timings and traffic.

    `Start()` goes to the cloud, then the edge, at t=0. Each side's jobs run on its executor
    (`wanspec.models.jobs.session_executor(model)`). Messages travel through the wire codec; a
    `size_fn(msg)` (bits) instead passes message objects as they are (toy machines in tests).
    Profiles may be given by name (see `wanspec.sim.profiles.load_profile`). `charge_cpu`: also
    charge each side's measured protocol CPU (its handlers, encoding what it sends and decoding
    what it receives) on the virtual clock, as real peers pay it (see the module's docstring);
    the result's `protocol_cpu_s` says how much. Raises
    SimulationDeadlock if everything goes idle before Finish, SimulationTimeout past max_time
    virtual seconds or max_events events.
    """
    if not isinstance(link, Link):
        raise TypeError(f"link must be a wanspec Link, got {type(link).__name__}")
    if not max_time > 0 or not max_events > 0:
        raise ValueError("max_time and max_events must be > 0")
    for name, machine in (("edge", edge), ("cloud", cloud)):
        if not callable(getattr(machine, "handle", None)):
            raise TypeError(f"the {name} machine has no handle(event) method")
    sim = _Simulation(
        edge,
        cloud,
        link,
        (load_profile(edge_profile), load_profile(cloud_profile)),
        (edge_executor, cloud_executor),
        size_fn,
        trace,
        charge_cpu,
    )
    sim.run(max_time, max_events)
    return sim.result()
