"""Resume after a dropped link, over real loopback TCP on tiny models.

The WAN proxy between edge and server is stopped mid-generation (every connection through it
dies, frames in flight are lost) and started again on the same port. Within the server's grace
period the session resumes: the output equals the uninterrupted run's token for token, greedy
and sampled, with no token lost or repeated. Past the grace period the edge continues on a
fresh session from its committed tokens: greedy output is again the same.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
from wanspec.protocols.settings import GenerationSettings

PROMPT = "hello world"
NEW = 16
DROP_AFTER = 5  # committed tokens before the link drops
FAST_RETRY = RetryPolicy(attempts=12, first_delay_s=0.05, max_delay_s=0.4)
OPTIONS = ClientOptions(timeout_s=20.0, retry=FAST_RETRY)


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


@pytest.fixture(scope="module")
def patient(pair: wanspec.Pair) -> Iterator[CuttableLink]:
    """A server that keeps a dropped session for 20 s."""
    with cuttable_link(pair, grace_s=20.0) as link:
        yield link


@pytest.fixture(scope="module")
def forgetful(pair: wanspec.Pair) -> Iterator[CuttableLink]:
    """A server that forgets a dropped session after 0.2 s."""
    with cuttable_link(pair, grace_s=0.2) as link:
        yield link


def _interrupted(
    pair: wanspec.Pair, link: CuttableLink, settings: GenerationSettings, outage_s: float
) -> tuple[ResumableRun, list[tuple[int, ...]]]:
    """Generate through `link`, cutting it once DROP_AFTER tokens are committed and restoring
    it `outage_s` later; also returns every batch of tokens as the caller saw it."""
    batches: list[tuple[int, ...]] = []

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
            edge, PROMPT, "naive", settings, link.address, OPTIONS, on_emit
        )
        await asyncio.gather(*restoring)
        return run

    return asyncio.run(asyncio.wait_for(scenario(), 90)), batches


def _uninterrupted(
    pair: wanspec.Pair, link: CuttableLink, settings: GenerationSettings
) -> list[int]:
    res = wanspec.generate(pair, PROMPT, "naive", server=link.address, **settings.to_dict())
    return list(res.token_ids)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_dropped_link_within_the_grace_period_resumes_the_same_session(
    pair: wanspec.Pair, patient: CuttableLink, temperature: float
) -> None:
    settings = GenerationSettings(max_new_tokens=NEW, temperature=temperature, seed=3)
    expected = _uninterrupted(pair, patient, settings)
    run, batches = _interrupted(pair, patient, settings, outage_s=0.5)
    assert patient.drops and patient.drops[-1] < NEW  # the link really dropped mid-generation
    assert run.reconnects >= 1 and run.restarts == 0
    assert run.final.transport_stats()["reconnects"] == run.reconnects
    # the same tokens (sampled ones too: the machines never noticed), none lost or repeated,
    # and what the caller was handed batch by batch is exactly that output
    assert run.tokens == expected
    assert [t for batch in batches for t in batch] == expected
    assert pair.decode(run.tokens) == pair.decode(expected)


def test_past_the_grace_period_a_fresh_session_continues_with_the_same_greedy_text(
    pair: wanspec.Pair, forgetful: CuttableLink
) -> None:
    settings = GenerationSettings(max_new_tokens=NEW, temperature=0.0)
    expected = _uninterrupted(pair, forgetful, settings)
    run, batches = _interrupted(pair, forgetful, settings, outage_s=1.0)
    assert forgetful.drops and forgetful.drops[-1] < NEW
    assert run.restarts == 1  # the server had forgotten the session
    assert run.tokens == expected
    assert [t for batch in batches for t in batch] == expected
    records = list(forgetful.server.records)
    assert any("grace period" in r.outcome for r in records)


@pytest.mark.parametrize("nth", [3, 6])
def test_what_the_cloud_sent_into_a_dropped_connection_is_replayed(
    pair: wanspec.Pair, patient: CuttableLink, nth: int
) -> None:
    settings = GenerationSettings(max_new_tokens=NEW, temperature=0.9, seed=11)
    expected = _uninterrupted(pair, patient, settings)

    async def scenario() -> tuple[ResumableRun, bool]:
        relay = DroppingRelay(patient.server.address, nth)
        async with relay as address:
            edge = RemotePair.of_pair(pair)
            run = await generate_resumable(edge, PROMPT, "naive", settings, address, OPTIONS)
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
