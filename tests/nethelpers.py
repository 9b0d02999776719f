"""Loopback helpers for the wanspec.net tests: bounded event-loop runs and small TCP servers.

Every test drives its scenario through `run`, so a hang fails the test after `timeout_s`
instead of stalling the suite. Servers listen on 127.0.0.1 with an ephemeral port (port 0), and
a port meant to refuse connections stays reserved while it is used (`refusing_port`): test
files run side by side on xdist workers, and a port number read once and let go can be taken
by another worker's server in between.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None] | None]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def run(scenario: Coroutine[Any, Any, Any], timeout_s: float = 10.0) -> Any:
    """Run one scenario on a fresh event loop, failing with TimeoutError after `timeout_s`."""
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port where nothing listens, for as long as the block lasts: it is bound but
    never listening, so a connection to it is refused and no other process can take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@asynccontextmanager
async def tcp_server(handler: Handler) -> AsyncIterator[tuple[str, int]]:
    """A loopback server calling `handler` per connection; yields its (host, port)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()


@asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[Streams, Streams]]:
    """Two ends of one real loopback TCP connection: (client side, server side)."""
    accepted: asyncio.Queue[Streams] = asyncio.Queue()
    async with tcp_server(lambda r, w: accepted.put_nowait((r, w))) as address:
        client = await asyncio.open_connection(*address)
        server = await accepted.get()
        try:
            yield client, server
        finally:
            for _, writer in (client, server):
                writer.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send back whatever arrives; close after the peer's end of stream."""
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
