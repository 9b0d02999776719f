"""Scale-out on Ray Serve (tiny models, a local Ray cluster): two verifier replicas behind one
`SessionRouter`; four edges at once through it each get the tokens a single server gives them,
and each session is served end to end by the one replica the hash ring named for it.

Ray's start-up (cluster and Serve controller) takes 15-20 s here, hence `slow`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

import wanspec  # noqa: E402
from nethelpers import run, tcp_server  # noqa: E402
from wanspec import wire  # noqa: E402
from wanspec.net.background import BackgroundLoop  # noqa: E402
from wanspec.net.client import RemotePair, RemoteRun, generate_async  # noqa: E402
from wanspec.net.ray_serve import HashRing, SessionRouter, deploy, registered  # noqa: E402
from wanspec.net.server import CloudServer  # noqa: E402
from wanspec.protocols.settings import GenerationSettings  # noqa: E402

SESSIONS = [("xcosd-e", 1), ("naive", 2), ("ar", 3), ("xcosd-e", 4)]  # method, seed


def _settings(seed: int) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=10, temperature=0.9, seed=seed, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@pytest.fixture(scope="module")
def replicas(tiny_pair_hetero: tuple[Path, Path]) -> Iterator[Any]:
    """Two verifier replicas on a local Ray cluster; the deployment's handle."""
    draft, target = tiny_pair_hetero
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        handle = deploy(str(target), replicas=2, draft_tokenizers=[str(draft)])
        deadline = time.monotonic() + 60
        while len(registered()) < 2:
            assert time.monotonic() < deadline, "the replicas did not register"
            time.sleep(0.1)
        yield handle
    finally:
        serve.shutdown()
        ray.shutdown()


def _sessions(pair: wanspec.Pair, address: Any) -> list[RemoteRun]:
    edge = RemotePair.of_pair(pair)

    async def all_at_once() -> list[RemoteRun]:
        return await asyncio.gather(
            *(generate_async(edge, "hello", m, _settings(s), address) for m, s in SESSIONS)
        )

    return run(all_at_once(), timeout_s=120)


def _replica_records(handle: Any) -> dict[str, list[dict[str, Any]]]:
    """Each replica's session records (handle calls land on a random replica: ask until both
    have answered)."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for _ in range(64):
        replica, records = handle.sessions.remote().result(timeout_s=30)
        seen[replica] = records
        if len(seen) == 2:
            break
    return seen


@pytest.mark.slow
def test_two_replicas_behind_one_address_serve_each_session_whole(
    pair: wanspec.Pair, replicas: Any
) -> None:
    with BackgroundLoop("wanspec-single") as single:
        server = CloudServer(pair.target, pair.cloud_info, port=0)
        single.run(server.start())
        try:
            expected = [r.tokens for r in _sessions(pair, server.address)]
        finally:
            single.run(server.stop(), 30)
    with BackgroundLoop("wanspec-router") as loop:
        router = SessionRouter(port=0)
        loop.run(router.start())
        try:
            runs = _sessions(pair, router.address)
        finally:
            loop.run(router.stop(), 30)
    assert [r.tokens for r in runs] == expected
    assert len(router.assignments) == len(SESSIONS)
    ring = HashRing(registered())
    assert all(ring.lookup(session) == replica for session, replica, _ in router.assignments)
    _each_session_on_its_replica(router.assignments, _replica_records(replicas))


def _each_session_on_its_replica(
    assignments: list[tuple[str, str, int]], records: dict[str, list[dict[str, Any]]]
) -> None:
    """Each routed connection (known by the router's local port) appears, finished, in the
    records of the replica it was assigned to and of no other."""
    for _, replica, port in assignments:
        holders = {
            rid for rid, recs in records.items() for r in recs if r["peer"].endswith(f":{port}")
        }
        assert holders == {replica}
        mine = [r for r in records[replica] if r["peer"].endswith(f":{port}")]
        assert len(mine) == 1 and not mine[0]["outcome"].startswith(("error", "edge", "refused"))


def test_the_ring_spreads_ids_and_moves_few_when_a_replica_joins() -> None:
    keys = [f"session-{i}" for i in range(3000)]
    two = HashRing(["a", "b"])
    owners = [two.lookup(k) for k in keys]
    assert 0.35 < owners.count("a") / len(keys) < 0.65
    three = HashRing(["a", "b", "c"])
    moved = [(old, three.lookup(k)) for k, old in zip(keys, owners, strict=True)]
    assert all(new in (old, "c") for old, new in moved)  # a key moves only to the newcomer
    assert 0.2 < sum(old != new for old, new in moved) / len(keys) < 0.5
    assert [two.lookup(k) for k in keys] == owners  # the same id, the same replica, always
    with pytest.raises(LookupError):
        HashRing([]).lookup("x")


async def _in_chunks(writer: asyncio.StreamWriter, data: bytes, size: int) -> None:
    """`data` in writes of `size` bytes, each given time to leave on its own."""
    for i in range(0, len(data), size):
        writer.write(data[i : i + size])
        await writer.drain()
        await asyncio.sleep(0.0005)


@pytest.mark.parametrize("size", [1, 1 << 20], ids=["byte-by-byte", "one-write"])
def test_the_router_forwards_every_byte_it_read_then_splices_the_rest(size: int) -> None:
    """The opening frames, the frames read along with them and the rest of the stream reach
    the replica unchanged, in order; the session goes where its Resume's id says."""
    opening = [wire.Auth("token"), wire.Resume("s-42", 0, 0)]
    rest = [wire.Close("a"), wire.Tokens((1, 2, 3)), wire.Close("b")]
    data = b"".join(wire.encode(m) for m in [*opening, *rest])

    async def scenario() -> tuple[bytes, list[tuple[str, str, int]]]:
        received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.set_result(await reader.read())  # until the router's half-close
            writer.close()

        async with (
            tcp_server(replica) as upstream,
            SessionRouter(lambda: {"only": upstream}, port=0) as router,
        ):
            _, writer = await asyncio.open_connection(*router.address)
            await _in_chunks(writer, data, size)
            writer.write_eof()
            got = await asyncio.wait_for(received, 5.0)
            writer.close()
            return got, router.assignments

    got, assignments = run(scenario(), timeout_s=10)
    assert got == data
    assert [(s, r) for s, r, _ in assignments] == [("s-42", "only")]
