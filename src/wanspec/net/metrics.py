"""Prometheus metrics of a `wanspec serve` server (`--metrics-port P` serves them over HTTP).

Every server keeps a `ServerMetrics` in a registry of its own (so several servers in one process
do not mix); `serve_http` exposes it at http://HOST:P/metrics. What is measured, and where:

- from each session's frames as they cross the socket (`ObservedStream`): payload bits and
  frames by direction and message type; per verified draft the drafted tokens, the accepted
  ones and which positions were accepted; the verify latency (a draft's arrival to its
  verdict's departure: queueing, the batched pass and the sampling together); every `Error`
  frame the server sends, by its code;
- from the model thread (`wanspec.net.batching`): queue wait, sessions and tokens per pass, the
  pass's seconds;
- at each session's end (`session_closed`): sessions by method and outcome, edges that vanished
  or stalled (no frame can say so), and the open sessions as a gauge.

Names follow vLLM's where the meaning is the same, under the `wanspec:` prefix:
`spec_decode_num_drafts`, `spec_decode_num_draft_tokens`, `spec_decode_num_accepted_tokens`,
`spec_decode_num_accepted_tokens_per_pos` (label `position`, 0 = the first drafted token),
`iteration_tokens_total` (tokens per model pass) and `num_requests_running`.

Every label value comes from a known set (`method_label`, `outcome_kind`, `error_kind`, message
types, draft positions): an edge chooses what it sends, and a label it could name would grow the
registry, and each scrape, without bound. Anything outside the set is counted as "other".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from wanspec import wire
from wanspec.net.batching import BatchStats
from wanspec.net.framing import MessageStream
from wanspec.protocols.base import ErrorCode
from wanspec.protocols.registry import METHODS, get_method

SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DRAFTS = (wire.Draft, wire.DraftWithDists)
OTHER = "other"  # the label value of anything outside a label's known set
# how sessions end: the machines' finish reasons and the server's own
OUTCOMES = frozenset(
    {"done", "eos", "stop", "length", "closed_by_edge", "cloud_finished", "error", "refused"}
    | {"edge_gone", "edge_stalled", "shutdown", "internal_error", "resumed", "open", "unknown"}
)
# what a session record names instead of a method: none asked yet, a reconnection
SESSION_KINDS = frozenset({"-", "resume"})


def method_label(method: str) -> str:
    """A method as a label value: its registry name (aliases resolved), "-" when none was
    named, "resume" for a reconnection, "other" for anything else an edge sent."""
    if method in METHODS or method in SESSION_KINDS:
        return method
    if not method:
        return "-"
    try:
        return get_method(method).name
    except ValueError:
        return OTHER


def outcome_kind(outcome: str) -> str:
    """A session's outcome as a label value: the part before any ':' ("error: …" -> "error"),
    "other" when that is not a known kind."""
    head = outcome.split(":", 1)[0].strip().lower().replace(" ", "_") or "unknown"
    return head if head in OUTCOMES else OTHER


def error_kind(code: int) -> str:
    """An error code as a label value: its name, or "other" for a code this build lacks."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return OTHER


class ServerMetrics:
    """The server's Prometheus metrics (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        counter, histogram = self._counter, self._histogram
        self.running = Gauge(
            "wanspec:num_requests_running", "Sessions open.", registry=self.registry
        )
        self.requests = counter(
            "requests", "Sessions ended, by method and outcome.", "method", "outcome"
        )
        self.rounds = counter(
            "verify_rounds", "Drafts verified (verdicts sent), by method.", "method"
        )
        self.num_drafts = counter("spec_decode_num_drafts", "Drafts verified.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.num_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each position of their draft (0 = first).",
            "position",
        )
        self.bits = counter("wire_bits", "Payload bits of frames.", "direction", "type")
        self.frames = counter("wire_frames", "Codec frames.", "direction", "type")
        self.errors = counter("errors", "Errors: an Error code sent, or how an edge left.", "kind")
        self.queue_wait = histogram("queue_wait_seconds", "A job's wait.", SECONDS_BUCKETS)
        self.batch_size = histogram("batch_size", "Sessions' jobs per model pass.", SIZE_BUCKETS)
        self.batch_tokens = histogram(
            "iteration_tokens_total", "New tokens per model pass (all sessions).", TOKEN_BUCKETS
        )
        self.batch_seconds = histogram(
            "batch_forward_seconds", "Wall seconds of one model pass.", SECONDS_BUCKETS
        )
        self.verify_latency = histogram(
            "verify_latency_seconds",
            "A draft's arrival to its verdict's departure.",
            SECONDS_BUCKETS,
        )
        self._http: Any = None

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(f"wanspec:{name}", doc, labels, registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"wanspec:{name}", doc, buckets=buckets, registry=self.registry)

    # ------------------------------------------------------------------ hooks
    def track_sessions(self, count: Callable[[], float]) -> None:
        """Read the open-session gauge from `count()` at every scrape."""
        self.running.set_function(count)

    def stream(self, *args: Any, **kwargs: Any) -> ObservedStream:
        """A `MessageStream` whose frames are counted here (MessageStream's arguments)."""
        return ObservedStream(*args, session=SessionObserver(self), **kwargs)

    def batch_done(self, stats: BatchStats) -> None:
        """`BatchObserver`: one pass of the model thread."""
        for wait in stats.queue_wait_s:
            self.queue_wait.observe(wait)
        self.batch_size.observe(stats.sessions)
        self.batch_tokens.observe(stats.tokens)
        self.batch_seconds.observe(stats.seconds)

    def session_closed(self, method: str, outcome: str) -> None:
        kind = outcome_kind(outcome)
        self.requests.labels(method_label(method), kind).inc()
        if kind in ("edge_gone", "edge_stalled", "internal_error"):
            self.errors.labels(kind).inc()

    # ------------------------------------------------------------------ exposition
    def serve_http(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on (host, port) from a daemon thread; returns the port (0: any)."""
        server, _ = start_http_server(port, host, registry=self.registry)
        self._http = server
        return int(server.server_address[1])

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when never set), e.g. value("wanspec:errors_total",
        kind="LIMIT")."""
        return self.registry.get_sample_value(name, labels) or 0.0


@dataclass
class SessionObserver:
    """What one session's frames tell the metrics (see `ServerMetrics`)."""

    metrics: ServerMetrics
    method: str = ""
    drafts: dict[int, tuple[float, int]] = field(default_factory=dict)  # round: arrival, tokens
    verified: set[int] = field(default_factory=set)

    def received(self, msg: wire.Message, frame_bytes: int) -> None:
        self._count("up", msg, frame_bytes)
        if isinstance(msg, wire.Hello):
            self.method = method_label(msg.method)
        elif isinstance(msg, DRAFTS) and msg.round not in self.verified:
            self.drafts.setdefault(msg.round, (time.perf_counter(), len(msg.tokens)))

    def sent(self, msg: wire.Message, frame_bytes: int) -> None:
        self._count("down", msg, frame_bytes)
        if isinstance(msg, wire.Error):
            self.metrics.errors.labels(error_kind(msg.code)).inc()
        elif isinstance(msg, wire.VerifyResult) and msg.round in self.drafts:
            self._verdict(msg)

    def _verdict(self, msg: wire.VerifyResult) -> None:
        arrived, drafted = self.drafts.pop(msg.round)
        self.verified.add(msg.round)
        m = self.metrics
        m.verify_latency.observe(time.perf_counter() - arrived)
        m.rounds.labels(self.method or "-").inc()
        m.num_drafts.inc()
        m.num_draft_tokens.inc(drafted)
        m.num_accepted.inc(msg.accepted)
        for position in range(msg.accepted):
            m.accepted_per_pos.labels(str(position)).inc()

    def _count(self, direction: str, msg: wire.Message, frame_bytes: int) -> None:
        kind = type(msg).__name__
        self.metrics.frames.labels(direction, kind).inc()
        self.metrics.bits.labels(direction, kind).inc(8 * frame_bytes)


@dataclass
class ObservedStream(MessageStream):
    """A `MessageStream` that reports each frame to its session's observer."""

    session: SessionObserver | None = None

    async def send(self, message: wire.Message) -> int:
        size = await super().send(message)
        if self.session is not None:
            self.session.sent(message, size)
        return size

    async def receive(self) -> wire.Message:
        before = self.received.payload_bits
        message = await super().receive()
        if self.session is not None:
            self.session.received(message, (self.received.payload_bits - before) // 8)
        return message
