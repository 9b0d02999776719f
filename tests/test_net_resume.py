"""Resume after a dropped link, over real loopback TCP on tiny models.

The WAN proxy between edge and server is stopped mid-generation (every connection through it
dies, frames in flight are lost) and started again on the same port. Within the server's grace
period the session resumes: the output equals the uninterrupted run's token for token, greedy
and sampled, with no token lost or repeated. Past the grace period the edge continues on a
fresh session from its committed tokens: greedy output is again the same. Both hold for the
stop-and-wait methods (`naive`, `xcosd-e`) and for the asynchronous pipelines (`picospec`,
`acespec`, `acespec-x`), which keep drafting ahead while a chain is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import wanspec
from cuttable import CuttableLink, DroppingRelay, cuttable_link
from nethelpers import run, socket_pair
from wanspec import wire
from wanspec.net.client import (
    ClientOptions,
    RemotePair,
    ResumableRun,
    continuation_seed,
    continuation_settings,
    edge_machine,
    generate_resumable,
)
from wanspec.net.framing import MessageStream
from wanspec.net.resume import (
    KEEPALIVE_IDLE_S,
    ReplayLog,
    ResumableStream,
    RetryPolicy,
    SessionLost,
)
from wanspec.protocols.registry import METHODS
from wanspec.protocols.settings import GenerationSettings

PROMPT = "hello world"
NEW = 16
DROP_AFTER = 5  # committed tokens before the link drops
FAST_RETRY = RetryPolicy(attempts=12, first_delay_s=0.05, max_delay_s=0.4)
OPTIONS = ClientOptions(timeout_s=20.0, retry=FAST_RETRY)
PATIENT_S = 20.0  # a grace period the outages below stay well inside
FORGETFUL_S = 0.2  # one they outlast
RESUMED = ["naive", "xcosd-e", "picospec", "acespec", "acespec-x"]  # stop-and-wait, pipelines


# ----------------------------------------------------------------------------- the wire frames
@pytest.mark.parametrize(
    "msg",
    [wire.Resume("a1b2", 3, 7, (1, 2, 300)), wire.Resume("s"), wire.Resumed(0), wire.Resumed(9)],
)
def test_resume_frames_round_trip(msg: Any) -> None:
    frame = wire.encode(msg)
    assert wire.decode(frame) == msg
    assert wire.encode(wire.decode(frame)) == frame


def test_a_resume_frame_with_a_bad_prefix_or_no_session_is_refused() -> None:
    limits = wire.DEFAULT_LIMITS.with_vocab(100)
    with pytest.raises(wire.WireError, match="prefix"):
        wire.encode(wire.Resume("s", 0, 0, (5, 100)), limits)
    with pytest.raises(wire.WireError, match="session"):
        wire.encode(wire.Resume("", 0, 0))


# ----------------------------------------------------------------------------- the pieces
def test_the_replay_log_resends_from_the_peers_count_and_knows_what_it_dropped() -> None:
    log = ReplayLog(keep=3)
    for i in range(5):
        log.append(wire.Close(str(i)))
    assert [m.reason for m in log.since(3)] == ["3", "4"]
    assert log.since(5) == []
    with pytest.raises(SessionLost, match="from #1"):
        log.since(1)  # dropped from the log: the session cannot be resumed
    with pytest.raises(SessionLost):
        log.since(6)  # more than was ever sent


def test_a_resumable_connection_probes_a_silent_link_with_tcp_keepalive() -> None:
    async def scenario() -> list[int]:
        async with socket_pair() as ((reader, writer), _):
            ResumableStream(MessageStream(reader, writer))
            sock = writer.get_extra_info("socket")
            options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE)]
            if hasattr(socket, "TCP_KEEPIDLE"):
                options += [(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)]
            return [sock.getsockopt(level, name) for level, name in options]

    values = run(scenario())
    assert values[0] == 1
    assert values[1:] in ([], [KEEPALIVE_IDLE_S])


def test_a_continuation_draws_from_a_stream_of_its_own_and_asks_for_the_rest() -> None:
    settings = GenerationSettings(max_new_tokens=20, seed=7)
    assert continuation_settings(settings, 0) == settings
    later = continuation_settings(settings, 6)
    assert later.max_new_tokens == 14
    assert later.seed == continuation_seed(7, 6)
    seeds = {continuation_seed(7, 6), continuation_seed(7, 5), continuation_seed(8, 6), 7}
    assert len(seeds) == 4
    assert 0 <= continuation_seed(2**63 - 1, 10**6) < 2**63


# ----------------------------------------------------------------------------- over TCP
@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


Served = Callable[[str, float], tuple[wanspec.Pair, CuttableLink]]


@pytest.fixture(scope="module")
def served(
    pair: wanspec.Pair, tiny_pair_shared: tuple[Path, Path], tiny_pair_hetero: tuple[Path, Path]
) -> Iterator[Served]:
    """`served(method, grace_s)`: the pair `method` runs on, its target on a server that keeps a
    dropped session `grace_s`, behind a cuttable link; each pair and server made on first use.

    Stop-and-wait methods cut their model passes the same way whatever the timing: they run on
    `pair` (default kernels). The pipelines draft ahead while a chain is verified, so a drop,
    which changes the timing, changes how their passes are cut (a tree pass on a hit, one-token
    decodes on a miss): a pipeline's pair, of the vocabulary kind it needs, has both models
    pass-shape invariant (the server's target is the pair's), so the edge's p and the cloud's q
    at a position are bitwise the same however the passes were cut, as the sampled comparison
    with an uninterrupted run needs."""
    pairs: dict[bool | None, wanspec.Pair] = {None: pair}  # by shared vocabulary; None: default
    links: dict[tuple[bool | None, float], CuttableLink] = {}
    with contextlib.ExitStack() as stack:

        def serve(method: str, grace_s: float) -> tuple[wanspec.Pair, CuttableLink]:
            info = METHODS[method]
            kind = info.shared_vocab_only if info.family == "pipeline" else None
            if kind not in pairs:
                draft, target = tiny_pair_shared if kind else tiny_pair_hetero
                pairs[kind] = wanspec.load_pair(
                    target=target, draft=draft, threads=1, invariant=True
                )
            if (kind, grace_s) not in links:
                link = cuttable_link(pairs[kind], grace_s=grace_s)
                links[kind, grace_s] = stack.enter_context(link)
            return pairs[kind], links[kind, grace_s]

        yield serve


def _interrupted(
    pair: wanspec.Pair,
    link: CuttableLink,
    settings: GenerationSettings,
    outage_s: float,
    method: str = "naive",
) -> tuple[ResumableRun, list[tuple[int, ...]]]:
    """Generate through `link`, cutting it once DROP_AFTER tokens are committed and restoring
    it `outage_s` later; also returns every batch of tokens as the caller saw it. `link.drops`
    holds this run's drop alone."""
    batches: list[tuple[int, ...]] = []
    link.drops.clear()

    async def scenario() -> ResumableRun:
        loop = asyncio.get_running_loop()
        restoring: list[asyncio.Task[None]] = []

        def on_emit(batch: tuple[int, ...]) -> None:
            batches.append(batch)
            committed = sum(map(len, batches))
            if committed >= DROP_AFTER and not restoring:
                link.cut()  # the very next frames this edge sends are lost with the link
                link.drops.append(committed)
                restoring.append(loop.create_task(link.restore_after(outage_s)))

        edge = RemotePair.of_pair(pair)
        run = await generate_resumable(
            edge, PROMPT, method, settings, link.address, OPTIONS, on_emit
        )
        await asyncio.gather(*restoring)
        return run

    return asyncio.run(asyncio.wait_for(scenario(), 90)), batches


def _uninterrupted(
    pair: wanspec.Pair, link: CuttableLink, settings: GenerationSettings, method: str = "naive"
) -> list[int]:
    res = wanspec.generate(pair, PROMPT, method, server=link.address, **settings.to_dict())
    return list(res.token_ids)


def _target_greedy_text(pair: wanspec.Pair) -> str:
    """The target's own greedy continuation (`transformers`' generate, no draft, no network)."""
    ids = torch.tensor([pair.target_encode(PROMPT)])
    out = pair.target.model.generate(
        ids, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(ids)
    )
    return pair.decode(out[0, ids.shape[1] :].tolist())


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("method", RESUMED)
def test_a_dropped_link_within_the_grace_period_resumes_the_same_session(
    served: Served, method: str, temperature: float
) -> None:
    pair, link = served(method, PATIENT_S)
    settings = GenerationSettings(max_new_tokens=NEW, temperature=temperature, seed=3)
    expected = _uninterrupted(pair, link, settings, method)
    run, batches = _interrupted(pair, link, settings, 0.5, method)
    assert link.drops and link.drops[-1] < NEW  # the link really dropped mid-generation
    assert run.reconnects >= 1 and run.restarts == 0
    assert run.final.transport_stats()["reconnects"] == run.reconnects
    # the same tokens (sampled ones too: the machines never noticed), none lost or repeated,
    # and what the caller was handed batch by batch is exactly that output
    assert run.tokens == expected
    assert [t for batch in batches for t in batch] == expected
    assert pair.decode(run.tokens) == pair.decode(expected)
    if temperature == 0.0:
        assert pair.decode(expected) == _target_greedy_text(pair)


@pytest.mark.parametrize("method", RESUMED)
def test_past_the_grace_period_a_fresh_session_continues_with_the_same_greedy_text(
    served: Served, method: str
) -> None:
    pair, link = served(method, FORGETFUL_S)
    settings = GenerationSettings(max_new_tokens=NEW, temperature=0.0)
    expected = _uninterrupted(pair, link, settings, method)
    seen = len(link.server.records)
    run, batches = _interrupted(pair, link, settings, 1.0, method)
    assert link.drops and link.drops[-1] < NEW
    assert run.restarts == 1  # the server had forgotten the session
    assert run.tokens == expected
    assert [t for batch in batches for t in batch] == expected
    assert pair.decode(expected) == _target_greedy_text(pair)
    records = list(link.server.records)[seen:]
    assert any("grace period" in r.outcome for r in records)


@pytest.mark.parametrize(
    ("method", "nth"), [("naive", 3), ("naive", 6), *((m, 3) for m in RESUMED if m != "naive")]
)
def test_what_the_cloud_sent_into_a_dropped_connection_is_replayed(
    served: Served, method: str, nth: int
) -> None:
    pair, link = served(method, PATIENT_S)
    settings = GenerationSettings(max_new_tokens=NEW, temperature=0.9, seed=11)
    expected = _uninterrupted(pair, link, settings, method)

    async def scenario() -> tuple[ResumableRun, bool]:
        relay = DroppingRelay(link.server.address, nth)
        async with relay as address:
            edge = RemotePair.of_pair(pair)
            run = await generate_resumable(edge, PROMPT, method, settings, address, OPTIONS)
        return run, relay.dropped

    run, dropped = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert dropped  # the server's nth chunk was lost with its connection
    assert run.reconnects == 1 and run.restarts == 0
    assert run.tokens == expected


def test_a_full_server_still_takes_back_the_edge_of_a_session_it_holds(
    pair: wanspec.Pair,
) -> None:
    settings = GenerationSettings(max_new_tokens=NEW, temperature=0.0)
    with cuttable_link(pair, grace_s=20.0, max_sessions=1) as link:
        expected = _uninterrupted(pair, link, settings)
        deadline = time.monotonic() + 10
        while link.server.active:  # the finished session's slot is free again
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run, _ = _interrupted(pair, link, settings, outage_s=0.3)
        assert link.drops
        assert run.restarts == 0 and run.tokens == expected  # not refused as busy


def test_a_fresh_sessions_stop_rules_look_back_into_the_committed_prefix(
    pair: wanspec.Pair,
) -> None:
    # a stop string may straddle the point where a fresh session took over; the fresh
    # session's stop rules see the prompt's ids and then the committed ones, as the first
    # session's saw its own output
    committed = [5, 6, 7]
    edge = RemotePair.of_pair(pair).continued(committed)
    settings = GenerationSettings(stop=("xy",))
    machine, _ = edge_machine(edge, PROMPT, "naive", settings)
    assert machine.stop_context == [*pair.target_encode(PROMPT), *committed]
    assert machine.target_tokenizer is pair.target.tokenizer  # matched as transformers does
