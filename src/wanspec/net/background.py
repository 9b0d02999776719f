"""An asyncio event loop on a thread of its own, for servers and proxies that must run beside
blocking code (a synchronous client, a model, a test) in the calling thread; and a cloud server
behind a WAN proxy on such a loop, as the demo and the tests use it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from wanspec.link import DirectionSpec
from wanspec.net.proxy import WanProxy
from wanspec.net.server import CloudServer

T = TypeVar("T")


class BackgroundLoop:
    """`with BackgroundLoop() as bg: bg.run(server.start())`: `run` waits for a coroutine on
    the loop thread; leaving the block stops the loop (stop your servers inside it first)."""

    def __init__(self, name: str = "wanspec-loop") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop thread and wait for its result (TimeoutError after
        `timeout_s`, the coroutine then cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def __enter__(self) -> BackgroundLoop:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@contextlib.contextmanager
def cloud_behind_wan(
    target_lm: Any,
    info: Any,
    up: DirectionSpec | None = None,
    down: DirectionSpec | None = None,
    *,
    seed: int = 0,
    **server_options: Any,
) -> Iterator[tuple[str, CloudServer, WanProxy]]:
    """A `CloudServer` for `target_lm` and a `WanProxy` in front of it (`up`: edge → cloud),
    both on loopback, each on a background loop of its own (so the server's event-loop CPU is
    its own); yields ("HOST:PORT" of the proxy, server, proxy). `server_options` go to
    `CloudServer` (token, tls, limits, …)."""
    with BackgroundLoop("wanspec-cloud") as cloud, BackgroundLoop("wanspec-wan") as wan:
        server = CloudServer(target_lm, info, host="127.0.0.1", port=0, **server_options)
        cloud.run(server.start())
        proxy = WanProxy(("127.0.0.1", 0), server.address, up, down, seed=seed)
        try:
            wan.run(proxy.start())
            yield "{}:{}".format(*proxy.address), server, proxy
        finally:
            wan.run(proxy.stop(), 30)
            cloud.run(server.stop(), 30)
