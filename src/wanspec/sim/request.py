"""One request on the simulator: its two machines, what they do, and what it costs.

`RequestRuntime` drives an edge and a cloud state machine only through `handle(event) ->
list[Action]`, on a virtual clock it does not own (the simulator's event loop, `wanspec.sim.many`,
hands it its events in (virtual time, sequence number) order, so runs are deterministic for
deterministic machines, profiles and link seeds). `Compute` queues a job; a side runs its jobs
one at a time in FIFO order, the edge on its own device, the cloud when the shared accelerator
starts them. A job is executed for real on its side's executor (a function running it on that
side's own model session) when it starts (virtual time), and its result is delivered as
`ComputeDone(job_id, result)` when its price says it ends; `Cancel` drops a queued job, or the
result of the running one (each side's queue, cancels, emits and tallies are a
`wanspec.runtime.SideRuntime`, as in the network driver). `Send` encodes the message with the
wire codec, charges its exact size to the link (edge→cloud on the uplink, cloud→edge on the
downlink) and delivers the DECODED message as `MessageReceived(msg)`, so the machines see
exactly what a network peer would.

With `charge_cpu=True` the machines' own CPU takes virtual time too, as it does on real peers:
each `handle(event)` call, the encoding of every message a side sends and the decoding of every
message it receives are timed on this machine's wall clock (`time.perf_counter`) and charged to
that side. A side's protocol CPU is one serial time line (`ProtocolCpu`; a server's sessions
share the cloud's): an event that comes while it is still busy waits, and what a handler does
(sends, jobs, emits, finishing) happens when its CPU time is over. The models run beside it (a
job that runs is not slowed by a handler), as the network driver's event loop and model worker
do; a job queued by a handler starts when the handler ends. Off by default: wall-clock readings
would make the virtual times differ from run to run.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from wanspec.jobs import ComputeCost, Executor
from wanspec.protocols.base import (
    Compute,
    ComputeDone,
    Event,
    MessageReceived,
    Send,
    Side,
    Start,
    StateMachine,
)
from wanspec.runtime import (
    SENDS_ON,
    Direction,
    EmitRecord,
    QueuedCompute,
    SideRuntime,
    SimResult,
    TraceRecord,
    TypeTally,
    job_label,
)
from wanspec.sim.link import Channel, Link
from wanspec.sim.profiles import Profile

SizeFn = Callable[[Any], int]
Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]
_OTHER: dict[str, Side] = {"edge": "cloud", "cloud": "edge"}


class SimulationError(RuntimeError):
    """The simulated run could not complete."""


class SimulationDeadlock(SimulationError):
    """Both sides are idle, nothing is in flight, and the edge has not finished."""


class SimulationTimeout(SimulationError):
    """The virtual clock passed max_time, or more than max_events events were processed."""


@dataclass
class ProtocolCpu:
    """The time line of a side's protocol CPU: when it is next free (virtual seconds). The cloud
    sides of the sessions on one server share one (its one event loop)."""

    free_at: float = 0.0


@dataclass
class _Side:
    name: Side
    machine: StateMachine
    profile: Profile
    channel: Channel
    executor: Executor
    cpu: ProtocolCpu
    runtime: SideRuntime  # its queue, cancels, emits, finish and tallies
    busy: bool = False  # its device is computing (a job, or a long prefill's piece)
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


class RequestRuntime:
    """The bookkeeping of one request (see the module's docstring), on a clock and a cloud
    accelerator that belong to the event loop: `schedule(t, side, event)` puts one of its events
    on the clock, which hands it back to `handle`; `cloud_ready(t)` says, after each cloud
    handler, that the cloud side may have a job to start from `t`, which the accelerator starts
    with `start_cloud_job` (or a long prefill's piece with `start_cloud_piece`). `start_s`: when
    the request starts on that clock; its result's times count from there."""

    def __init__(
        self,
        edge: StateMachine,
        cloud: StateMachine,
        link: Link,
        profiles: tuple[Profile, Profile],
        executors: tuple[Executor, Executor],
        *,
        schedule: Callable[[float, Side, Event], None],
        cloud_ready: Callable[[float], None],
        cloud_cpu: ProtocolCpu,
        size_fn: SizeFn | None = None,
        trace: bool = False,
        charge_cpu: bool = False,
        start_s: float = 0.0,
    ) -> None:
        up, down = link.channel("up"), link.channel("down")
        self.emits: list[EmitRecord] = []
        self.sent = TypeTally()  # both directions: each message counted once, when sent
        edge_rt, cloud_rt = (
            SideRuntime(
                name,
                emits=self.emits,
                sent=self.sent,
                trace=functools.partial(self.record, name) if trace else None,
            )
            for name in ("edge", "cloud")
        )
        self.sides: dict[Side, _Side] = {
            "edge": _Side("edge", edge, profiles[0], up, executors[0], ProtocolCpu(), edge_rt),
            "cloud": _Side("cloud", cloud, profiles[1], down, executors[1], cloud_cpu, cloud_rt),
        }
        self.schedule, self.cloud_ready = schedule, cloud_ready
        self.size_fn = size_fn
        self.codec = _wire_codec() if size_fn is None else None
        self.start_s = self.now = start_s
        self.bits: dict[Direction, int] = {"up": 0, "down": 0}
        self.messages: dict[Direction, int] = {"up": 0, "down": 0}
        self.retransmissions: dict[Direction, int] = {"up": 0, "down": 0}
        self.trace: list[TraceRecord] | None = [] if trace else None
        self.events = 0
        self.charge_cpu = charge_cpu
        self.decode_s: dict[int, float] = {}  # id(MessageReceived) -> its decoding's CPU

    @property
    def finish(self) -> str | None:
        """The edge's finish reason, once it has finished."""
        return self.sides["edge"].runtime.finish

    @property
    def cloud_finish(self) -> str | None:
        return self.sides["cloud"].runtime.finish

    @property
    def finished(self) -> bool:
        """The edge has sent `Finish`: the request is over."""
        return self.finish is not None

    def start(self) -> None:
        """Schedule `Start()` to the cloud, then the edge, at the request's start."""
        self.schedule(self.start_s, "cloud", Start(self.start_s))
        self.schedule(self.start_s, "edge", Start(self.start_s))

    def handle(self, t: float, side: Side, event: Event) -> None:
        """One of its events is due at `t` (dropped once the request is over: alone, the run
        would have ended at its `Finish`)."""
        if self.finished:
            return
        self.now = t
        self.events += 1
        self._dispatch(self.sides[side], event)

    def record(self, side: Side, what: str, **info: Any) -> None:
        if self.trace is not None:
            self.trace.append(TraceRecord(self.now, side, what, info))

    # ------------------------------------------------------------------ one event
    def _dispatch(self, side: _Side, event: Event) -> None:
        if self.charge_cpu and side.cpu.free_at > self.now:
            self.schedule(side.cpu.free_at, side.name, event)  # the side's CPU is busy until then
            return
        if isinstance(event, ComputeDone):
            side.busy = False
            wanted = side.runtime.end_job(event.job_id)
            self.record(side.name, "compute_end", job_id=event.job_id)
            if not wanted:  # cancelled while it ran
                self._start_next(side)
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
            self._charge(side, time.perf_counter() - began)
            if isinstance(event, MessageReceived):
                decode_s = self.decode_s.pop(id(event), 0.0)
                side.codec_s += decode_s
                self._charge(side, decode_s)
        if not isinstance(actions, list | tuple):
            raise TypeError(
                f"{side.name}.handle() must return a list of actions, got {type(actions).__name__}"
            )
        for action in actions:
            self._apply(side, action)
        if self.charge_cpu:
            side.cpu.free_at = self.now
        if not self.finished:
            self._start_next(side)

    def _charge(self, side: _Side, seconds: float) -> None:
        """`seconds` of `side`'s protocol CPU: what it does next happens that much later."""
        side.cpu_s += seconds
        self.now += seconds

    def _apply(self, side: _Side, action: Any) -> None:
        if isinstance(action, Send):
            self._send(side, action.msg)
        else:
            side.runtime.apply(action, self.now)

    def _send(self, side: _Side, msg: Any) -> None:
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
                self._charge(side, encoded - began)
        else:
            size = _as_bits(self.size_fn(msg), msg)
        direction = SENDS_ON[side.name]
        tx = side.channel.transmit(self.now, size)
        self.bits[direction] += size
        self.messages[direction] += 1
        self.retransmissions[direction] += tx.retries
        kind = side.runtime.sent.add(msg, size)
        self.record(
            side.name,
            "send",
            type=kind,
            bits=size,
            arrival=tx.arrival,
            retries=tx.retries,
            msg=sent,
        )
        received = MessageReceived(msg, tx.arrival, size)
        if self.charge_cpu and decode_s:
            self.decode_s[id(received)] = decode_s
        self.schedule(tx.arrival, _OTHER[side.name], received)

    # ------------------------------------------------------------------ compute
    def _start_next(self, side: _Side) -> None:
        """The edge starts its next job if it is free; the cloud's waits for the accelerator."""
        if side.name == "cloud":
            self.cloud_ready(self.now)
        elif not side.busy and side.runtime.queue:
            self._start(side)

    def _start(self, side: _Side, seconds: float | None = None) -> float:
        """Start `side`'s next job now: run it, and deliver its result `seconds` later (None: what
        the side's profile charges for it alone). Returns those seconds."""
        action = side.runtime.start_next()
        kind = job_label(action)
        began = time.perf_counter()
        try:
            result = side.executor(action.job)
        except Exception as err:
            err.add_note(f"in {side.name} compute {kind} #{action.job_id} at t={self.now:.6g} s")
            raise
        wall_s = time.perf_counter() - began
        duration = side.profile.seconds(action.cost, wall_s) if seconds is None else seconds
        if not duration >= 0 or math.isinf(duration):
            raise ValueError(
                f"profile {side.profile.name!r} priced {action.cost} at {duration!r} s"
            )
        side.busy = True
        side.runtime.charge(kind, duration)
        self.record(side.name, "compute_start", job=kind, cost=action.cost, seconds=duration)
        done = self.now + duration
        self.schedule(done, side.name, ComputeDone(action.job_id, result, done))
        return duration

    def cloud_head(self) -> tuple[Compute, float] | None:
        """The cloud job next in line and when it was queued, if the accelerator may start it:
        the request is running, the cloud side free (its previous job done) and a job queued."""
        cloud = self.sides["cloud"]
        if self.finished or cloud.busy or not cloud.runtime.queue:
            return None
        return cloud.runtime.queue[0]

    def start_cloud_job(self, at: float, seconds: float | None = None) -> float:
        """The accelerator starts the cloud's next job at `at`, for `seconds` (None: priced by
        the cloud profile alone). Returns the seconds it takes."""
        self.now = at
        return self._start(self.sides["cloud"], seconds)

    def start_cloud_piece(self, at: float, cost: ComputeCost, seconds: float) -> None:
        """The accelerator starts a pass over a piece (before the last) of the cloud's next job, a
        long prefill: the side is busy for `seconds`; the job runs with its last piece."""
        self.now, cloud = at, self.sides["cloud"]
        kind = job_label(cloud.runtime.queue[0].action)
        cloud.busy = True
        cloud.runtime.charge(kind, seconds, job=False)
        self.record("cloud", "compute_piece", job=kind, cost=cost, seconds=seconds)

    def end_cloud_piece(self, at: float, job_id: int) -> bool:
        """A piece's pass is over at `at`: the cloud side is free, and job `job_id`, unless it was
        cancelled meanwhile, goes back to the end of the queue for its next piece (True)."""
        cloud = self.sides["cloud"]
        cloud.busy = False
        queue = cloud.runtime.queue
        if not queue or queue[0].action.job_id != job_id:
            return False
        queue[0] = QueuedCompute(queue[0].action, at)
        return True

    # ------------------------------------------------------------------ the end
    def deadlock_message(self) -> str:
        note = f"; the cloud finished with {self.cloud_finish!r}" if self.cloud_finish else ""
        return (
            f"deadlock at t={self.now:.6g} s: both sides idle, no message or computation in "
            f"flight, and the edge has not sent Finish{note}"
        )

    def result(self) -> SimResult:
        """What was measured, every time counted from the request's start."""
        assert self.finish is not None
        res = SimResult(
            finish_reason=self.finish,
            duration_s=self.now,
            emits=self.emits,
            bits=self.bits,
            messages=self.messages,
            bits_by_type=self.sent.bits,
            messages_by_type=self.sent.messages,
            compute_busy_s={name: s.runtime.busy_s for name, s in self.sides.items()},
            compute_by_tag={name: dict(s.runtime.compute_s) for name, s in self.sides.items()},
            computes={name: s.runtime.jobs_run for name, s in self.sides.items()},
            computes_by_tag={name: dict(s.runtime.computes) for name, s in self.sides.items()},
            retransmissions=self.retransmissions,
            events=self.events,
            cloud_finish=self.cloud_finish,
            trace=self.trace,
            protocol_cpu_s=self._cpu_seconds("cpu_s"),
            codec_cpu_s=self._cpu_seconds("codec_s"),
        )
        t0 = self.start_s
        if t0 == 0:
            return res
        emits = [replace(e, t=e.t - t0) for e in res.emits]
        trace = None if res.trace is None else [replace(r, t=r.t - t0) for r in res.trace]
        return replace(res, duration_s=res.duration_s - t0, emits=emits, trace=trace)

    def _cpu_seconds(self, what: str) -> dict[Side, float] | None:
        if not self.charge_cpu:
            return None
        return {name: getattr(s, what) for name, s in self.sides.items()}
