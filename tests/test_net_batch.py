"""Batched verification over real loopback TCP: one `wanspec serve` server, many edges at once.

Sixteen edges at once get, each, the very tokens that edge gets alone: greedy with the default
kernels, sampled bitwise with the target in pass-shape-invariant mode; and the server really
batched them (its batch-size histogram has passes of more than one session). A slow edge (10
kbit/s through the WAN proxy) does not hold the others' rounds back: the model thread never
waits for a session that has not asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wanspec
from nethelpers import run
from wanspec.models.invariant import make_batch_invariant
from wanspec.net import DirectionSpec, WanProxy
from wanspec.net.background import BackgroundLoop
from wanspec.net.client import RemotePair, RemoteRun, generate_async
from wanspec.net.server import CloudServer, ServerLimits
from wanspec.protocols.settings import GenerationSettings

EDGES = 16
METHODS = ("xcosd-e", "naive", "ar", "xcosd-e")
PROMPTS = ("hello world", "the quick brown fox", "a", "def f(x): return x")
NEW = 12


def _load(folders: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = folders
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    return _load(tiny_pair_hetero)


@pytest.fixture(scope="module")
def invariant_pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    pair = _load(tiny_pair_hetero)
    make_batch_invariant(pair.target.model)
    return pair


@contextlib.contextmanager
def serving(pair: wanspec.Pair, **options: Any) -> Iterator[CloudServer]:
    """A server for `pair`'s target on loopback, on a loop of its own."""
    limits = ServerLimits(max_sessions=EDGES + 2)
    with BackgroundLoop("wanspec-cloud") as cloud:
        server = CloudServer(pair.target, pair.cloud_info, port=0, limits=limits, **options)
        cloud.run(server.start())
        try:
            yield server
        finally:
            cloud.run(server.stop(), 30)


@pytest.fixture(scope="module")
def server(pair: wanspec.Pair) -> Iterator[CloudServer]:
    with serving(pair) as cloud:
        yield cloud


def _session(i: int, temperature: float) -> tuple[str, str, GenerationSettings]:
    """Edge i's request: method, prompt and settings (its own seed)."""
    settings = GenerationSettings(
        max_new_tokens=NEW, temperature=temperature, top_p=0.95, seed=100 + i, ignore_eos=True
    )
    return METHODS[i % len(METHODS)], PROMPTS[i % len(PROMPTS)], settings


async def _edges(
    pair: wanspec.Pair, address: Any, sessions: list[tuple[str, str, GenerationSettings]]
) -> list[RemoteRun]:
    edge = RemotePair.of_pair(pair)
    return await asyncio.gather(
        *(generate_async(edge, prompt, m, s, address) for m, prompt, s in sessions)
    )


def batches_over_one(server: CloudServer) -> float:
    """Model passes that served more than one session, from the batch-size histogram."""
    value = server.metrics.value
    return value("wanspec:batch_size_count") - value("wanspec:batch_size_bucket", le="1.0")


def _alone_then_together(pair: wanspec.Pair, temperature: float) -> None:
    """Each session alone (a server that runs one job per pass, so every pass holds that
    session only), then all at once on a batching server: the same tokens."""
    sessions = [_session(i, temperature) for i in range(EDGES)]
    with contextlib.ExitStack() as stack:
        unbatched = stack.enter_context(serving(pair, max_batch_tokens=0))
        batching = stack.enter_context(serving(pair))
        alone = run(_edges(pair, unbatched.address, sessions), timeout_s=120)
        together = run(_edges(pair, batching.address, sessions), timeout_s=120)
        assert batches_over_one(unbatched) == 0 and batches_over_one(batching) > 0
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert all(len(r.tokens) == NEW for r in alone)


def test_sixteen_edges_at_once_get_their_greedy_tokens_alone(pair: wanspec.Pair) -> None:
    _alone_then_together(pair, temperature=0.0)


@pytest.mark.slow  # ~16 s: the invariant kernels are slow even on tiny models
def test_sixteen_edges_at_once_get_their_sampled_tokens_alone_invariant_mode(
    invariant_pair: wanspec.Pair,
) -> None:
    _alone_then_together(invariant_pair, temperature=0.9)


# ---------------------------------------------------------------------------- a slow edge

SLOW = DirectionSpec(rate_bps=10e3, delay_s=0.25)  # 10 kbit/s each way, 500 ms RTT
FAST_EDGES = 3


def _per_round_s(runs: list[RemoteRun]) -> float:
    """Wall seconds per verified round, averaged over the fast edges."""
    return sum(r.record.duration_s / max(1, len(r.edge.accepted_per_round)) for r in runs) / len(
        runs
    )


def test_a_slow_edge_does_not_hold_back_the_others_rounds(
    pair: wanspec.Pair, server: CloudServer
) -> None:
    """The fast edges' rounds with a 10 kbit/s edge beside them stay within one batch of their
    rounds without it (bounded here as 2.5× plus 100 ms, for a shared machine) and far below the
    slow edge's own rounds (over 500 ms: RTT plus each frame's serialisation at 10 kbit/s),
    which a server that waited for every open session to fill its batch would impose on all."""
    fast = [_session(i, 0.9) for i in range(FAST_EDGES)]
    fast = [("xcosd-e", prompt, s) for _, prompt, s in fast]
    slow_session = ("naive", "a slow edge far away", _session(99, 0.9)[2])
    baseline = _per_round_s(run(_edges(pair, server.address, fast), timeout_s=60))

    async def beside_a_slow_edge() -> tuple[list[RemoteRun], RemoteRun]:
        proxy = WanProxy(("127.0.0.1", 0), server.address, SLOW, SLOW)
        async with proxy:
            slow = asyncio.create_task(_edges(pair, proxy.address, [slow_session]))
            while server.active < 1:  # the slow edge is in before the fast ones start
                await asyncio.sleep(0.01)
            runs = await _edges(pair, server.address, fast)
            return runs, (await slow)[0]

    runs, slow_run = run(beside_a_slow_edge(), timeout_s=120)
    slow_round, fast_round = _per_round_s([slow_run]), _per_round_s(runs)
    assert slow_round > 0.5  # the slow edge really is slow
    assert fast_round <= min(2.5 * baseline + 0.1, slow_round / 2), (
        baseline,
        fast_round,
        slow_round,
    )
