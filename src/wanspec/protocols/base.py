"""Events, actions and the machine skeleton of the sans-IO protocol layer.

State machines never touch a socket, a clock or a model: drivers feed them events and carry out
the actions they return. Events and actions are plain data. A machine asks for model work with a
`Compute` action carrying a job (`wanspec.models.jobs`) and an id; the driver runs the job on the
machine's own model session and hands the result back as `ComputeDone(id, result)`. All sampling
and every state change happen inside `handle()`, so a machine's output for a seed does not depend
on the driver's timing or threads.

Error policy (one for every machine and driver): whatever the PEER got wrong (a message it
should not have sent in this state, a malformed reply, a request past a limit, and what drivers
and servers enforce: frame limits, timeouts, floods, admission) becomes a `ProtocolError` with its
`ErrorCode`, at whichever event it comes to light; `handle()` (or the driver, for its own) turns it
into the `Error` message `ProtocolError.to_wire()` builds and a `Finish("error: …")` here; an
`Error` from the peer finishes this side too. Anything else that goes wrong is a local bug and
raises out of `handle()`. A message is checked when it arrives, so a peer's mistake is found (and
blamed) before any model work is spent on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from wanspec import wire
from wanspec.jobs import ComputeCost, Job

Side = Literal["edge", "cloud"]
PROTOCOL_VERSION = wire.WIRE_VERSION


class ErrorCode(enum.IntEnum):
    """The `code` of an `Error` message: what kind of failure ended the session."""

    PROTOCOL = 1  # a message out of place or malformed for this state
    VERSION = 2  # protocol versions differ
    MISMATCH = 3  # model or tokenizer fingerprints differ from what the edge expects
    UNSUPPORTED = 4  # unknown method, or a method this pair cannot run
    BAD_SETTINGS = 5
    BUSY = 6  # the server has no room for another session
    LIMIT = 7  # a server limit (frame size, tokens, time) was exceeded
    INTERNAL = 8  # the server failed; the session is over, the server is not
    SHUTDOWN = 9  # the server is stopping
    UNAUTHORIZED = 10  # the server asks for a bearer token and got none or a wrong one


class ProtocolError(RuntimeError):
    """Why this side ends a session, to be told to the peer: mostly what the peer got wrong (a
    message a machine cannot accept, a rule a driver or server enforces), also a server's own
    BUSY, SHUTDOWN or INTERNAL. Whoever raises it, the peer gets `to_wire()`."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL) -> None:
        super().__init__(message)
        self.code = code

    def to_wire(self) -> wire.Error:
        """The `Error` message that tells the peer: the one place such a message is built."""
        return wire.Error(int(self.code), str(self))


ECHO_CHARS = 80  # the most of a peer-chosen value an error message shows


def shown(value: object, limit: int = ECHO_CHARS) -> str:
    """A value the peer chose, as an error message shows it: its repr, cut to `limit` characters
    with an ellipsis, so an error never echoes (or logs) a peer's megabyte back."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = f"<{type(value).__name__} too large to show>"
    return clip(text, limit)


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the last an ellipsis: what a peer made long stays short
    in every reply, record and log line."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def request_rng(seed: int, side: Side) -> np.random.Generator:
    """The edge's and the cloud's independent, reproducible random streams of one request."""
    return np.random.default_rng([seed, 0 if side == "edge" else 1])


class Draw(enum.IntEnum):
    """The draws that have a stream of their own at each output position (SPEC's Randomness
    clause): keyed by position, they do not depend on how chains are cut, on the timing, or on
    which side draws, so every method built on them gives a seed the same tokens wherever its
    law is the same."""

    DRAFT = 2  # the pipelines' proposal there
    COIN = 3  # the cloud's acceptance coin for the token drafted there
    RESIDUAL = 4  # the exact residual at a rejected position, drawn by one side only


def position_rng(seed: int, draw: Draw, position: int) -> np.random.Generator:
    """The stream of one kind of draw at one output position (independent of every other)."""
    return np.random.default_rng([seed, int(draw), position])


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Start:
    """The driver starts the request (edge: begin; cloud: ready to receive)."""

    at: float | None = None  # the driver's clock (virtual or wall) at the start, if it has one


@dataclass(frozen=True)
class MessageReceived:
    msg: Any
    at: float | None = None  # the driver's clock (virtual or wall) at delivery, if it has one
    bits: int | None = None  # what the message took on the link, if the driver counted it


@dataclass(frozen=True)
class ComputeDone:
    job_id: int
    result: Any = None
    at: float | None = None  # the driver's clock when the computation ended


# Machines never read a clock; a driver may stamp events with its own, which a machine may use
# for estimates that steer effort (AceSpec's tree budget), never for what it samples; the one
# exception, xcosd-auto, chooses between two exact mechanisms by it before a round is drafted
# (each round's law stays exact; a seed's tokens then follow the timing).


Event = Start | MessageReceived | ComputeDone


# ----------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Send:
    msg: Any


class Purpose(enum.StrEnum):
    """What a machine computes a job for: `on_compute` is routed by it, and drivers, stats and
    metrics tally jobs by it. A `StrEnum`, so a tally keyed by it is keyed by these exact strings
    (JSON, metric labels and stored results read the same), and a misspelt purpose is an
    AttributeError rather than a job no branch handles."""

    DRAFT = "draft"  # the edge drafts one token of its chain
    EMBED = "embed"  # split inference: the edge embeds tokens for the cloud
    FORWARD = "forward"  # the cloud's next target row (AR, split)
    KEEP = "keep"  # a pipeline keeps the drafted tree's path that the verdict took
    PREFILL = "prefill"  # the cloud reads the prompt before the first draft
    TREE = "tree"  # a pipeline drafts ahead: one pass over every branch tip
    VERIFY = "verify"  # the cloud scores a draft chain in one pass


@dataclass(frozen=True)
class Compute:
    """Run `job` on this side's model session; answer with `ComputeDone(job_id, result)`.

    A side's computations run one at a time, in the order they were asked for."""

    job_id: int
    job: Job
    label: str = ""  # what it is computed for (a machine's `Purpose`): what drivers tally by

    @property
    def cost(self) -> ComputeCost:
        return self.job.cost


@dataclass(frozen=True)
class Cancel:
    """The machine no longer needs computation `job_id`: a queued one never runs, a running
    one's result is dropped (its effect on the cache may or may not have happened)."""

    job_id: int


@dataclass(frozen=True)
class Emit:
    """Tokens finalised for the user (target vocabulary ids), in order."""

    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Finish:
    reason: str  # "length", "eos", "stop", "closed by edge", "error: ..."


Action = Send | Compute | Cancel | Emit | Finish


class StateMachine(Protocol):
    """What a driver needs of a machine."""

    side: Side

    def handle(self, event: Event) -> list[Action]: ...


class Machine:
    """Skeleton every protocol machine shares: the state, the table of messages each state
    accepts (as h11 keeps it), job ids, counters and the one error policy.

    Subclasses set `State` (an enum with a `DONE` member), `EXPECTS` (state -> message types
    accepted then) and implement `on_start`, `on_message` and `on_compute(purpose, result)`,
    which branches on the `Purpose` the job was asked for with. A phase that changes which kinds
    of message the machine accepts is a state, so the table alone decides a kind is in place.
    """

    side: ClassVar[Side]
    EXPECTS: ClassVar[dict[Any, tuple[type, ...]]] = {}

    def __init__(self, state: Any) -> None:
        self.state = state
        self.counters: dict[str, int] = {}
        # the most tokens this side's model session will hold, once its request is admitted
        # (a cloud machine; None before): what a server budgets its memory by
        self.cache_tokens: int | None = None
        self._jobs: dict[int, Purpose] = {}
        self._next_job = 0

    # ---- helpers for subclasses
    def count(self, name: str, k: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + k

    def compute(self, purpose: Purpose, job: Job) -> Compute:
        """A `Compute` action for `job`; its result comes back to `on_compute(purpose, …)`."""
        job_id = self._next_job
        self._next_job += 1
        self._jobs[job_id] = purpose
        return Compute(job_id, job, purpose)

    def cancel_all(self) -> list[Action]:
        """Cancel every computation still outstanding."""
        actions: list[Action] = [Cancel(job_id) for job_id in self._jobs]
        self._jobs.clear()
        return actions

    def cancel(self, kind: Purpose) -> list[Action]:
        """Cancel the outstanding computations asked for this purpose (and only those)."""
        ids = [job_id for job_id, asked in self._jobs.items() if asked is kind]
        for job_id in ids:
            del self._jobs[job_id]
        return [Cancel(job_id) for job_id in ids]

    def finish(self, reason: str) -> list[Action]:
        self.state = type(self.state).DONE
        return [*self.cancel_all(), Finish(reason)]

    def fail(self, exc: ProtocolError) -> list[Action]:
        """The peer broke the protocol: tell it why and end this side."""
        return [Send(exc.to_wire()), *self.finish(f"error: {exc}")]

    @property
    def done(self) -> bool:
        return self.state == type(self.state).DONE

    # ---- the entry point
    def handle(self, event: Event) -> list[Action]:
        if self.done:
            return []
        try:
            return self._dispatch(event)
        except ProtocolError as exc:  # the peer's fault, whichever event brought it to light
            return self.fail(exc)

    def _dispatch(self, event: Event) -> list[Action]:
        if isinstance(event, ComputeDone):
            purpose = self._jobs.pop(event.job_id, None)
            if purpose is None:  # cancelled, or a driver bug
                return []
            return self.on_compute(purpose, event.result)
        if isinstance(event, MessageReceived):
            msg = event.msg
            if isinstance(msg, wire.Error):
                return self.finish(f"error: peer says {msg.message}")
            self.expect(msg)
            return self.on_message(msg)
        if isinstance(event, Start):
            return self.on_start()
        raise TypeError(f"unknown event {event!r}")

    def expect(self, msg: Any) -> None:
        """Raise ProtocolError unless the state table accepts `msg` now."""
        allowed = self.EXPECTS.get(self.state, ())
        if not isinstance(msg, allowed):
            raise ProtocolError(f"unexpected {type(msg).__name__} while {self.state.name.lower()}")

    def on_start(self) -> list[Action]:
        return []

    def on_message(self, msg: Any) -> list[Action]:
        raise NotImplementedError

    def on_compute(self, purpose: Purpose, result: Any) -> list[Action]:
        raise NotImplementedError
