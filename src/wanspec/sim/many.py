"""The simulator's event loop: requests on one virtual clock, their cloud jobs on one accelerator.

Each edge session is one request (`wanspec.sim.request.RequestRuntime`): an edge machine, its
cloud machine, its own link (own settings, own channels) and its own executors (its own KV-cache
sessions); `simulate` is one session here, alone. What the sessions share is the clock and the
cloud's accelerator. It batches continuously, as `wanspec serve`'s model thread does, by the very
same policy (`wanspec.models.batch_policy`): whenever it frees up it looks at the next job of
every session that has one queued (one job per session per pass, since a session's jobs build on
each other's cache), oldest first, and `next_pass` picks the pass: the oldest always, then each
later `Forward` that keeps rows × the longest row within `max_batch_tokens` (a job that does not
fit waits, a later smaller one may still join; any other job runs alone). The pass is priced by
the cloud profile's `batch_seconds` (`T(tokens, sessions)`, see `wanspec.sim.profiles`); a job
alone in its pass, by the profile's price of that job. A `Forward` longer than `prefill_chunk` (a
long prompt) takes one pass per piece (`prefill_pieces`), each piece going back to the end of the
queue when its pass ends, as the server re-queues it; the job itself runs whole on the session's
executor at its last piece, so its result is what it gets alone, and its `ComputeDone` comes when
that piece ends.

With several sessions the accelerator looks for jobs after the events already due, so that jobs
queued at one instant share a pass; a lone session's jobs start the moment they may, as on a
device of its own. Nothing here knows a protocol, and machines' outputs do not depend on timing,
so a session's tokens for a seed are those it gets alone; sessions that never overlap each time
as alone (as long as no prompt is fed in pieces: `prefill_chunk=0` feeds every prompt in one
pass, as `simulate` does).

With `charge_cpu=True` each side's protocol CPU is charged (`wanspec.sim.request`); the cloud
sides of all sessions share one CPU time line, as a server's sessions share its one event loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wanspec.jobs import ComputeCost, Executor, Forward, Job, split_forward
from wanspec.models.batch_policy import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PREFILL_CHUNK,
    QueuedJob,
    next_pass,
    padded_tokens,
)
from wanspec.protocols.base import Compute, Event, Side, StateMachine
from wanspec.sim.link import Link
from wanspec.sim.profiles import Profile, batch_seconds, load_profile
from wanspec.sim.request import (
    ProtocolCpu,
    RequestRuntime,
    SimResult,
    SimulationDeadlock,
    SimulationTimeout,
    SizeFn,
)

_CLOUD_WIDE = -1  # session index of the shared accelerator's own events


@dataclass(frozen=True)
class EdgeSession:
    """One edge's request: its machines, its link, its executors, when it starts."""

    edge: StateMachine
    cloud: StateMachine
    link: Link
    edge_executor: Executor
    cloud_executor: Executor
    edge_profile: Profile | str = "measured"
    start_s: float = 0.0


@dataclass(frozen=True)
class BatchPass:
    """One pass of the shared accelerator: which sessions rode in it (in queue order), how many
    new tokens, and how long each of their jobs (or prefill pieces) had waited in the queue
    before it began; `padded_tokens` is what the pass computed, rows × the longest row."""

    start: float
    seconds: float
    sessions: tuple[int, ...]
    tokens: int
    waits: tuple[float, ...]
    padded_tokens: int = 0


@dataclass
class ManyResult:
    """`sessions[i]` is session i's `SimResult` on its own clock (t = 0 at its start); its cloud
    busy time counts every pass it rode in whole. `passes` are on the shared clock; `events`
    counts every event the loop handled, the accelerator's own included."""

    sessions: list[SimResult]
    starts: list[float]
    passes: list[BatchPass]
    events: int

    @property
    def cloud_busy_s(self) -> float:
        """Time the shared accelerator spent in passes."""
        return sum(p.seconds for p in self.passes)

    @property
    def end_s(self) -> float:
        """When the last session finished (shared clock)."""
        return max(s + r.duration_s for s, r in zip(self.starts, self.sessions, strict=True))

    @property
    def mean_batch_sessions(self) -> float:
        return sum(len(p.sessions) for p in self.passes) / len(self.passes) if self.passes else 0


class _Session:
    """A request on the shared cloud: its runtime, and where its next cloud job stands in the
    accelerator's queue (the passes it still takes, and its place when a pass re-queued it)."""

    def __init__(
        self,
        index: int,
        spec: EdgeSession,
        cloud: _SharedCloud,
        size_fn: SizeFn | None,
        trace: bool,
        charge_cpu: bool = False,
    ) -> None:
        self.index, self.prefill_chunk = index, cloud.prefill_chunk

        def schedule(t: float, side: Side, event: Event) -> None:
            cloud.push(t, index, side, event)

        self.request = RequestRuntime(
            spec.edge,
            spec.cloud,
            spec.link,
            (load_profile(spec.edge_profile), cloud.profile),
            (spec.edge_executor, spec.cloud_executor),
            schedule=schedule,
            cloud_ready=cloud.want_pass,
            cloud_cpu=cloud.cpu,
            size_fn=size_fn,
            trace=trace,
            charge_cpu=charge_cpu,
            start_s=spec.start_s,
        )
        self.pieces: list[ComputeCost] = []  # the queued job's passes still to come
        self.pieces_of: int | None = None  # the job id `pieces` belong to
        self.split = False  # that job is a long prefill fed in pieces
        self.put_back: int | None = None  # its place in the pass whose end re-queued its piece

    def waiting(self, by: float) -> bool:
        """A cloud job is queued by `by` (a handler charged CPU time queues it when it ends)
        and this session's previous one is done."""
        head = self.request.cloud_head()
        return head is not None and head[1] <= by

    def _head(self) -> tuple[Compute, float]:
        head = self.request.cloud_head()
        assert head is not None, "only a waiting session is in the queue"
        return head

    def _passes(self) -> list[ComputeCost]:
        """The costs of the passes the queued job still takes: its own, or its pieces'."""
        head, _ = self._head()
        if self.pieces_of != head.job_id:
            self.pieces = _piece_costs(head.job, self.prefill_chunk)
            self.pieces_of, self.split, self.put_back = head.job_id, len(self.pieces) > 1, None
        return self.pieces

    def next_cost(self) -> ComputeCost:
        """What this session's next pass computes: its queued job, or that job's next piece."""
        return self._passes()[0]

    def queued(self) -> QueuedJob:
        """What the batching policy sees of this session's next pass."""
        forward = isinstance(self._head()[0].job, Forward)
        return QueuedJob(self.next_cost().n if forward else 0, forward)

    def queued_at(self) -> float:
        return self._head()[1]

    def order(self) -> tuple[float, int, int]:
        """Queue order: when the next pass's job was queued; at one time, pieces the accelerator
        re-queued at a pass's end (in that pass's order) come before jobs by session index."""
        self._passes()
        at = self.queued_at()
        return (at, 0, self.put_back) if self.put_back is not None else (at, 1, self.index)

    @property
    def before_last_piece(self) -> bool:
        return len(self._passes()) > 1

    def ride(self, at: float, pass_s: float | None) -> float:
        """Start this session's next cloud pass at `at`, priced `pass_s` (None: its job alone,
        priced by the profile): a piece before a long prefill's last only takes the time; the
        job itself starts with its last piece. Returns what it was charged."""
        if self.before_last_piece and pass_s is not None:
            self.request.start_cloud_piece(at, self.pieces.pop(0), pass_s)
            return pass_s
        return self.request.start_cloud_job(at, pass_s)

    def piece_done(self, now: float, place: int) -> None:
        """A piece's pass is over: the job's next piece goes back to the end of the queue (unless
        the job was cancelled meanwhile)."""
        assert self.pieces_of is not None
        if self.request.end_cloud_piece(now, self.pieces_of):
            self.put_back = place


def _piece_costs(job: Job, prefill_chunk: int) -> list[ComputeCost]:
    """The cost of each pass `job` takes: a `Forward` over `prefill_chunk` tokens one per piece
    (each after the cache its earlier pieces built), anything else its own."""
    if not isinstance(job, Forward):
        return [job.cost]
    return [piece.cost for piece in split_forward(job, prefill_chunk)]


@dataclass(order=True)
class _Entry:
    t: float
    seq: int
    index: int = field(compare=False)
    side: Side = field(compare=False)
    event: Any = field(compare=False)


class _Kick:
    """The accelerator looks for queued jobs (after the events already due now)."""


class _PassEnd:
    """A pass is over; pushed after its sessions' `ComputeDone`s, so they are handled first."""


class _LateKick:
    """A job was queued at the end of a handler charged CPU time: look for it then."""


class _SharedCloud:
    """The one event loop: the clock and event queue of all sessions, the accelerator their
    cloud jobs share, and the protocol CPU their cloud handlers share (the server's)."""

    def __init__(self, profile: Profile, max_batch_tokens: int, prefill_chunk: int) -> None:
        self.profile, self.max_batch_tokens = profile, max_batch_tokens
        self.prefill_chunk = prefill_chunk
        self.in_pieces: list[_Session] = []  # the pass's riders on a piece before their last
        self.sessions: list[_Session] = []
        self.heap: list[_Entry] = []
        self.seq = self.events = 0
        self.now = 0.0
        self.in_pass = self.kick_due = False
        self.passes: list[BatchPass] = []
        self.cpu = ProtocolCpu()  # every session's cloud handlers

    @property
    def alone(self) -> bool:
        """One session: no other job could ever join its job's pass."""
        return len(self.sessions) == 1

    def push(self, t: float, index: int, side: Side, event: Any) -> None:
        heapq.heappush(self.heap, _Entry(t, self.seq, index, side, event))
        self.seq += 1

    def want_pass(self, t: float) -> None:
        """A session's cloud side may have a job to start from `t`. Alone, it starts at once, as
        on a device of its own; else after the events already due now (so jobs queued at one
        instant share a pass), or at `t` when a handler charged CPU time queued it later."""
        if self.alone:
            self.start_pass(t)
        elif t > self.now:
            self.push(t, _CLOUD_WIDE, "cloud", _LateKick())
        elif not self.in_pass and not self.kick_due:
            self.kick_due = True
            self.push(self.now, _CLOUD_WIDE, "cloud", _Kick())

    def run(self, max_time: float, max_events: int) -> None:
        for s in self.sessions:
            s.request.start()
        while any(not s.request.finished for s in self.sessions):
            if not self.heap:
                raise SimulationDeadlock(self._deadlock_message())
            entry = heapq.heappop(self.heap)
            self._check_limits(entry, max_time, max_events)
            self.now = entry.t
            self._handle(entry)

    def _check_limits(self, entry: _Entry, max_time: float, max_events: int) -> None:
        if entry.t > max_time:
            unfinished = sum(not s.request.finished for s in self.sessions)
            who = "the edge" if self.alone else f"{unfinished} sessions"
            raise SimulationTimeout(
                f"virtual time passed max_time={max_time} s (next event at {entry.t:.6g} s: "
                f"{self._describe(entry)}) before {who} finished"
            )
        self.events += 1
        if self.events > max_events:
            raise SimulationTimeout(
                f"more than max_events={max_events} events by t={entry.t:.6g} s; a livelock?"
            )

    def _describe(self, entry: _Entry) -> str:
        name = type(entry.event).__name__.lstrip("_")
        if entry.index == _CLOUD_WIDE:
            return f"the accelerator's {name}"
        return f"{name} to {entry.side}" + ("" if self.alone else f" of session {entry.index}")

    def _handle(self, entry: _Entry) -> None:
        if entry.index == _CLOUD_WIDE:
            if isinstance(entry.event, _Kick):
                self.kick_due = False
            elif isinstance(entry.event, _PassEnd):
                self.in_pass = False
                for place, session in enumerate(self.in_pieces):
                    session.piece_done(self.now, place)
                self.in_pieces = []
            self.start_pass(self.now)
            return
        self.sessions[entry.index].request.handle(entry.t, entry.side, entry.event)

    def start_pass(self, at: float) -> None:
        """Start the next pass at `at`, if the accelerator is free and a job waits."""
        if self.in_pass:
            return
        riders = self._pick_riders(at)
        if not riders:
            return
        costs = [s.next_cost() for s in riders]
        priced = len(riders) > 1 or riders[0].split  # else the profile prices the job alone
        pass_s = batch_seconds(self.profile, costs) if priced else None
        waits = tuple(at - s.queued_at() for s in riders)
        self.in_pieces = [s for s in riders if s.before_last_piece]
        charged = [s.ride(at, pass_s) for s in riders]
        seconds = max(charged)
        rows = [c.n for c in costs if c.kind != "cpu"]
        indices = tuple(s.index for s in riders)
        self.passes.append(BatchPass(at, seconds, indices, sum(rows), waits, padded_tokens(rows)))
        if self.alone and not self.in_pieces:
            return  # its job's ComputeDone frees the accelerator: the session is busy till then
        self.in_pass = True
        self.push(at + seconds, _CLOUD_WIDE, "cloud", _PassEnd())

    def _pick_riders(self, at: float) -> list[_Session]:
        """The sessions whose next jobs `batch_policy.next_pass` puts in the pass starting at
        `at`, in queue order (oldest first)."""
        waiting = sorted((s for s in self.sessions if s.waiting(at)), key=_Session.order)
        chosen = next_pass([s.queued() for s in waiting], self.max_batch_tokens)
        return [waiting[i] for i in chosen]

    def _deadlock_message(self) -> str:
        if self.alone:
            return self.sessions[0].request.deadlock_message()
        stuck = [s.index for s in self.sessions if not s.request.finished]
        return (
            f"deadlock at t={self.now:.6g} s: nothing in flight and sessions {stuck} have not "
            "finished"
        )


def simulate_many(
    sessions: Sequence[EdgeSession],
    cloud_profile: Profile | str,
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    size_fn: SizeFn | None = None,
    max_time: float = 1e5,
    max_events: int = 10_000_000,
    trace: bool = False,
    charge_cpu: bool = False,
) -> ManyResult:
    """Run every session to its edge's `Finish` on one shared cloud accelerator.

    Each session is what `simulate(edge, cloud, link, edge_profile, cloud_profile, ...)` would run
    alone; `start_s` staggers their starts. Several sessions need a cloud profile that prices a
    batched pass (a table profile; "measured" prices only what it measures, so with it a prompt
    is never fed in pieces). `max_batch_tokens` and `prefill_chunk` mean what they mean to
    `wanspec serve` (0: one job per pass; a prompt in one pass). `charge_cpu` charges the
    machines' protocol CPU (`wanspec.sim.request`), the sessions' cloud handlers on one shared
    time line. Raises SimulationDeadlock if everything goes idle before every edge finished,
    SimulationTimeout past max_time virtual seconds or max_events events.
    """
    if not sessions:
        raise ValueError("simulate_many needs at least one session")
    for name, value in (("max_batch_tokens", max_batch_tokens), ("prefill_chunk", prefill_chunk)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not max_time > 0 or not max_events > 0:
        raise ValueError("max_time and max_events must be > 0")
    profile = load_profile(cloud_profile)
    if not hasattr(profile, "batch_seconds"):
        if len(sessions) > 1:
            batch_seconds(profile, [])  # raises the explanation
        prefill_chunk = 0  # a piece cannot be priced by a profile that charges what it measures
    cloud = _SharedCloud(profile, max_batch_tokens, prefill_chunk)
    for i, spec in enumerate(sessions):
        _check_session(i, spec)
        cloud.sessions.append(_Session(i, spec, cloud, size_fn, trace, charge_cpu))
    cloud.run(max_time, max_events)
    results = [s.request.result() for s in cloud.sessions]
    starts = [s.request.start_s for s in cloud.sessions]
    return ManyResult(results, starts, cloud.passes, cloud.events)


def _check_session(index: int, spec: EdgeSession) -> None:
    if not isinstance(spec, EdgeSession):
        raise TypeError(f"session {index} is a {type(spec).__name__}, not an EdgeSession")
    if not isinstance(spec.link, Link):
        raise TypeError(f"session {index}: link must be a wanspec Link")
    if not spec.start_s >= 0:
        raise ValueError(f"session {index}: start_s must be >= 0, got {spec.start_s!r}")
    for name, machine in (("edge", spec.edge), ("cloud", spec.cloud)):
        if not callable(getattr(machine, "handle", None)):
            raise TypeError(f"session {index}: the {name} machine has no handle(event) method")


__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "BatchPass", "EdgeSession", "ManyResult", "simulate_many"]
