"""The asyncio driver: ONE protocol machine over one real connection, on the wall clock.

The contract is the simulator's (`wanspec.sim.request`), with sockets and threads for the virtual
link and clock: the machine gets `Start`, then every decoded message as `MessageReceived` and
every result as `ComputeDone`, and the driver carries out the actions it returns.

- `Send` writes the message's codec frame (`wanspec.net.framing`), waiting while the peer's
  buffers are full, but never longer than `write_timeout_s`: a peer that stops reading stalls
  only its own session and holds at most the transport's high-water mark plus one frame here.
- `Compute` queues the job; one worker task runs this side's jobs one at a time, in order, on an
  executor thread (`loop.run_in_executor`), so network I/O, and the machine's own reactions to
  messages, carry on while the model works. Results come back as `ComputeDone` in job order.
  Several drivers may share one single-thread executor (a server's model): their jobs then
  interleave one by one, and each driver still sees its own in order.
- `Cancel` drops a queued job, or ignores the result of the running one.
- `Emit` records the tokens with their time (and calls `on_emit`); `Finish` ends the run.
- The queue, the cancels, the emits and the tallies are the simulator's own bookkeeping
  (`wanspec.runtime.SideRuntime`); this driver adds the socket, the worker and the clock. The
  run's record is the simulator's type too (`wanspec.runtime.SimResult`), of this side.
- Messages and results are stamped (`at`) with the seconds since `Start` when they arrived or
  ended, which a machine may use to steer effort (AceSpec's budget), never what it samples.

A machine's output for a seed depends only on the order of the events it handles, so the same
machines give the same tokens here as in the simulator. The driver also enforces what a machine
cannot see: malformed or oversized frames, a silent peer (`idle_timeout_s`, counted only while no
computation is under way), the session's deadline, and a peer that sends message after message
without waiting for an answer (`max_unanswered`). Each is a `ProtocolError` with its code, as a
machine's own are, and ends the run as one that escapes the machine does: with the peer told
(`ProtocolError.to_wire()`) and the finish reason "error: …" here.

Deadlines use `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11 `wait_for` can swallow
a cancellation that races with its result, and a server's `stop()` would then wait forever for
a session that missed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from wanspec import wire
from wanspec.jobs import Job
from wanspec.net.framing import ConnectionClosed, MessageStream
from wanspec.protocols.base import (
    Action,
    Compute,
    ComputeDone,
    Emit,
    ErrorCode,
    Event,
    MessageReceived,
    ProtocolError,
    Send,
    Side,
    Start,
    StateMachine,
)
from wanspec.runtime import SENDS_ON, Direction, SideRuntime, SimResult, job_label

JobRunner = Callable[[Job], Any]
Inspector = Callable[[wire.Message], None]
T = TypeVar("T")


class SessionAborted(Exception):
    """The session ended before the machine finished, with no way left to tell the peer."""


class PeerGone(SessionAborted):
    """The peer closed or reset the connection before the machine finished."""


class PeerClosed(PeerGone):
    """The peer ended its side between two frames (it may still read what this side sends)."""


class SendStalled(SessionAborted):
    """The peer stopped reading: a frame could not be written within the write timeout."""


@dataclass(frozen=True)
class DriverLimits:
    """What the driver enforces on the peer (None: no limit)."""

    idle_timeout_s: float | None = None  # peer silent while nothing computes here
    deadline_s: float | None = None  # the whole session, from Start
    write_timeout_s: float | None = 30.0  # one frame's write, back-pressure included
    max_unanswered: int | None = 64  # peer messages in a row with nothing sent back


# Internal events the reader and the worker hand to the loop beside the machine's own.
@dataclass(frozen=True)
class _Closed:
    reason: str
    clean: bool  # an end of stream between frames: the peer may still read what we send


@dataclass(frozen=True)
class _Malformed:
    error: ProtocolError  # a frame the reader refused, raised in the loop when its turn comes


@dataclass(frozen=True)
class _JobFailed:
    error: BaseException


async def receive(stream: MessageStream, timeout_s: float | None = None) -> wire.Message:
    """The next message. PeerGone when the connection ends; ProtocolError (with the code to
    send) for a malformed or oversized frame, or none within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            return await stream.receive()
    except TimeoutError:
        raise ProtocolError(f"no message within {timeout_s:g} s", ErrorCode.LIMIT) from None
    except ConnectionClosed:
        raise PeerClosed("the peer closed the connection") from None
    except wire.FrameTooLarge as exc:
        raise ProtocolError(f"frame refused: {exc}", ErrorCode.LIMIT) from None
    except wire.WireError as exc:
        raise ProtocolError(f"malformed frame: {exc}", ErrorCode.PROTOCOL) from None
    except OSError as exc:  # resets, TLS failures
        raise PeerGone(f"connection lost: {exc}") from None


def _by_direction(side: Side, sent: T, received: T) -> dict[Direction, T]:
    """What `side` sent and received, keyed by the direction it travelled ("up" first)."""
    if SENDS_ON[side] == "up":
        return {"up": sent, "down": received}
    return {"up": received, "down": sent}


def _timed(run_job: JobRunner, job: Job) -> tuple[Any, float]:
    """Run a job and measure it on the thread that runs it (a shared executor's queueing
    is not the job's time)."""
    began = time.perf_counter()
    return run_job(job), time.perf_counter() - began


class _Run:
    """The state of one `drive` call."""

    def __init__(
        self,
        machine: StateMachine,
        stream: MessageStream,
        run_job: JobRunner,
        executor: Executor | None,
        limits: DriverLimits,
        inspect: Inspector | None,
        on_emit: Callable[[tuple[int, ...]], None] | None,
    ) -> None:
        self.machine, self.stream, self.run_job, self.executor = machine, stream, run_job, executor
        self.limits, self.inspect, self.on_emit = limits, inspect, on_emit
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.events: asyncio.Queue[Any] = asyncio.Queue(maxsize=8)  # a flooding peer waits
        self.side = SideRuntime(machine.side)  # job queue, cancels, emits, finish, tallies
        self.job_queued = asyncio.Event()  # wakes the worker
        self.closed: str | None = None  # why the peer's side ended cleanly, once it has
        self.peer_error: wire.Error | None = None
        self.unanswered = 0
        self.handle_cpu_s = 0.0
        self.n_events = 0

    @property
    def finish(self) -> str | None:
        return self.side.finish

    def now(self) -> float:
        return self.loop.time() - self.t0

    # ------------------------------------------------------------------ helpers (tasks)
    async def read_frames(self) -> None:
        """Decode frames into events until the stream ends; the end itself is an event too."""
        stream = self.stream
        try:
            while True:
                before = stream.received.payload_bits
                msg = await receive(stream)
                bits = stream.received.payload_bits - before
                self.side.received.add(msg, bits)
                await self.events.put(MessageReceived(msg, self.now(), bits))
        except PeerGone as gone:
            await self.events.put(_Closed(str(gone), clean=isinstance(gone, PeerClosed)))
        except ProtocolError as bad:
            await self.events.put(_Malformed(bad))

    async def work(self) -> None:
        """Run queued jobs one at a time, in order; hand each result back as an event."""
        while True:
            if not self.side.queue:
                self.job_queued.clear()
                await self.job_queued.wait()
                continue
            action = self.side.start_next()
            label = job_label(action)
            try:
                result, seconds = await self.loop.run_in_executor(
                    self.executor, _timed, self.run_job, action.job
                )
            except Exception as exc:
                exc.add_note(f"in compute {label} #{action.job_id}")
                await self.events.put(_JobFailed(exc))
                return
            self.side.charge(label, seconds)
            if self.side.end_job(action.job_id):  # else cancelled while it ran
                await self.events.put(ComputeDone(action.job_id, result, self.now()))

    # ------------------------------------------------------------------ the loop
    async def next_event(self) -> Event:
        """The next event for the machine. A peer that closed its side cleanly is gone once
        the machine waits for it with nothing left to compute (until then it may still read)."""
        while True:
            if self.closed is not None and not self.side.awaiting_results and self.events.empty():
                raise PeerGone(self.closed)
            event = await self.wait_event()
            if not isinstance(event, _Closed):
                break
            if not event.clean:
                raise PeerGone(event.reason)
            self.closed = event.reason
        if isinstance(event, _Malformed):
            raise event.error
        if isinstance(event, _JobFailed):
            raise event.error
        return event

    async def wait_event(self) -> Any:
        limits = self.limits
        timeouts: list[float] = []
        if limits.idle_timeout_s is not None and not self.side.awaiting_results:
            timeouts.append(limits.idle_timeout_s)
        if limits.deadline_s is not None:
            timeouts.append(max(0.0, limits.deadline_s - self.now()))
        try:
            async with asyncio.timeout(min(timeouts, default=None)):
                return await self.events.get()
        except TimeoutError:
            if limits.deadline_s is not None and self.now() >= limits.deadline_s:
                raise ProtocolError(
                    f"the session ran past its {limits.deadline_s:g} s deadline", ErrorCode.LIMIT
                ) from None
            raise ProtocolError(
                f"no message from the peer for {limits.idle_timeout_s:g} s", ErrorCode.LIMIT
            ) from None

    async def handle(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            self.check_message(event.msg)
        self.n_events += 1
        began = time.thread_time()
        actions = self.machine.handle(event)
        self.handle_cpu_s += time.thread_time() - began
        for action in actions:
            await self.apply(action)

    def check_message(self, msg: wire.Message) -> None:
        """The driver's rules on a peer message, and `inspect`'s: a ProtocolError refuses it."""
        if isinstance(msg, wire.Error):
            self.peer_error = msg
            return
        self.unanswered += 1
        cap = self.limits.max_unanswered
        if cap is not None and self.unanswered > cap:
            raise ProtocolError(
                f"more than {cap} messages without waiting for one", ErrorCode.LIMIT
            )
        if self.inspect is not None:
            self.inspect(msg)

    async def apply(self, action: Action) -> None:
        msg = self.side.apply(action, self.now())
        if isinstance(action, Send):
            await self.send(msg)
            self.unanswered = 0
        elif isinstance(action, Compute):
            self.job_queued.set()
        elif isinstance(action, Emit) and self.on_emit is not None:
            self.on_emit(self.side.emits[-1].token_ids)

    async def send(self, msg: wire.Message) -> None:
        timeout = self.limits.write_timeout_s
        try:
            async with asyncio.timeout(timeout):
                size = await self.stream.send(msg)
        except TimeoutError:
            raise SendStalled(f"the peer read nothing for {timeout:g} s") from None
        except OSError as exc:  # resets, broken pipes, TLS failures
            raise PeerGone(f"connection lost while sending: {exc}") from None
        self.side.sent.add(msg, 8 * size)

    async def refuse(self, error: ProtocolError) -> None:
        """Tell the peer why the session ends; if it cannot be told, it is gone anyway."""
        self.side.finish = f"error: {error}"
        with contextlib.suppress(SessionAborted):
            await self.send(error.to_wire())

    def result(self) -> SimResult:
        """This side's record: traffic totals from the connection's counters, the rest from the
        runtime (the other side's entries are absent)."""
        side, name = self.side, self.side.side
        assert side.finish is not None
        counters = _by_direction(name, self.stream.sent, self.stream.received)
        tallies = _by_direction(name, side.sent, side.received)
        both = side.sent.merged(side.received)
        return SimResult(
            finish_reason=side.finish,
            duration_s=self.now(),
            emits=side.emits,
            bits={d: c.payload_bits for d, c in counters.items()},
            messages={d: c.messages for d, c in counters.items()},
            bits_by_type=both.bits,
            messages_by_type=both.messages,
            compute_busy_s={name: side.busy_s},
            compute_by_tag={name: side.compute_s},
            computes={name: side.jobs_run},
            computes_by_tag={name: side.computes},
            retransmissions={"up": 0, "down": 0},
            events=self.n_events,
            handle_cpu_s={name: self.handle_cpu_s},
            traffic_by_type={d: t.pairs() for d, t in tallies.items()},
        )


async def drive(
    machine: StateMachine,
    stream: MessageStream,
    run_job: JobRunner,
    executor: Executor | None = None,
    *,
    limits: DriverLimits = DriverLimits(),
    first: Iterable[wire.Message] = (),
    inspect: Inspector | None = None,
    on_emit: Callable[[tuple[int, ...]], None] | None = None,
) -> tuple[SimResult, wire.Error | None]:
    """Run `machine` over `stream` until it finishes; return what the run measured (this side's
    record) and the `Error` frame the peer sent, if it sent one.

    `run_job(job)` runs one job on this side's model session, on `executor` (None: the loop's
    default; give a single-thread one, since a session must not run two jobs at once).
    `first`: messages the caller already read from the stream, handed over before any other.
    `inspect(msg)` may refuse a peer message by raising `ProtocolError(message, code)`.

    Returns when the machine finishes, or when a `ProtocolError` (the driver's, `inspect`'s or
    one the machine let out) ends the run with its `Error` frame sent; either way the finish
    reason says so. Raises `PeerGone` or `SendStalled` when the connection fails first; anything
    else raised by `machine.handle` or a job is a local bug and propagates. The stream is left
    open.
    """
    run = _Run(machine, stream, run_job, executor, limits, inspect, on_emit)
    helpers = [asyncio.create_task(run.read_frames()), asyncio.create_task(run.work())]
    try:
        await run.handle(Start(run.now()))
        for msg in first:
            bits = 8 * len(wire.encode(msg, stream.limits))
            run.side.received.add(msg, bits)
            if run.finish is None:
                await run.handle(MessageReceived(msg, run.now(), bits))
        while run.finish is None:
            await run.handle(await run.next_event())
    except ProtocolError as error:
        await run.refuse(error)
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
    return run.result(), run.peer_error
