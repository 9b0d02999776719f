"""Sessions that outlive their TCP connection: a replay log under the unchanged driver.

A WAN link drops; the protocol machines must not notice. So resumption lives in the transport,
below `wanspec.net.driver.drive`, which reads and writes a `ResumableStream` exactly as it would
a `MessageStream`. Each side counts the protocol messages it has received in the session and
keeps the last ones it sent (`ReplayLog`). After a reconnection the edge names the session and
its count (`wire.Resume`), the cloud answers with its own (`wire.Resumed`), and each side resends
what the other has not received, in order. The machines therefore see one uninterrupted, ordered
stream of messages and nothing committed is lost or emitted twice. For any seed, greedy or
sampled, a resumed run's tokens are those of an undisturbed run, except where the edge steers
its draws by the clock (`MethodInfo.tokens_follow_timing`, SR-DV's K and M "auto"): the outage
is time it measured, so the law holds but the tokens may differ. No machine, and no clock
inside one, is involved: the machines stay sans-IO.

- `EdgeStream` reconnects by itself: bounded attempts with exponential backoff (`RetryPolicy`).
- `CloudStream` waits for the edge to come back on a new connection (`attach`) for at most
  `grace_s`; then the session is over and its state gone.
- Either raises `SessionLost` (a `ConnectionError`, so the driver reports the peer gone) when
  the session cannot go on: the peer is not back in time, the cloud no longer holds the session,
  or the peer needs a message older than the replay log keeps. The edge then starts a fresh
  session that continues from its committed tokens (`wanspec.net.client.generate_resumable`).

A link that dies silently (no FIN, no reset) is noticed through TCP keepalive (`keep_alive`:
about 11 s of silence) rather than waiting for the session's deadline.

Frames that are cut off by the drop are not counted as received, so they are replayed whole.
Resume/Resumed frames, like `Auth`, are outside the protocol's traffic counters; replayed
protocol frames are counted again (they cross the wire again).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from wanspec import wire
from wanspec.link import HEADER_BYTES, segments
from wanspec.net.framing import (
    ConnectionClosed,
    FrameReader,
    MessageStream,
    TrafficCounter,
    write_message,
)
from wanspec.protocols.base import ErrorCode

Connector = Callable[[], Awaitable[MessageStream]]


class SessionLost(ConnectionError):
    """The session cannot continue on any connection."""


@dataclass(frozen=True)
class RetryPolicy:
    """How an edge reconnects: `attempts` tries, waiting `first_delay_s` before the first and
    `factor` times longer before each next one, never more than `max_delay_s`."""

    attempts: int = 8
    first_delay_s: float = 0.1
    factor: float = 2.0
    max_delay_s: float = 2.0

    def delays(self) -> Iterator[float]:
        delay = self.first_delay_s
        for _ in range(self.attempts):
            yield delay
            delay = min(delay * self.factor, self.max_delay_s)


class ReplayLog:
    """The last `keep` protocol messages one side sent, numbered from 0 within the session."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a replay log must keep at least one message, not {keep}")
        self._entries: deque[wire.Message] = deque(maxlen=keep)
        self.count = 0

    def append(self, msg: wire.Message) -> None:
        self._entries.append(msg)
        self.count += 1

    def since(self, index: int) -> list[wire.Message]:
        """Every message from number `index` on; SessionLost if the log no longer reaches back
        that far (or the peer claims messages never sent)."""
        first = self.count - len(self._entries)
        if not first <= index <= self.count:
            raise SessionLost(
                f"the peer needs messages from #{index}; this side keeps #{first} to "
                f"#{self.count - 1}"
            )
        return list(self._entries)[index - first :]


# A WAN that fails silently (no FIN, no reset) leaves a read waiting forever; TCP keepalive
# probes turn that into a reset after KEEPALIVE_IDLE_S + KEEPALIVE_COUNT * KEEPALIVE_INTERVAL_S
# seconds of silence, so a resumable session notices and reconnects.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 2
KEEPALIVE_COUNT = 3


def keep_alive(writer: asyncio.StreamWriter) -> None:
    """Turn on TCP keepalive with the probes above (where the platform has the options)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    ):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _uncount(counter: TrafficCounter, frame_bytes: int) -> None:
    """Take a transport frame (the first `Resumed`) back out of the protocol's counters."""
    counter.messages -= 1
    counter.payload_bits -= 8 * frame_bytes
    counter.est_tcpip_header_bytes -= HEADER_BYTES * segments(frame_bytes)


def _dropped(stream: MessageStream, exc: BaseException) -> bool:
    """Whether a failed read means the connection dropped (a frame cut off by the end of the
    stream is a drop; a malformed frame on a live stream is the peer's fault)."""
    if isinstance(exc, ConnectionClosed | OSError):
        return True
    return isinstance(exc, wire.WireError) and stream.reader.at_eof()


class ResumableStream:
    """What `drive` reads and writes in place of a `MessageStream`: the session's current
    connection, swapped for a new one after a drop. Traffic counters are the session's."""

    def __init__(self, stream: MessageStream, keep: int = 64) -> None:
        self.limits, self.sent, self.received = stream.limits, stream.sent, stream.received
        self.log = ReplayLog(keep)
        keep_alive(stream.writer)
        self.delivered = 0  # protocol messages handed to the driver
        self.reconnects = 0
        self._stream = stream
        self._broken = False
        self._lock = asyncio.Lock()  # one writer at a time: sends and replays stay in order
        self._released = asyncio.Event()  # set when the current connection is given up

    @property
    def current(self) -> MessageStream:
        return self._stream

    @property
    def detached(self) -> bool:
        """The connection dropped and no new one has taken its place yet."""
        return self._broken

    def wrap(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> MessageStream:
        """A new connection of this session, counted in the session's counters."""
        keep_alive(writer)
        return MessageStream(reader, writer, self.limits, self.sent, self.received)

    async def send(self, msg: wire.Message) -> int:
        """Log the message and write it if the connection is up; after a drop it is replayed on
        the next connection, so a send never waits for a reconnection."""
        async with self._lock:
            self.log.append(msg)
            if not self._broken:
                try:
                    return await self._stream.send(msg)
                except OSError:
                    self._broken = True
            return len(wire.encode(msg, self.limits))

    async def receive(self) -> wire.Message:
        while True:
            stream = self._stream
            try:
                msg = await stream.receive()
            except (ConnectionClosed, OSError, wire.WireError) as exc:
                if not _dropped(stream, exc):
                    raise
                if stream is self._stream:
                    self._broken = True
                    await self._recover(stream, exc)
                continue
            if stream is not self._stream or self._skip(msg):
                continue  # read off a replaced connection: the peer replays it
            self.delivered += 1
            return msg

    def _skip(self, msg: wire.Message) -> bool:
        return False

    async def _recover(self, failed: MessageStream, cause: BaseException) -> None:
        raise NotImplementedError

    async def _install(self, stream: MessageStream, peer_received: int, greeting: object) -> None:
        """Make `stream` the session's connection: send `greeting` (a Resumed, or nothing),
        then every logged message the peer has not received."""
        old = self._stream
        self._stream = stream  # from here on, reads from the old connection are dropped
        old.writer.transport.abort()
        async with self._lock:
            if isinstance(greeting, wire.Resumed):
                await write_message(stream.writer, greeting, self.limits)
            for msg in self.log.since(peer_received):
                await stream.send(msg)
            self._broken = False
            self.reconnects += 1
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def released(self) -> None:
        """Wait until the current connection is replaced or the session ends."""
        await self._released.wait()

    def close(self) -> None:
        """The session is over: release whoever waits on its connection."""
        self._released.set()


class EdgeStream(ResumableStream):
    """The edge's side: after a drop it reconnects (`connect` opens and authenticates a new
    connection) and resumes `session` with the cloud."""

    def __init__(
        self,
        stream: MessageStream,
        *,
        session: str,
        connect: Connector,
        committed: Callable[[], int],
        prefix: tuple[int, ...] = (),
        retry: RetryPolicy = RetryPolicy(),
        reply_timeout_s: float = 10.0,
        keep: int = 64,
    ) -> None:
        super().__init__(stream, keep)
        self.session, self.prefix = session, prefix
        self._connect, self._committed, self._retry = connect, committed, retry
        self._reply_timeout_s = reply_timeout_s
        self._greeted = False  # the first connection's Resumed is the transport's, not ours
        self.lost: str | None = None  # why the session could not be resumed, once it could not

    async def _recover(self, failed: MessageStream, cause: BaseException) -> None:
        try:
            await self._reconnect(cause)
        except SessionLost as lost:
            self.lost = str(lost)
            raise

    def opening(self) -> wire.Resume:
        """The frame that opens the session on its first connection."""
        return wire.Resume(self.session, 0, 0, self.prefix)

    def _skip(self, msg: wire.Message) -> bool:
        if self._greeted:
            return False
        self._greeted = True
        if not (isinstance(msg, wire.Resumed) and msg.received == 0):
            return False  # an Error instead (busy, unauthorized) is the machine's to see
        _uncount(self.received, len(wire.encode(msg, self.limits)))
        return True

    async def _reconnect(self, cause: BaseException) -> None:
        for delay in self._retry.delays():
            await asyncio.sleep(delay)
            try:
                stream = await self._connect()
            except (OSError, ConnectionError, TimeoutError, RuntimeError):
                continue  # not reachable yet (RemoteError is a RuntimeError)
            try:
                peer_received = await self._handshake(stream)
            except SessionLost:
                stream.writer.transport.abort()
                raise
            except (OSError, ConnectionClosed, wire.WireError, TimeoutError):
                stream.writer.transport.abort()
                continue
            self._greeted = True
            await self._install(stream, peer_received, None)
            return
        attempts = self._retry.attempts
        raise SessionLost(f"no way back to the cloud after {attempts} attempts: {cause}")

    async def _handshake(self, stream: MessageStream) -> int:
        resume = wire.Resume(self.session, self.delivered, self._committed(), self.prefix)
        await write_message(stream.writer, resume, self.limits)
        async with asyncio.timeout(self._reply_timeout_s):
            # uncounted; replays read along with it stay in the connection's one decoder
            reply = await FrameReader(stream.reader, self.limits).receive()
        if isinstance(reply, wire.Resumed):
            return reply.received
        if isinstance(reply, wire.Error) and reply.code == ErrorCode.BUSY:
            raise TimeoutError(reply.message)  # no room just now: try again after a while
        if isinstance(reply, wire.Error):
            raise SessionLost(f"the cloud cannot resume the session: {reply.message}")
        raise SessionLost(f"the cloud answered Resume with {type(reply).__name__}")


class CloudStream(ResumableStream):
    """The cloud's side: after a drop it waits up to `grace_s` for the edge to `attach` a new
    connection; the session's state (machine, KV cache) lives on meanwhile. `on_detach(self)`
    is told when that wait begins; `drop` ends it early (the server holds only so many)."""

    def __init__(
        self,
        stream: MessageStream,
        *,
        grace_s: float,
        keep: int = 64,
        on_detach: Callable[[CloudStream], None] | None = None,
    ) -> None:
        super().__init__(stream, keep)
        self.grace_s = grace_s
        self.on_detach = on_detach
        self.detached_since: float | None = None  # loop time the wait for the edge began
        self._attached = asyncio.Condition()
        self._grace: asyncio.Timeout | None = None
        self._dropped: str | None = None
        self._ended = False  # the edge sent Close (or Error): after that, a drop is the end

    async def receive(self) -> wire.Message:
        msg = await super().receive()
        self._ended = self._ended or isinstance(msg, wire.Close | wire.Error)
        return msg

    @property
    def waiting(self) -> bool:
        """Waiting for the edge to come back (and not dropped)."""
        return self._grace is not None and self._dropped is None

    def drop(self, reason: str) -> None:
        """Give the session up now: its wait for the edge ends in SessionLost(`reason`), and
        the edge can no longer attach."""
        self._dropped = reason
        if self._grace is not None and not self._grace.expired():
            self._grace.reschedule(asyncio.get_running_loop().time())

    async def _recover(self, failed: MessageStream, cause: BaseException) -> None:
        if self._ended:  # its Close is the machine's to see, and nobody comes back
            raise SessionLost(f"the edge ended the session and left ({cause})")
        self.detached_since = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(self.grace_s) as grace, self._attached:
                self._grace = grace
                if self.on_detach is not None:
                    self.on_detach(self)
                await self._attached.wait_for(lambda: self._stream is not failed)
        except TimeoutError:
            raise SessionLost(
                self._dropped
                or f"the edge did not come back within the {self.grace_s:g} s grace period "
                f"({cause})"
            ) from None
        finally:
            self._grace = self.detached_since = None

    async def attach(self, stream: MessageStream, peer_received: int) -> None:
        """The edge is back on `stream` (wrapped by `wrap`): answer with this side's count and
        replay what it missed. SessionLost if the log no longer reaches back far enough, or the
        session was dropped."""
        if self._dropped is not None:
            raise SessionLost(self._dropped)
        await self._install(stream, peer_received, wire.Resumed(self.delivered))
        async with self._attached:
            self._attached.notify_all()
