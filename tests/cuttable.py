"""A cloud server behind a WAN proxy that a test can cut and restore on the same port, for the
resume tests: cutting stops the proxy, so every connection through it dies with whatever frames
were in flight, and nothing can connect until it is restored. While cut, the port stays bound
(never listening: connections are refused), so no other test worker's server can take it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import wanspec
from wanspec.net import DirectionSpec
from wanspec.net.background import BackgroundLoop
from wanspec.net.proxy import WanProxy
from wanspec.net.server import CloudServer, ServerLimits

WAN = DirectionSpec(rate_bps=10e6, delay_s=0.01)


@dataclass
class CuttableLink:
    server: CloudServer
    wan: BackgroundLoop
    proxy: WanProxy
    port: int
    drops: list[int] = field(default_factory=list)  # tokens committed when the link was cut
    reserved: socket.socket | None = None  # holds the port while the link is cut

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self.wan.run(self.proxy.stop(), 10)
        self.reserved = socket.socket()
        self.reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.reserved.bind(("127.0.0.1", self.port))

    async def restore_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.proxy = WanProxy(("127.0.0.1", self.port), self.server.address, WAN, WAN)
        await asyncio.to_thread(self.wan.run, self.proxy.start(), 10)  # binds beside `reserved`
        self.release()

    def release(self) -> None:
        if self.reserved is not None:
            self.reserved.close()
            self.reserved = None


@contextmanager
def cuttable_link(
    pair: wanspec.Pair, grace_s: float, max_sessions: int = 8
) -> Iterator[CuttableLink]:
    """A server for `pair`'s target keeping dropped sessions `grace_s`, behind a proxy."""
    limits = ServerLimits(resume_grace_s=grace_s, max_sessions=max_sessions)
    with BackgroundLoop("cloud") as cloud, BackgroundLoop("wan") as wan:
        server = CloudServer(pair.target, pair.cloud_info, port=0, limits=limits)
        cloud.run(server.start())
        proxy = WanProxy(("127.0.0.1", 0), server.address, WAN, WAN)
        wan.run(proxy.start())
        link = CuttableLink(server, wan, proxy, proxy.address[1])
        try:
            yield link
        finally:
            link.release()
            wan.run(link.proxy.stop(), 10)
            cloud.run(server.stop(), 30)


class DroppingRelay:
    """A plain TCP relay that, once, drops a connection at the moment the server's `nth` chunk
    of bytes reaches it, without forwarding that chunk: what the server sent last is lost with
    the connection, so a resumed session must replay it. Later connections are relayed as they
    are. Runs on the caller's event loop."""

    def __init__(self, upstream: tuple[str, int], nth: int) -> None:
        self.upstream, self.nth = upstream, nth
        self.dropped = False
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        dropping = not self.dropped
        pumps = [
            self._pump(reader, up_writer, None),
            self._pump(up_reader, writer, self.nth if dropping else None),
        ]
        tasks = [asyncio.create_task(pump) for pump in pumps]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for w in (writer, up_writer):  # either side's end (or the drop) ends both
            w.transport.abort()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, drop_at: int | None
    ) -> None:
        chunks = 0
        while data := await source.read(1 << 16):
            chunks += 1
            if drop_at is not None and chunks == drop_at and not self.dropped:
                self.dropped = True
                raise ConnectionAbortedError("dropped by the test")
            sink.write(data)
            await sink.drain()
        raise ConnectionAbortedError("one side closed")
