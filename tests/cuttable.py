"""A cloud server behind a WAN proxy that a test can cut and restore on the same port, for the
resume tests: cutting stops the proxy, so every connection through it dies with whatever frames
were in flight, and nothing can connect until it is restored."""

from __future__ import annotations

import asyncio
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

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self.wan.run(self.proxy.stop(), 10)

    async def restore_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.proxy = WanProxy(("127.0.0.1", self.port), self.server.address, WAN, WAN)
        await asyncio.to_thread(self.wan.run, self.proxy.start(), 10)


@contextmanager
def cuttable_link(pair: wanspec.Pair, grace_s: float) -> Iterator[CuttableLink]:
    """A server for `pair`'s target keeping dropped sessions `grace_s`, behind a proxy."""
    limits = ServerLimits(resume_grace_s=grace_s)
    with BackgroundLoop("cloud") as cloud, BackgroundLoop("wan") as wan:
        server = CloudServer(pair.target, pair.cloud_info, port=0, limits=limits)
        cloud.run(server.start())
        proxy = WanProxy(("127.0.0.1", 0), server.address, WAN, WAN)
        wan.run(proxy.start())
        link = CuttableLink(server, wan, proxy, proxy.address[1])
        try:
            yield link
        finally:
            wan.run(link.proxy.stop(), 10)
            cloud.run(server.stop(), 30)
