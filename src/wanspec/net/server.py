"""The cloud server (`wanspec serve`): one target model, many edge sessions at once.

The target is loaded once; every connection gets its own KV-cache session (`new_session()`,
weights shared) and its own `CloudEndpoint`, which learns method, settings and seed from the
edge's handshake. All sessions' model jobs go through ONE model thread that batches them: what
is queued when the model frees up runs as one forward pass over the sessions' own caches
(`wanspec.net.batching`; `max_batch_tokens=0`: one job at a time), so nothing races on torch;
metrics go to `self.metrics` (`wanspec.net.metrics`). Everything else (sockets,
codec, sampling and verification inside the machines) runs on the event loop.

Admission, before any model work: a server with a token needs an `Auth` frame with it first
(`Error(UNAUTHORIZED)` otherwise); frames are bounded by `max_frame`, requests by
`max_new_tokens`. A session slot is taken only once the edge has shaken hands (its token, then
its first protocol frame): past `max_sessions` such sessions it gets `Error(BUSY)`. Until then a
connection is one of at most `max_pending_handshakes` pending handshakes, `max_pending_per_peer`
of them from one address; past either, the oldest that has waited `pending_evict_after_s` is
dropped with `Error(BUSY)`, so silent sockets cannot keep authenticated edges out. A resumable
session whose edge dropped without `Close` is held for it (`resume_grace_s`) outside the slots,
at most `max_held_sessions` at once: past that the one held longest is dropped. With a
`max_kv_bytes` budget, a session whose KV-cache estimate (its prompt's tokens plus
`max_new_tokens`, times the target's bytes per cached token) does not fit in what the open
sessions left of it gets `Error(LIMIT)` once the request is admitted, before its prefill; the
share is reserved until the session ends (a held one included). Deadlines: the
handshake must arrive within `handshake_timeout_s`, an edge may stay silent `idle_timeout_s`
while nothing computes for it, a session lasts at most `request_timeout_s`, and one frame's write
waits at most `write_timeout_s` for a peer that does not read (the transport then holds at most
`write_buffer_bytes` plus one frame). Every violation is a `ProtocolError` with its code and
ends that session with the `Error` frame `ProtocolError.to_wire()` builds. A session that fails
inside gets `Error(INTERNAL)`; the server and the other sessions go on. `stop()` (SIGINT/SIGTERM
under `wanspec serve`) ends every open session with `Error(SHUTDOWN)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanspec import wire
from wanspec.models.registry import prompt_encoder
from wanspec.net.batching import DEFAULT_MAX_BATCH_TOKENS, DEFAULT_PREFILL_CHUNK, ModelBatcher
from wanspec.net.driver import (
    DriverLimits,
    PeerGone,
    SendStalled,
    drive,
    receive,
)
from wanspec.net.framing import MessageStream, write_message
from wanspec.net.metrics import ServerMetrics, method_label
from wanspec.net.resume import CloudStream, SessionLost
from wanspec.net.service import TcpService
from wanspec.protocols.base import Action, ErrorCode, Event, ProtocolError, Purpose, clip
from wanspec.protocols.endpoints import CloudEndpoint, TargetInfo
from wanspec.protocols.registry import make_cloud, target_info
from wanspec.protocols.settings import GenerationSettings
from wanspec.runtime import SimResult
from wanspec.vocab import VocabAlignment

log = logging.getLogger("wanspec.serve")


@dataclass(frozen=True)
class ServerLimits:
    max_sessions: int = 8
    max_frame: int = wire.DEFAULT_LIMITS.max_frame
    max_new_tokens: int = 4096
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    write_timeout_s: float = 30.0
    write_buffer_bytes: int = 64 << 10
    max_unanswered: int = 64  # edge messages in a row before the cloud answers one
    linger_s: float = 2.0  # after a session, read what the edge still sends (no RST on close)
    resume_grace_s: float = 30.0  # a resumable session waits this long for a dropped edge
    replay_messages: int = 64  # sent messages a resumable session keeps for a replay
    max_held_sessions: int = 4  # sessions waiting for a dropped edge, outside max_sessions
    max_pending_handshakes: int = 64  # connections not yet handshaken, from everywhere
    max_pending_per_peer: int = 4  # the same from one address (soft: only old ones are dropped)
    pending_evict_after_s: float = 1.0  # a pending handshake this old may give way to a new one
    max_kv_bytes: int | None = None  # all open sessions' KV-cache estimates together (None: any)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is None and name == "max_kv_bytes":
                continue
            if not value > 0:
                raise ValueError(f"server limit {name} must be > 0, got {value!r}")


@dataclass
class SessionRecord:
    """One connection, as the server saw it (seconds on the wall clock)."""

    id: int
    peer: str
    method: str = ""
    outcome: str = "open"  # the cloud's finish reason, or why the session ended otherwise
    duration_s: float = 0.0
    rounds: int = 0  # verification passes
    forward_s: float = 0.0  # wall seconds of this session's model jobs
    compute_s: dict[str, float] = field(default_factory=dict)  # the same by `Purpose`
    handle_cpu_s: float = 0.0  # CPU seconds in the protocol machine (sampling, verification)
    loop_cpu_s: float = 0.0  # CPU seconds of the event-loop thread (exact with one session)
    up_bytes: int = 0
    down_bytes: int = 0
    peak_write_buffer: int = 0  # bytes the transport held for a slow reader, at most
    resumable: str = ""  # the resumable session's id (its first 12 characters), if it is one

    def finished_with(self, result: SimResult) -> None:
        """Take the cloud's figures from its record of the session."""
        compute_s = result.compute_by_tag["cloud"]
        self.outcome = clip(result.finish_reason, OUTCOME_CHARS)
        self.rounds = result.computes_by_tag["cloud"].get(Purpose.VERIFY, 0)
        self.forward_s = sum(compute_s.values())
        self.compute_s = dict(compute_s)
        self.handle_cpu_s = (result.handle_cpu_s or {}).get("cloud", 0.0)


@dataclass
class PendingHandshake:
    """A connection that has not shaken hands yet: its address, since when it waits (loop
    time) and its deadline, which `drop` brings forward to now."""

    key: int
    host: str
    since: float
    deadline: asyncio.Timeout | None = None
    dropped: bool = False

    def drop(self) -> None:
        self.dropped = True
        if self.deadline is not None and not self.deadline.expired():
            self.deadline.reschedule(asyncio.get_running_loop().time())


class KvReserving:
    """A session's cloud machine behind the server's shared KV-cache budget. The machine alone
    knows when its request is admitted (`cache_tokens`); right then, before the model work that
    event asked for leaves, `reserve(tokens)` takes the session's bytes or raises LIMIT, which
    ends the session as the machine's own errors do. `reserved`: bytes to give back at the end."""

    side = "cloud"

    def __init__(self, machine: CloudEndpoint, reserve: Callable[[int], int]) -> None:
        self.machine, self.reserve = machine, reserve
        self.reserved = 0
        self._asked = False

    def handle(self, event: Event) -> list[Action]:
        actions = self.machine.handle(event)
        tokens = self.machine.cache_tokens
        if tokens is None or self._asked or self.machine.done:
            return actions
        self._asked = True
        try:
            self.reserved = self.reserve(tokens)
        except ProtocolError as exc:
            return self.machine.fail(exc)  # the actions (the prefill) never run
        return actions


def format_bytes(count: int) -> str:
    """`count` bytes, exact and in binary units: "536870912 bytes (512 MiB)"."""
    size, unit = float(count), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{count} bytes" if unit == "bytes" else f"{count} bytes ({size:.3g} {unit})"


OUTCOME_CHARS = 300  # of a session's outcome kept in its record and its log line


def build_target_info(target_lm: Any, draft_tokenizers: Sequence[Any] = ()) -> TargetInfo:
    """The server's `TargetInfo`: the target's own tokenizer (any shared-vocabulary draft) and an
    alignment for each draft tokenizer given (an edge with another one is refused)."""
    tokenizer = target_lm.tokenizer
    alignments = tuple(
        VocabAlignment.build(draft, tokenizer, target_width=target_lm.vocab_size)
        for draft in draft_tokenizers
    )
    return target_info(target_lm, prompt_encoder(tokenizer), alignments)


def server_tls(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A TLS context presenting `cert` (PEM chain) with its private `key`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(Path(cert).expanduser()), str(Path(key).expanduser()))
    return context


class CloudServer(TcpService):
    """Serves `target_lm` on (host, port). Use as `async with`, or `start()` / `stop()`.

    `max_batch_tokens` and `prefill_chunk` (0: a prompt's prefill in one pass) go to the model
    thread (`ModelBatcher`)."""

    kind = "server"

    def __init__(
        self,
        target_lm: Any,
        info: TargetInfo,
        *,
        host: str = "127.0.0.1",
        port: int = 7070,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        limits: ServerLimits | None = None,
        on_close: Callable[[SessionRecord], None] | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        metrics: ServerMetrics | None = None,
    ) -> None:
        super().__init__()
        self.target, self.info = target_lm, info
        self.host, self.port, self.token, self.tls = host, port, token or None, tls
        self.limits = limits or ServerLimits()
        self.on_close = on_close
        self.records: deque[SessionRecord] = deque(maxlen=1024)
        self.wire_limits = wire.Limits(max_frame=self.limits.max_frame).with_vocab(
            info.vocab.target_width
        )
        self.metrics = metrics or ServerMetrics()
        self.metrics.track_sessions(lambda: self._admitted)
        # every session's jobs on one model thread, batched across sessions (0: one by one)
        sessions = self.limits.max_sessions + self.limits.max_held_sessions
        self._model = ModelBatcher(
            max_batch_tokens,
            prefill_chunk=prefill_chunk,
            waiters=2 * sessions + 2,
            observer=self.metrics,
        )
        self._admitted = 0
        self._count = 0
        self._resumable: dict[str, CloudStream] = {}  # open resumable sessions, by id
        self._pending: dict[int, PendingHandshake] = {}  # by record id, oldest first
        self._kv_reserved = 0  # bytes the open sessions' KV-cache estimates hold of the budget
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> int:
        """Sessions admitted and not yet over (those held for a dropped edge included)."""
        return self._admitted

    @property
    def held(self) -> int:
        """Resumable sessions whose edge dropped and may come back."""
        return sum(channel.detached for channel in self._resumable.values())

    @property
    def pending(self) -> int:
        """Connections that have not shaken hands yet."""
        return len(self._pending)

    @property
    def kv_reserved(self) -> int:
        """Bytes of `max_kv_bytes` the open sessions' KV-cache estimates hold."""
        return self._kv_reserved

    async def start(self) -> None:
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl": self.tls, "ssl_handshake_timeout": self.limits.handshake_timeout_s}
        self._server = await asyncio.start_server(self._on_client, self.host, self.port, **tls)

    async def stop(self) -> None:
        """Stop listening; end every open session with Error(SHUTDOWN)."""
        self._stopping = True
        await super().stop()
        self._model.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one connection
    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve the connection (in a task `stop` may cancel)."""
        peer = writer.get_extra_info("peername")
        record = SessionRecord(self._count, f"{peer[0]}:{peer[1]}" if peer else "?")
        self._count += 1
        await self.serve_in_own_task(
            self._serve(record, self.metrics.stream(reader, writer, self.wire_limits))
        )

    async def _serve(self, record: SessionRecord, stream: MessageStream) -> None:
        stream.writer.transport.set_write_buffer_limits(high=self.limits.write_buffer_bytes)
        loop = asyncio.get_running_loop()
        began, cpu = loop.time(), time.thread_time()
        admitted = False
        try:
            head = await self._handshake(record, stream)
            if isinstance(head, wire.Resume) and head.session in self._resumable:
                await self._attach(record, stream, head)  # back to its session: no new slot
                return
            live = self._admitted - self.held
            if live >= self.limits.max_sessions:
                raise ProtocolError(
                    f"the server is busy ({live} sessions, its limit); try again later",
                    ErrorCode.BUSY,
                )
            self._admitted += 1
            admitted = True
            record.finished_with(await self._session(record, stream, head))
        except ProtocolError as refusal:
            record.outcome = clip(f"refused: {refusal}", OUTCOME_CHARS)
            await self._tell(stream, refusal)
            await self._linger(stream)
        except PeerGone as gone:
            record.outcome = clip(f"edge gone: {gone}", OUTCOME_CHARS)
        except SendStalled as stalled:
            record.outcome = clip(f"edge stalled: {stalled}", OUTCOME_CHARS)
            stream.writer.transport.abort()
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            record.outcome = "shutdown"
            await self._tell(
                stream, ProtocolError("the server is shutting down", ErrorCode.SHUTDOWN)
            )
        except Exception as exc:
            log.exception("session %d failed", record.id)
            record.outcome = clip(f"internal error: {type(exc).__name__}: {exc}", OUTCOME_CHARS)
            internal = ProtocolError(f"internal error: {type(exc).__name__}", ErrorCode.INTERNAL)
            await self._tell(stream, internal)
        finally:
            self._admitted -= admitted
            record.duration_s = loop.time() - began
            record.loop_cpu_s = time.thread_time() - cpu
            record.up_bytes = stream.received.payload_bits // 8
            record.down_bytes = stream.sent.payload_bits // 8
            record.peak_write_buffer = stream.sent.peak_buffered_bytes
            self._close(record, stream)

    async def _handshake(self, record: SessionRecord, stream: MessageStream) -> wire.Message:
        """The connection's first protocol frame, after the bearer token if the server wants
        one, all within `handshake_timeout_s`. Meanwhile it holds no session slot, only a
        place among the pending handshakes (`_pend`), which a newer one may take over."""
        peer = stream.writer.get_extra_info("peername")
        pending = self._pend(record.id, str(peer[0]) if peer else "?")
        timeout = self.limits.handshake_timeout_s
        try:
            async with asyncio.timeout(timeout) as deadline:
                pending.deadline = deadline
                first = await receive(stream)
                if self.token is not None:
                    self._check_token(first)
                if isinstance(first, wire.Auth):
                    first = await receive(stream)
                return first
        except TimeoutError:
            if pending.dropped:
                raise ProtocolError(
                    "too many connections are shaking hands with this server; try again later",
                    ErrorCode.BUSY,
                ) from None
            raise ProtocolError(f"no handshake within {timeout:g} s", ErrorCode.LIMIT) from None
        finally:
            self._pending.pop(pending.key, None)

    def _check_token(self, first: wire.Message) -> None:
        assert self.token is not None
        if not isinstance(first, wire.Auth):
            raise ProtocolError(
                "this server requires a bearer token (wanspec generate --token, $WANSPEC_TOKEN)",
                ErrorCode.UNAUTHORIZED,
            )
        if not hmac.compare_digest(first.token.encode(), self.token.encode()):
            raise ProtocolError("wrong bearer token", ErrorCode.UNAUTHORIZED)

    def _pend(self, key: int, host: str) -> PendingHandshake:
        """Count a new connection among the pending handshakes. Past `max_pending_per_peer`
        from its address, that address's oldest one that has waited `pending_evict_after_s` is
        dropped (fresh ones stay: a burst of edges behind one NAT or proxy is no attack); past
        `max_pending_handshakes` in all, the oldest such one anywhere is, and when none has
        waited that long the newcomer is refused."""
        limits, now = self.limits, asyncio.get_running_loop().time()
        mine = [p for p in self._pending.values() if p.host == host]
        if len(mine) >= limits.max_pending_per_peer:
            self._drop_oldest(mine, now)
        crowded = len(self._pending) >= limits.max_pending_handshakes
        if crowded and not self._drop_oldest(self._pending.values(), now):
            raise ProtocolError(
                "too many connections are shaking hands with this server; try again later",
                ErrorCode.BUSY,
            )
        pending = PendingHandshake(key, host, now)
        self._pending[key] = pending
        return pending

    def _drop_oldest(self, candidates: Iterable[PendingHandshake], now: float) -> bool:
        """Drop the oldest of `candidates` (oldest first) that has waited long enough."""
        for pending in candidates:
            if now - pending.since >= self.limits.pending_evict_after_s:
                del self._pending[pending.key]
                pending.drop()
                return True
        return False

    async def _session(
        self, record: SessionRecord, stream: MessageStream, head: wire.Message
    ) -> SimResult:
        """Run one session opened by `head`: a plain one, or a resumable one (`wire.Resume`,
        whose connection may be replaced by the edge's later ones)."""
        if not isinstance(head, wire.Resume):
            result = await self._run(record, stream, (head,), self.info)
            await self._linger(stream)
            return result
        if head.received:
            raise ProtocolError(
                f"no session {head.session[:12]} here (its grace period passed, or it ended)",
                ErrorCode.LIMIT,
            )
        channel = CloudStream(
            stream,
            grace_s=self.limits.resume_grace_s,
            keep=self.limits.replay_messages,
            on_detach=self._hold,
        )
        self._resumable[head.session] = channel
        record.resumable = head.session[:12]
        try:
            await write_message(stream.writer, wire.Resumed(0), stream.limits)  # not counted
            result = await self._run(record, channel, (), self._continuing(head.prefix))
            await self._linger(channel.current)
            return result
        finally:
            del self._resumable[head.session]
            channel.close()
            if channel.current is not stream:
                channel.current.writer.close()

    def _hold(self, channel: CloudStream) -> None:
        """A resumable session's edge dropped without `Close`: hold at most
        `max_held_sessions` such sessions for their edges, dropping the longest held first, so
        that edges which vanished cannot keep new ones out for a whole grace period."""
        held = sorted(
            (c for c in self._resumable.values() if c.waiting),
            key=lambda c: c.detached_since or 0.0,
        )
        cap = self.limits.max_held_sessions
        for old in held[: max(0, len(held) - cap)]:
            old.drop(f"the server holds at most {cap} sessions for edges that dropped")

    def _continuing(self, prefix: tuple[int, ...]) -> TargetInfo:
        """The target as a session that continues after `prefix` sees it: every prompt is
        followed by those committed ids (exactly, never re-tokenized)."""
        if not prefix:
            return self.info
        encode = self.info.encode
        return dataclasses.replace(self.info, encode=lambda text: [*encode(text), *prefix])

    async def _attach(
        self, record: SessionRecord, stream: MessageStream, resume: wire.Resume
    ) -> None:
        """The edge of a resumable session is back on this connection: hand it to the session
        and serve it until the session ends or the edge reconnects again."""
        channel = self._resumable[resume.session]
        record.resumable = resume.session[:12]
        record.method = "resume"
        try:
            await channel.attach(channel.wrap(stream.reader, stream.writer), resume.received)
        except SessionLost as lost:
            raise ProtocolError(str(lost), ErrorCode.LIMIT) from None
        await channel.released()
        record.outcome = f"resumed: at {resume.committed} committed tokens"

    async def _run(
        self,
        record: SessionRecord,
        stream: MessageStream | CloudStream,
        first: tuple[wire.Message, ...],
        info: TargetInfo,
    ) -> SimResult:
        """Drive the session's cloud machine; returns its record of the session."""
        limits = self.limits
        session = self.target.new_session()
        machine = KvReserving(make_cloud(info), functools.partial(self._reserve_kv, info))
        try:
            result, _ = await drive(
                machine,
                stream,  # type: ignore[arg-type]  # a CloudStream reads and writes like one
                self._model.runner(session),
                self._model,
                limits=DriverLimits(
                    idle_timeout_s=limits.idle_timeout_s,
                    deadline_s=limits.request_timeout_s,
                    write_timeout_s=limits.write_timeout_s,
                    max_unanswered=limits.max_unanswered,
                ),
                first=first,
                inspect=functools.partial(self._inspect, record),
            )
        finally:
            self._kv_reserved -= machine.reserved
        return result

    def _reserve_kv(self, info: TargetInfo, tokens: int) -> int:
        """Take a session's KV-cache estimate (`tokens` cached at most) out of `max_kv_bytes`;
        returns the bytes taken (0 without a budget or an estimate). LIMIT when the session could
        never fit; BUSY (worth a retry) when only what the open sessions hold is in the way."""
        budget, per_token = self.limits.max_kv_bytes, info.kv_bytes_per_token
        if budget is None or per_token is None:
            return 0
        need, held = tokens * per_token, self._kv_reserved
        estimate = (
            f"this session's KV cache needs about {format_bytes(need)} "
            f"({tokens} tokens of {per_token} bytes)"
        )
        if need > budget:
            raise ProtocolError(
                f"{estimate}, over this server's KV-cache budget of {format_bytes(budget)}",
                ErrorCode.LIMIT,
            )
        if held + need > budget:
            raise ProtocolError(
                f"{estimate}, but open sessions hold {format_bytes(held)} of this server's "
                f"KV-cache budget of {format_bytes(budget)}; try again later",
                ErrorCode.BUSY,
            )
        self._kv_reserved += need
        return need

    def _inspect(self, record: SessionRecord, msg: wire.Message) -> None:
        """The server's own rules on what an edge asks for, before the machine sees it."""
        if isinstance(msg, wire.Hello):
            record.method = method_label(msg.method)
        if isinstance(msg, wire.StartRequest):
            asked = msg.settings.get("max_new_tokens", GenerationSettings.max_new_tokens)
            cap = self.limits.max_new_tokens
            if isinstance(asked, int) and asked > cap:
                raise ProtocolError(
                    f"max_new_tokens={asked} is over this server's limit {cap}", ErrorCode.LIMIT
                )

    async def _tell(self, stream: MessageStream, error: ProtocolError) -> None:
        """Send `error`'s Error frame if the edge can still take one (at most a second's wait)."""
        with contextlib.suppress(OSError, TimeoutError, wire.WireError):
            async with asyncio.timeout(1.0):
                await stream.send(error.to_wire())

    async def _linger(self, stream: MessageStream) -> None:
        """Half-close, then read what the edge still sends (a Close, a draft in flight) until it
        closes too, for at most `linger_s` and 1 MiB: closing a socket with unread bytes makes
        the kernel reset the connection, which can destroy the last frames we sent."""
        writer = stream.writer
        with contextlib.suppress(OSError, TimeoutError):
            if writer.can_write_eof():
                writer.write_eof()
            deadline = asyncio.get_running_loop().time() + self.limits.linger_s
            left = 1 << 20
            while left > 0:
                remaining = deadline - asyncio.get_running_loop().time()
                async with asyncio.timeout(max(remaining, 0)):
                    data = await stream.reader.read(64 << 10)
                if not data:
                    return
                left -= len(data)

    def _close(self, record: SessionRecord, stream: MessageStream) -> None:
        if not stream.writer.is_closing():
            stream.writer.close()
        self.records.append(record)
        self.metrics.session_closed(record.method, record.outcome)
        log.info(
            "session %d %s %s: %s after %.2f s, %d rounds, up %d B, down %d B",
            record.id,
            record.peer,
            record.method or "-",
            record.outcome,
            record.duration_s,
            record.rounds,
            record.up_bytes,
            record.down_bytes,
        )
        if self.on_close is not None:
            self.on_close(record)
