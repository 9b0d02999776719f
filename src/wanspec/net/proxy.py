"""A transparent TCP proxy that emulates a WAN link: rate, delay, jitter and loss per direction.

The kernel here has no `netem`, so delay and jitter are added in user space, timed by the one
link model the simulator uses too (`wanspec.link`, stated there). Each accepted
connection gets its own upstream connection and its own pair of `Shaper`s ("up" carries what the
connecting client sends, i.e. edge→cloud when the edge connects; "down" the replies), so
connections never share a bottleneck: each one sees the link as if it were alone on it, which is
what the simulator models too.

One direction is two tasks around a queue. The reading task takes bytes from the sender in
chunks worth about 10 ms of link time (at least one MSS, at most 16 KiB), asks the shaper for the
chunk's delivery time, and then waits until the link is nearly free before it reads again, so the
sender's excess stays in its own socket buffer, as it would behind a real bottleneck. The
delivering task sleeps until each chunk's time, writes it and waits for the receiver to take it.
Back-pressure: the bytes held between the two (read, not yet taken by the receiver) are capped,
so a receiver that stops reading stops the proxy from reading the sender, and the proxy's memory
stays bounded whatever the peers do.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from wanspec.link import MSS, DirectionSpec, Shaper
from wanspec.net.service import TcpService

_MAX_CHUNK = 16 << 10  # bytes read from a sender at once
_CHUNK_S = 0.010  # link time one read aims to cover (keeps bytes from waiting on later ones)
_READ_AHEAD_S = 0.010  # start reading this long before the link runs dry (timer slack)
_MIN_BUFFER = 256 << 10  # bytes held per direction, at least ...
_MAX_BUFFER = 8 << 20  # ... and at most (an unlimited rate uses this)

Address = tuple[str, int]


@dataclass
class DirectionStats:
    """What one direction of one connection carried. `buffered` is what the proxy holds now
    (read from the sender, not yet taken by the receiver); `peak_buffered` its maximum."""

    bytes: int = 0
    chunks: int = 0
    delayed_chunks: int = 0  # chunks that waited for at least one retransmission timeout
    buffered: int = 0
    peak_buffered: int = 0


@dataclass
class ConnectionStats:
    """One proxied connection: times on the event loop's clock, `error` if it ended abnormally."""

    id: int
    client: Address
    opened_s: float
    up: DirectionStats = field(default_factory=DirectionStats)
    down: DirectionStats = field(default_factory=DirectionStats)
    closed_s: float | None = None
    error: str | None = None


def chunk_bytes(spec: DirectionSpec) -> int:
    """How much one read takes from the sender: ~10 ms of link time, within [MSS, 16 KiB]."""
    if math.isinf(spec.rate_bps):
        return _MAX_CHUNK
    return int(min(_MAX_CHUNK, max(MSS, spec.rate_bps * _CHUNK_S / 8)))


def default_buffer_bytes(spec: DirectionSpec) -> int:
    """A cap on the bytes held for one direction that never limits the set rate: twice the
    bytes in flight while a chunk propagates, jitters and waits out a retransmission."""
    if math.isinf(spec.rate_bps):
        return _MAX_BUFFER
    loss_wait = 3 * spec.timeout_s if spec.loss else 0.0
    hold_s = spec.delay_s + 4 * spec.jitter_s + loss_wait + 2 * _CHUNK_S + _READ_AHEAD_S
    return int(min(_MAX_BUFFER, max(_MIN_BUFFER, 2 * spec.rate_bps / 8 * hold_s)))


class _Pipe:
    """One direction of one connection: read from `source`, shape, deliver to `sink`."""

    def __init__(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        shaper: Shaper,
        stats: DirectionStats,
        buffer_bytes: int,
    ) -> None:
        self._source, self._sink, self._shaper, self._stats = source, sink, shaper, stats
        self._limit = buffer_bytes
        self._chunk = chunk_bytes(shaper.spec)
        self._read_ahead_s = 2 * shaper.spec.serialise_s(self._chunk) + _READ_AHEAD_S
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self._room = asyncio.Condition()

    async def read_side(self) -> None:
        """Read chunks at the link's pace while there is room; queue them with their times."""
        loop = asyncio.get_running_loop()
        while True:
            async with self._room:
                await self._room.wait_for(lambda: self._stats.buffered < self._limit)
            data = await self._source.read(self._chunk)
            slot = self._shaper.admit(loop.time(), len(data))
            self._queue.put_nowait((slot.deliver, data))
            if not data:  # end of stream: the FIN travels like the data ahead of it
                return
            self._hold(len(data), slot.retries)
            await asyncio.sleep(max(0.0, slot.sent - self._read_ahead_s - loop.time()))

    async def deliver_side(self) -> None:
        """Deliver each chunk at its time, in order; pass the end of stream on as a half-close."""
        loop = asyncio.get_running_loop()
        while True:
            deliver, data = await self._queue.get()
            await asyncio.sleep(max(0.0, deliver - loop.time()))
            if not data:
                if self._sink.can_write_eof():
                    self._sink.write_eof()
                return
            self._sink.write(data)
            await self._sink.drain()
            self._stats.bytes += len(data)
            async with self._room:
                self._stats.buffered -= len(data)
                self._room.notify_all()

    def _hold(self, nbytes: int, retries: int) -> None:
        stats = self._stats
        stats.chunks += 1
        stats.delayed_chunks += retries > 0
        stats.buffered += nbytes
        stats.peak_buffered = max(stats.peak_buffered, stats.buffered)


class WanProxy(TcpService):
    """Accepts TCP connections on `listen` and relays each to `upstream` through an emulated
    WAN link (`up`: client→upstream, `down`: upstream→client). Use as `async with` or call
    `start()` / `stop()` (which drops every open connection). `max_buffer` caps the bytes held
    per direction of a connection (default: `default_buffer_bytes`). `on_close` is called with
    each finished connection."""

    def __init__(
        self,
        listen: Address,
        upstream: Address,
        up: DirectionSpec | None = None,
        down: DirectionSpec | None = None,
        seed: int = 0,
        max_buffer: int | None = None,
        connect_timeout_s: float = 10.0,
        on_close: Callable[[ConnectionStats], None] | None = None,
    ) -> None:
        self.listen, self.upstream = listen, upstream
        self.up, self.down = up or DirectionSpec(), down or DirectionSpec()
        self.seed, self.max_buffer = seed, max_buffer
        self.connect_timeout_s, self.on_close = connect_timeout_s, on_close
        self.connections: list[ConnectionStats] = []
        super().__init__()

    @property
    def active(self) -> int:
        """Connections being relayed now."""
        return len(self._tasks)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, *self.listen)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay one connection (in a task `stop` may cancel)."""
        loop = asyncio.get_running_loop()
        peer = writer.get_extra_info("peername")
        conn = ConnectionStats(len(self.connections), peer, loop.time())
        self.connections.append(conn)
        await self.serve_in_own_task(self._relay(conn, reader, writer))

    async def _relay(
        self, conn: ConnectionStats, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Connect upstream and run both directions; any socket error closes both sides."""
        writers = [writer]
        try:
            opening = asyncio.open_connection(*self.upstream)
            async with asyncio.timeout(self.connect_timeout_s):  # never swallows a cancel
                up_reader, up_writer = await opening
            writers.append(up_writer)
            pipes = (
                self._pipe(reader, up_writer, self.up, conn, 0),
                self._pipe(up_reader, writer, self.down, conn, 1),
            )
            async with asyncio.TaskGroup() as group:
                for pipe in pipes:
                    group.create_task(pipe.read_side())
                    group.create_task(pipe.deliver_side())
        except* OSError as failure:  # resets, broken pipes, refused or timed-out connects
            conn.error = "; ".join(f"{type(e).__name__}: {e}" for e in failure.exceptions)
        finally:
            for w in writers:
                if conn.error is None:
                    w.close()
                else:
                    w.transport.abort()
            conn.closed_s = asyncio.get_running_loop().time()
            if self.on_close is not None:
                self.on_close(conn)

    def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        spec: DirectionSpec,
        conn: ConnectionStats,
        direction: int,
    ) -> _Pipe:
        stats = conn.down if direction else conn.up
        limit = self.max_buffer or default_buffer_bytes(spec)
        shaper = Shaper(spec, seed=[self.seed, conn.id, direction])
        return _Pipe(source, sink, shaper, stats, limit)
