"""Scale-out on Ray Serve: cloud verifiers as Ray Serve replicas behind one TCP entry point.

Each replica of the `VerifierReplica` deployment loads the target once and runs an ordinary
`CloudServer` (batching, metrics, limits, TLS and tokens as for `wanspec serve`) on a TCP port
of its own, and registers that address in a small named Ray actor (`ReplicaDirectory`) that
forgets it when the replica goes. Ray Serve supplies the replicas: placement on the cluster's
nodes, restarts, health checks, `num_replicas`.

Edges see ONE address, the `SessionRouter`: it reads the first frame of a connection (after a
bearer token's `Auth` frame), picks the replica for the session's id on a consistent-hash ring of
the registered replicas, forwards those frames and whatever it read past them, and from then on
splices the connection's bytes both ways unchanged.
So a session lives on one replica from its first frame to its last: its KV cache, protocol
machine and rng never move. The session id is the `Resume` frame's id for a resumable session
(so an edge that reconnects after a dropped link reaches the replica that holds its session),
else a fresh random id per connection. The ring (64 virtual nodes per replica) moves only about
1/N of the ids when a replica joins or leaves, and none of the sessions already spliced.

Why not Ray's own request path: the wire protocol is a long-lived, bidirectional stream of codec
frames on one TCP connection, not request/response calls; handle calls or the HTTP proxy would
put an RPC framework between the bytes the papers count and the socket, and Ray's multiplexed
routing only prefers, not guarantees, the replica that holds a session.

`deploy(target, replicas=2, …)` starts the deployment on the connected Ray cluster;
`python -m wanspec.net.ray_serve --target T --replicas 2 --port 7070` deploys and routes until
Ctrl-C. `ray[serve]` comes with the optional extra `wanspec[ray]`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any

import click
import ray
from ray import serve

from wanspec import wire
from wanspec.net.background import BackgroundLoop
from wanspec.net.framing import CHUNK, ConnectionClosed, FrameReader
from wanspec.net.service import Address, TcpService, serve_until_signalled

log = logging.getLogger("wanspec.ray")
DIRECTORY = "wanspec-replica-directory"
NAMESPACE = "wanspec"
VIRTUAL_NODES = 64


class HashRing:
    """Consistent hashing of session ids onto replica ids (`VIRTUAL_NODES` points each)."""

    def __init__(self, nodes: Iterable[str], virtual_nodes: int = VIRTUAL_NODES) -> None:
        points = sorted(
            (_hash(f"{node}#{i}"), node) for node in nodes for i in range(virtual_nodes)
        )
        self._keys = [p for p, _ in points]
        self._nodes = [n for _, n in points]

    def lookup(self, key: str) -> str:
        """The node owning `key`: the first point clockwise from its hash."""
        if not self._nodes:
            raise LookupError("no replica is registered")
        index = bisect.bisect(self._keys, _hash(key)) % len(self._keys)
        return self._nodes[index]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@ray.remote(num_cpus=0)
class ReplicaDirectory:
    """Replica id -> (host, port) of its `CloudServer`, for the router."""

    def __init__(self) -> None:
        self.replicas: dict[str, Address] = {}

    def register(self, replica: str, address: Address) -> None:
        self.replicas[replica] = address

    def deregister(self, replica: str) -> None:
        self.replicas.pop(replica, None)

    def snapshot(self) -> dict[str, Address]:
        return dict(self.replicas)


def directory() -> Any:
    """The cluster's `ReplicaDirectory` (created on first use, detached)."""
    return ReplicaDirectory.options(  # type: ignore[attr-defined]
        name=DIRECTORY, namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


class VerifierReplica:
    """One Ray Serve replica: the target loaded once and a `CloudServer` on its own port."""

    def __init__(
        self,
        target: str,
        draft_tokenizers: Sequence[str] = (),
        host: str = "127.0.0.1",
        threads: int = 1,
        server_options: dict[str, Any] | None = None,
    ) -> None:
        from wanspec.models.lm import load_model
        from wanspec.models.registry import load_tokenizer, resolve_model
        from wanspec.net.server import CloudServer, build_target_info

        target_lm = load_model(resolve_model(target), threads=threads)
        info = build_target_info(target_lm, [load_tokenizer(t) for t in draft_tokenizers])
        self.loop = BackgroundLoop("wanspec-replica").__enter__()
        self.server = CloudServer(target_lm, info, host=host, port=0, **(server_options or {}))
        self.loop.run(self.server.start())
        self.id = serve.get_replica_context().replica_id.unique_id
        ray.get(directory().register.remote(self.id, self.server.address))

    def endpoint(self) -> tuple[str, Address]:
        return self.id, self.server.address

    def sessions(self) -> tuple[str, list[dict[str, Any]]]:
        """This replica's id and the sessions it served (`SessionRecord`s as dicts)."""
        return self.id, [asdict(record) for record in self.server.records]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            directory().deregister.remote(self.id)
            self.loop.run(self.server.stop(), 30)
            self.loop.__exit__(None, None, None)


def deploy(
    target: str,
    replicas: int = 2,
    *,
    draft_tokenizers: Sequence[str] = (),
    threads: int = 1,
    num_cpus: float = 0,
    name: str = "wanspec-verifier",
    server_options: dict[str, Any] | None = None,
) -> Any:
    """Run `replicas` verifier replicas of `target` on the connected Ray cluster (call
    `ray.init` first); returns the deployment's handle once every replica has registered."""
    serve.start(proxy_location="Disabled")
    app = serve.deployment(VerifierReplica, name=name).options(
        num_replicas=replicas, ray_actor_options={"num_cpus": num_cpus}
    )
    bound = app.bind(target, tuple(draft_tokenizers), "127.0.0.1", threads, server_options)
    return serve.run(bound, name=name, route_prefix=None)


def registered() -> dict[str, Address]:
    """The replicas registered now: id -> address."""
    return ray.get(directory().snapshot.remote())


class SessionRouter(TcpService):
    """The one address edges connect to; each session goes to one replica, whole."""

    kind = "router"

    def __init__(
        self,
        replicas: Callable[[], dict[str, Address]] = registered,
        host: str = "127.0.0.1",
        port: int = 7070,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
    ) -> None:
        super().__init__()
        self.replicas, self.host, self.port, self.limits = replicas, host, port, limits
        # (session id, replica id, the router's local port towards it), in order
        self.assignments: list[tuple[str, str, int]] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, self.host, self.port)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.serve_in_own_task(self._route(reader, writer))

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(reader, self.limits)
        try:
            head, session = await self._opening(frames)
            table = await asyncio.to_thread(self.replicas)
            replica = HashRing(table).lookup(session)
            up_reader, up_writer = await asyncio.open_connection(*table[replica])
        except (OSError, LookupError, wire.WireError, ConnectionClosed) as exc:
            log.warning("cannot route a session: %s", exc)
            writer.close()
            return
        local_port = up_writer.get_extra_info("sockname")[1]
        self.assignments.append((session, replica, local_port))
        up_writer.write(head + frames.take_buffered())  # what was read past them, too
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    async def _opening(self, frames: FrameReader) -> tuple[bytes, str]:
        """The bytes of the opening frames (an `Auth`, then one more) and the session id."""
        head = b""
        for _ in range(2):
            frame = await frames.receive_frame()
            head += frame
            message = wire.decode(frame, self.limits)
            if isinstance(message, wire.Resume):
                return head, message.session
            if not isinstance(message, wire.Auth):
                break
        return head, uuid.uuid4().hex


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy bytes until the source ends, then half-close the sink (a clean end both ways)."""
    with contextlib.suppress(OSError):
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()


@click.command()
@click.option("--target", required=True, help="Registry name or Hugging Face folder.")
@click.option("--draft-tokenizer", "draft_tokenizers", multiple=True, help="Repeatable.")
@click.option("--replicas", type=click.IntRange(1), default=2, show_default=True)
@click.option("--address", default=None, help="Ray cluster address [default: a local one].")
@click.option("--host", default="127.0.0.1", show_default=True, help="The router's address.")
@click.option("--port", type=click.IntRange(0, 65535), default=7070, show_default=True)
def main(
    target: str,
    draft_tokenizers: tuple[str, ...],
    replicas: int,
    address: str | None,
    host: str,
    port: int,
) -> None:
    """Deploy `replicas` verifiers of TARGET on Ray Serve and route edges to them from
    HOST:PORT until Ctrl-C."""
    ray.init(address=address)
    deploy(target, replicas, draft_tokenizers=draft_tokenizers)
    router = SessionRouter(host=host, port=port)

    def ready(r: SessionRouter) -> None:
        where = "{}:{}".format(*r.address)
        click.echo(f"routing edges on {where} to {len(registered())} replicas; Ctrl-C stops")

    try:
        asyncio.run(serve_until_signalled(router, ready))
    finally:
        serve.shutdown()


if __name__ == "__main__":
    main()
