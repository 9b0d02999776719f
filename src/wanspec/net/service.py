"""What the WAN proxy and the cloud server share: a TCP listener that serves each connection in a
task of its own, so that `stop` can cancel them all; used as `async with`, and run from the
command line until a signal."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self, TypeVar

Address = tuple[str, int]


class TcpService:
    """Subclasses implement `start` (setting `_server`) and may extend `stop`."""

    kind = "service"  # for messages: "the proxy is not started"

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> Address:
        """Where it listens (the real port when port 0 was asked for)."""
        if self._server is None:
            raise RuntimeError(f"the {self.kind} is not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop listening and cancel every connection's task."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def serve_in_own_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run one connection's `work` in a task of our own, which `stop` may cancel; waiting
        with `asyncio.wait` keeps that cancellation from surfacing in asyncio's stream callback."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.wait([task])

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


Service = TypeVar("Service", bound=AbstractAsyncContextManager[Any])


async def serve_until_signalled(
    service: Service, ready: Callable[[Service], None] | None = None
) -> None:
    """Run `service` (a `WanProxy`, a `CloudServer`: anything that serves while entered)
    until SIGINT (Ctrl-C) or SIGTERM, then stop it: the signal ends the wait instead of raising
    KeyboardInterrupt somewhere inside a relay. `ready` runs once listening."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stopping.set)
    try:
        async with service:
            if ready is not None:
                ready(service)
            await stopping.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
