"""The cloud server (`wanspec serve`): one target model, many edge sessions at once.

The target is loaded once; every connection gets its own KV-cache session (`new_session()`,
weights shared) and its own `CloudEndpoint`, which learns method, settings and seed from the
edge's handshake. All sessions' model jobs go through ONE model thread that batches them: what
is queued when the model frees up runs as one forward pass over the sessions' own caches
(`wanspec.net.batching`; `max_batch_tokens=0`: one job at a time), so nothing races on torch;
metrics go to `self.metrics` (`wanspec.net.metrics`). Everything else (sockets,
codec, sampling and verification inside the machines) runs on the event loop.

Admission, before any model work: past `max_sessions` a connection gets `Error(BUSY)`; a server
with a token needs an `Auth` frame with it first (`Error(UNAUTHORIZED)` otherwise); frames are
bounded by `max_frame`, requests by `max_new_tokens`. Deadlines: the handshake must arrive
within `handshake_timeout_s`, an edge may stay silent `idle_timeout_s` while nothing computes
for it, a session lasts at most `request_timeout_s`, and one frame's write waits at most
`write_timeout_s` for a peer that does not read (the transport then holds at most
`write_buffer_bytes` plus one frame). Every violation ends that session with an `Error` frame
saying why. A session that fails inside gets `Error(INTERNAL)`; the server and the other sessions
go on. `stop()` (SIGINT/SIGTERM under `wanspec serve`) ends every open session with
`Error(SHUTDOWN)`.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanspec import wire
from wanspec.net.batching import DEFAULT_MAX_BATCH_TOKENS, ModelBatcher
from wanspec.net.client import prompt_encoder
from wanspec.net.driver import (
    DriveResult,
    DriverLimits,
    PeerGone,
    Refusal,
    SendStalled,
    drive,
    receive,
)
from wanspec.net.framing import MessageStream, write_message
from wanspec.net.metrics import ServerMetrics
from wanspec.net.resume import CloudStream, SessionLost
from wanspec.net.service import TcpService
from wanspec.protocols.base import ErrorCode, ProtocolError
from wanspec.protocols.endpoints import TargetInfo
from wanspec.protocols.registry import make_cloud, target_info
from wanspec.protocols.settings import GenerationSettings
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

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
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
    compute_s: dict[str, float] = field(default_factory=dict)  # the same by label (verify, …)
    handle_cpu_s: float = 0.0  # CPU seconds in the protocol machine (sampling, verification)
    loop_cpu_s: float = 0.0  # CPU seconds of the event-loop thread (exact with one session)
    up_bytes: int = 0
    down_bytes: int = 0
    peak_write_buffer: int = 0  # bytes the transport held for a slow reader, at most
    resumable: str = ""  # the resumable session's id (its first 12 characters), if it is one

    def finished_with(self, result: DriveResult) -> None:
        self.outcome = result.finish_reason
        self.rounds = result.computes.get("verify", 0)
        self.forward_s = sum(result.compute_s.values())
        self.compute_s = dict(result.compute_s)
        self.handle_cpu_s = result.handle_cpu_s


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
    """Serves `target_lm` on (host, port). Use as `async with`, or `start()` / `stop()`."""

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
        self._model = ModelBatcher(
            max_batch_tokens, waiters=2 * self.limits.max_sessions + 2, observer=self.metrics
        )
        self._admitted = 0
        self._count = 0
        self._resumable: dict[str, CloudStream] = {}  # open resumable sessions, by id
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> int:
        """Sessions admitted and not yet over."""
        return self._admitted

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
            if self._admitted >= self.limits.max_sessions + self._waiting:
                raise Refusal(
                    ErrorCode.BUSY,
                    f"the server is busy ({self._admitted} sessions, its limit); try again later",
                )
            self._admitted += 1
            admitted = True
            first = await self._admit(stream)
            head = first[0] if first else await receive(stream, self.limits.handshake_timeout_s)
            if isinstance(head, wire.Resume) and head.session in self._resumable:
                self._admitted -= 1
                admitted = False
                await self._attach(record, stream, head)
                return
            if self._admitted > self.limits.max_sessions:
                raise Refusal(ErrorCode.BUSY, "the server is busy; try again later")
            record.finished_with(await self._session(record, stream, head))
        except Refusal as refusal:
            record.outcome = f"refused: {refusal}"
            await self._tell(stream, refusal.code, str(refusal))
            await self._linger(stream)
        except PeerGone as gone:
            record.outcome = f"edge gone: {gone}"
        except SendStalled as stalled:
            record.outcome = f"edge stalled: {stalled}"
            stream.writer.transport.abort()
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            record.outcome = "shutdown"
            await self._tell(stream, ErrorCode.SHUTDOWN, "the server is shutting down")
        except Exception as exc:
            log.exception("session %d failed", record.id)
            record.outcome = f"internal error: {type(exc).__name__}: {exc}"
            await self._tell(stream, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        finally:
            self._admitted -= admitted
            record.duration_s = loop.time() - began
            record.loop_cpu_s = time.thread_time() - cpu
            record.up_bytes = stream.received.payload_bits // 8
            record.down_bytes = stream.sent.payload_bits // 8
            record.peak_write_buffer = stream.sent.peak_buffered_bytes
            self._close(record, stream)

    async def _admit(self, stream: MessageStream) -> tuple[wire.Message, ...]:
        """Check the bearer token before anything else; the messages to hand on."""
        first = await receive(stream, self.limits.handshake_timeout_s)
        if self.token is None:
            return () if isinstance(first, wire.Auth) else (first,)
        if not isinstance(first, wire.Auth):
            raise Refusal(
                ErrorCode.UNAUTHORIZED,
                "this server requires a bearer token (wanspec generate --token, $WANSPEC_TOKEN)",
            )
        if not hmac.compare_digest(first.token.encode(), self.token.encode()):
            raise Refusal(ErrorCode.UNAUTHORIZED, "wrong bearer token")
        return ()

    @property
    def _waiting(self) -> int:
        """Resumable sessions whose edge dropped and may come back."""
        return sum(channel.detached for channel in self._resumable.values())

    async def _session(
        self, record: SessionRecord, stream: MessageStream, head: wire.Message
    ) -> DriveResult:
        """Run one session opened by `head`: a plain one, or a resumable one (`wire.Resume`,
        whose connection may be replaced by the edge's later ones)."""
        if not isinstance(head, wire.Resume):
            result = await self._run(record, stream, (head,), self.info)
            await self._linger(stream)
            return result
        if head.received:
            raise Refusal(
                ErrorCode.LIMIT,
                f"no session {head.session[:12]} here (its grace period passed, or it ended)",
            )
        channel = CloudStream(
            stream, grace_s=self.limits.resume_grace_s, keep=self.limits.replay_messages
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
            raise Refusal(ErrorCode.LIMIT, str(lost)) from None
        await channel.released()
        record.outcome = f"resumed at {resume.committed} committed tokens"

    async def _run(
        self,
        record: SessionRecord,
        stream: MessageStream | CloudStream,
        first: tuple[wire.Message, ...],
        info: TargetInfo,
    ) -> DriveResult:
        limits = self.limits
        session = self.target.new_session()
        return await drive(
            make_cloud(info),
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

    def _inspect(self, record: SessionRecord, msg: wire.Message) -> None:
        """The server's own rules on what an edge asks for, before the machine sees it."""
        if isinstance(msg, wire.Hello):
            record.method = msg.method
        if isinstance(msg, wire.StartRequest):
            asked = msg.settings.get("max_new_tokens", GenerationSettings.max_new_tokens)
            cap = self.limits.max_new_tokens
            if isinstance(asked, int) and asked > cap:
                raise ProtocolError(
                    f"max_new_tokens={asked} is over this server's limit {cap}", ErrorCode.LIMIT
                )

    async def _tell(self, stream: MessageStream, code: ErrorCode, message: str) -> None:
        """Send an Error frame if the edge can still take one (at most a second's wait)."""
        with contextlib.suppress(OSError, TimeoutError, wire.WireError):
            async with asyncio.timeout(1.0):
                await stream.send(wire.Error(int(code), message))

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
