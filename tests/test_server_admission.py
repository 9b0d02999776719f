"""Admission on a real `wanspec serve` over loopback, against clients that hold on to nothing.

Silent sockets, edges that vanish mid-session and handshakes naming kilobytes of method must not
lock authenticated edges out or grow the server: slots count handshaken sessions only, pending
handshakes and sessions held for a dropped edge have small budgets of their own, and Prometheus
labels keep to known values. Long requests must not exhaust memory: open sessions' KV-cache
estimates share one budget, checked before any model work.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from transformers import Gemma3TextConfig

import wanspec
from nethelpers import run
from test_net_server import _self_signed
from wanspec import wire
from wanspec.cli import main
from wanspec.net.background import BackgroundLoop
from wanspec.net.client import ClientOptions, RemoteError, RemotePair, generate_async
from wanspec.net.framing import ConnectionClosed, read_message
from wanspec.net.metrics import OTHER, OUTCOMES
from wanspec.net.server import CloudServer, KvReserving, ServerLimits, server_tls
from wanspec.protocols.base import (
    PROTOCOL_VERSION,
    Compute,
    ErrorCode,
    Finish,
    MessageReceived,
    ProtocolError,
    Send,
    Start,
)
from wanspec.protocols.registry import METHODS, edge_fingerprints, kv_bytes_per_token, make_cloud
from wanspec.protocols.settings import GenerationSettings

PROMPT = "hello world"
TOKEN = "t0ken-for-admission"
START = wire.StartRequest(0, PROMPT, {"max_new_tokens": 8})
SETTINGS = GenerationSettings(max_new_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@contextmanager
def serving(pair: wanspec.Pair, **options: Any) -> Iterator[CloudServer]:
    """A server for `pair`'s target on loopback, on a loop of its own."""
    with BackgroundLoop("wanspec-cloud") as loop:
        server = CloudServer(pair.target, pair.cloud_info, port=0, **options)
        loop.run(server.start())
        try:
            yield server
        finally:
            loop.run(server.stop(), 30)


def _hello(pair: wanspec.Pair, method: str, version: int = PROTOCOL_VERSION) -> wire.Hello:
    fp = edge_fingerprints(pair.alignment, pair.target.fingerprint)
    return wire.Hello(
        version, "edge", method, fp.target_model, fp.target_tokenizer, fp.draft_tokenizer
    )


def _frames(*messages: Any) -> bytes:
    return b"".join(wire.encode(m) for m in messages)


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _first_reply(reader: asyncio.StreamReader) -> wire.Message | None:
    try:
        return await asyncio.wait_for(read_message(reader), 5.0)
    except ConnectionClosed:
        return None


# ---------------------------------------------------------------------------- labels
def test_refused_hellos_with_long_random_methods_leave_metrics_small_and_labels_known(
    pair: wanspec.Pair,
) -> None:
    """An edge chooses its Hello's method: as a label value it would grow the registry, and
    every scrape, by its length for every refused handshake."""
    count, length = 200, 16 << 10

    async def refused(address: tuple[str, int]) -> list[Any]:
        replies = []
        for i in range(count):
            reader, writer = await asyncio.open_connection(*address)
            version = PROTOCOL_VERSION + i % 2  # refused for its method, or for its version
            writer.write(_frames(_hello(pair, secrets.token_hex(length // 2), version)))
            replies.append(await _first_reply(reader))
            writer.close()
        return replies

    with serving(pair) as server:
        replies = run(refused(server.address), timeout_s=120)
        run(_until(lambda: len(server.records) == count))
        port = server.metrics.serve_http(0)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                text = page.read().decode()
        finally:
            server.metrics.stop_http()
        refusals = server.metrics.value("wanspec:requests_total", method=OTHER, outcome="error")
        records = list(server.records)
    codes = {ErrorCode(r.code) for r in replies if isinstance(r, wire.Error)}
    assert codes == {ErrorCode.UNSUPPORTED, ErrorCode.VERSION}
    assert len(text) < 32 << 10  # before: 6.5 MB, each method twice
    known = {
        "method": {*METHODS, "-", "resume", OTHER},
        "outcome": OUTCOMES | {OTHER},
        "kind": {c.name for c in ErrorCode} | OUTCOMES | {OTHER},
        "direction": {"up", "down"},
        "type": set(wire.__all__),
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label == "position":
                    assert value.isdigit() and int(value) < wire.DEFAULT_LIMITS.max_tokens
                elif label in known:
                    assert value in known[label], (sample.name, label, value[:40])
    assert refusals == count
    assert all(len(r.method) <= 16 and len(r.outcome) <= 300 for r in records)


# ---------------------------------------------------------------------------- pending handshakes
@pytest.mark.parametrize("tls", [False, True])
def test_silent_connections_do_not_make_an_authenticated_client_busy(
    pair: wanspec.Pair, tmp_path: Path, tls: bool
) -> None:
    """Connections that never send their token hold no session slot, only pending handshakes:
    as many silent sockets as the server has slots must not turn the right token away."""
    if tls and shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = _self_signed(tmp_path / "server") if tls else (None, None)
    context = server_tls(cert, key) if cert and key else None
    options = ClientOptions(token=TOKEN, tls_ca=cert, timeout_s=60)
    limits = ServerLimits(max_sessions=4, handshake_timeout_s=30.0)
    expected = wanspec.generate(pair, PROMPT, "naive", **vars(SETTINGS)).token_ids

    async def scenario(server: CloudServer) -> tuple[int, list[int]]:
        silent = [
            await asyncio.open_connection(
                *server.address,
                ssl=options.ssl_context(),
                server_hostname="127.0.0.1" if tls else None,
            )
            for _ in range(4)
        ]
        await _until(lambda: server.pending == 4)
        slots_taken = server.active
        edge = RemotePair.of_pair(pair)
        result = await generate_async(edge, PROMPT, "naive", SETTINGS, server.address, options)
        for _, writer in silent:
            writer.close()
        return slots_taken, result.tokens

    with serving(pair, token=TOKEN, tls=context, limits=limits) as server:
        slots_taken, tokens = run(scenario(server), timeout_s=60)
    assert slots_taken == 0
    assert tokens == expected


def test_pending_handshakes_past_a_budget_give_way_oldest_first_but_not_a_fresh_burst(
    pair: wanspec.Pair,
) -> None:
    """Past the per-address budget the oldest silent socket of that address gets BUSY, once it
    has waited `pending_evict_after_s`; a burst of fresh ones (edges behind one NAT) stays, and
    past the global cap with none old enough the newcomer is the one refused."""
    limits = ServerLimits(
        handshake_timeout_s=30.0,
        max_pending_per_peer=2,
        max_pending_handshakes=4,
        pending_evict_after_s=1.0,
    )

    async def scenario(server: CloudServer) -> tuple[list[Any], list[int], Any]:
        async def connect(pending: int) -> Any:
            streams = await asyncio.open_connection(*server.address)
            await _until(lambda: server.pending == pending)
            return streams

        old = [await connect(1), await connect(2)]
        await asyncio.sleep(limits.pending_evict_after_s + 0.3)
        fresh = [await connect(2), await connect(2)]  # each pushes an old one out
        dropped = [await _first_reply(reader) for reader, _ in old]
        burst = [await connect(3), await connect(4)]  # fresh ones push nobody out
        seen = [server.pending]
        newcomer_reader, newcomer = await asyncio.open_connection(*server.address)
        refused = await _first_reply(newcomer_reader)
        seen.append(server.pending)
        for _, writer in [*old, *fresh, *burst, (None, newcomer)]:
            writer.close()
        return dropped, seen, refused

    with serving(pair, limits=limits) as server:
        dropped, seen, refused = run(scenario(server), timeout_s=30)
    for error in [*dropped, refused]:
        assert isinstance(error, wire.Error) and error.code == ErrorCode.BUSY
        assert "shaking hands" in error.message
    assert seen == [4, 4]


# ---------------------------------------------------------------------------- held sessions
def test_sessions_held_for_vanished_edges_do_not_lock_new_sessions_out(
    pair: wanspec.Pair,
) -> None:
    """Resumable sessions whose edge vanished without Close wait for it outside the session
    slots, at most `max_held_sessions` of them (the longest held goes first): more vanished
    edges than slots leave room for a new session, and the held ones can still be resumed."""
    limits = ServerLimits(max_sessions=2, max_held_sessions=2, resume_grace_s=60.0)
    sessions = [secrets.token_hex(16) for _ in range(5)]

    async def vanish(server: CloudServer, session: str) -> list[Any]:
        reader, writer = await asyncio.open_connection(*server.address)
        resume = wire.Resume(session, 0, 0, ())
        writer.write(_frames(resume, _hello(pair, "naive"), START))
        replies = [await _first_reply(reader)]
        if isinstance(replies[0], wire.Resumed):
            replies.append(await _first_reply(reader))
        writer.transport.abort()  # a reset, no Close
        return replies

    async def come_back(server: CloudServer, session: str) -> Any:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(_frames(wire.Resume(session, 1, 0, ())))
        reply = await _first_reply(reader)
        if isinstance(reply, wire.Resumed):
            writer.write(_frames(wire.Close("done")))
            assert await _first_reply(reader) is None  # the session ends: the cloud hangs up
            writer.close()
            ended = (session[:12], "closed by edge")
            await _until(lambda: ended in {(r.resumable, r.outcome) for r in server.records})
        writer.close()
        return reply

    async def scenario(server: CloudServer) -> tuple[list[Any], int, list[int], Any, Any]:
        openings = []
        for i, session in enumerate(sessions):
            openings.append(await vanish(server, session))
            await _until(lambda i=i: server.held == min(i + 1, limits.max_held_sessions))
        held = server.held
        edge = RemotePair.of_pair(pair)
        fresh = await generate_async(edge, PROMPT, "naive", SETTINGS, server.address)
        back = await come_back(server, sessions[-1])
        gone = await come_back(server, sessions[0])
        return openings, held, fresh.tokens, back, gone

    with serving(pair, limits=limits) as server:
        openings, held, tokens, back, gone = run(scenario(server), timeout_s=60)
        records = list(server.records)
    assert all([type(m) for m in replies] == [wire.Resumed, wire.HelloAck] for replies in openings)
    assert held == limits.max_held_sessions
    assert tokens == wanspec.generate(pair, PROMPT, "naive", **vars(SETTINGS)).token_ids
    assert isinstance(back, wire.Resumed) and back.received == 2
    assert isinstance(gone, wire.Error) and gone.code == ErrorCode.LIMIT
    dropped = {r.resumable for r in records if "holds at most 2 sessions" in r.outcome}
    assert dropped == {s[:12] for s in sessions[:3]}


# ---------------------------------------------------------------------------- KV-cache budget
def _session_kv_bytes(pair: wanspec.Pair, prompt: str, max_new_tokens: int) -> int:
    """A session's KV-cache estimate by hand for the tiny Llama target (float32): 2 (keys and
    values) × 2 layers × 2 KV heads × 16 per head (64 wide / 4 heads) × 4 bytes per token."""
    return 2 * 2 * 2 * (64 // 4) * 4 * (len(pair.cloud_info.encode(prompt)) + max_new_tokens)


def test_kv_estimate_is_keys_and_values_of_every_layer_and_kv_head_per_cached_token(
    pair: wanspec.Pair,
) -> None:
    config = pair.target.config
    assert (config.num_hidden_layers, config.num_key_value_heads) == (2, 2)
    assert (config.hidden_size, config.num_attention_heads, pair.target.dtype) == (
        64, 4, torch.float32,
    )  # fmt: skip
    assert pair.cloud_info.kv_bytes_per_token == 512
    assert 512 * (len(pair.cloud_info.encode(PROMPT)) + 8) == _session_kv_bytes(pair, PROMPT, 8)
    assert kv_bytes_per_token(config, torch.bfloat16) == 256
    gemma = Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        num_hidden_layers=3,
    )  # fmt: skip
    assert kv_bytes_per_token(gemma, torch.float32) == 2 * 3 * 1 * 32 * 4  # its own head_dim
    assert kv_bytes_per_token(None, torch.float32) is None  # a synthetic model


def test_a_session_over_the_kv_budget_is_refused_with_limit_before_any_model_work(
    pair: wanspec.Pair,
) -> None:
    """The refusal names the session's estimate and the budget, and no job ran for it."""
    need = _session_kv_bytes(pair, PROMPT, 8)
    limits = ServerLimits(max_kv_bytes=need - 1)

    async def scenario(server: CloudServer) -> list[Any]:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(_frames(_hello(pair, "naive"), START))
        replies = [await _first_reply(reader), await _first_reply(reader)]
        writer.close()
        await _until(lambda: len(server.records) == 1)
        return replies

    with serving(pair, limits=limits) as server:
        ack, refused = run(scenario(server), timeout_s=30)
        record, reserved = server.records[0], server.kv_reserved
    assert isinstance(ack, wire.HelloAck)
    assert isinstance(refused, wire.Error) and refused.code == ErrorCode.LIMIT
    assert f"about {need} bytes" in refused.message
    assert f"budget of {need - 1} bytes" in refused.message
    assert record.compute_s == {} and reserved == 0

    def over_budget(tokens: int) -> int:
        raise ProtocolError(f"{tokens} tokens do not fit", ErrorCode.LIMIT)

    machine = KvReserving(make_cloud(pair.cloud_info), over_budget)
    events = [Start(), MessageReceived(_hello(pair, "naive")), MessageReceived(START)]
    actions = [action for event in events for action in machine.handle(event)]
    assert not any(isinstance(action, Compute) for action in actions)  # the prefill never left
    assert actions[-2:] == [
        Send(wire.Error(int(ErrorCode.LIMIT), f"{need // 512} tokens do not fit")),
        Finish(f"error: {need // 512} tokens do not fit"),
    ]
    # the endpoint is done, and so is the method's machine inside it: nothing answers any more
    assert machine.machine.done
    assert machine.handle(MessageReceived(wire.Close("bye"))) == []


def test_two_sessions_that_fit_the_kv_budget_only_one_at_a_time_wait_for_each_other(
    pair: wanspec.Pair,
) -> None:
    """The budget is shared by the open sessions: the second is refused while the first holds
    its share, and admitted once the first has ended and given it back."""
    need = _session_kv_bytes(pair, PROMPT, 8)
    limits = ServerLimits(max_kv_bytes=need + need // 2)
    expected = wanspec.generate(pair, PROMPT, "naive", **vars(SETTINGS)).token_ids

    async def scenario(server: CloudServer) -> tuple[int, RemoteError, list[int]]:
        reader, writer = await asyncio.open_connection(*server.address)  # the first: it waits
        writer.write(_frames(_hello(pair, "naive"), START))
        assert isinstance(await _first_reply(reader), wire.HelloAck)
        await _until(lambda: server.kv_reserved == need)
        edge = RemotePair.of_pair(pair)
        with pytest.raises(RemoteError) as refused:
            await generate_async(edge, PROMPT, "naive", SETTINGS, server.address)
        held = server.kv_reserved
        writer.write(_frames(wire.Close("done")))
        assert await _first_reply(reader) is None  # the first session ends
        writer.close()
        await _until(lambda: server.kv_reserved == 0)
        after = await generate_async(edge, PROMPT, "naive", SETTINGS, server.address)
        await _until(lambda: server.kv_reserved == 0)  # given back when the session ends
        return held, refused.value, after.tokens

    with serving(pair, limits=limits) as server:
        held, refused, tokens = run(scenario(server), timeout_s=60)
    assert held == need
    assert refused.code == ErrorCode.BUSY
    assert f"open sessions hold {need} bytes" in str(refused)
    assert f"budget of {need + need // 2} bytes" in str(refused)
    assert tokens == expected


# ---------------------------------------------------------------------------- the command line
def test_serve_passes_its_admission_and_prefill_flags_to_the_server(
    tiny_pair_hetero: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wanspec serve` started and stopped at once instead of serving until a signal."""
    servers: list[CloudServer] = []

    async def start_then_stop(server: CloudServer, ready: Any) -> None:
        async with server:
            ready(server)
            servers.append(server)

    monkeypatch.setattr("wanspec.net.service.serve_until_signalled", start_then_stop)
    draft, target = tiny_pair_hetero
    args = ["serve", "--target", str(target), "--draft-tokenizer", str(draft), "--port", "0"]
    flags = ["--max-held-sessions", "3", "--max-pending-handshakes", "5",
             "--prefill-chunk", "64", "--max-kv-memory", "1.5MiB"]  # fmt: skip
    env = {"WANSPEC_THREADS": "1"}
    result = CliRunner().invoke(main, [*args, *flags], env=env)
    assert result.exit_code == 0, result.output
    limits = servers[0].limits
    assert (limits.max_held_sessions, limits.max_pending_handshakes) == (3, 5)
    assert limits.max_kv_bytes == 1536 << 10
    assert servers[0]._model.prefill_chunk == 64  # the model thread's own setting
    assert "prefill: in pieces of 64 tokens; KV-cache budget: 1572864 bytes (1.5 MiB)" in (
        result.output
    )
    defaults = CliRunner().invoke(main, args, env=env)
    assert defaults.exit_code == 0, defaults.output
    assert servers[1].limits == ServerLimits()
    assert servers[1]._model.prefill_chunk == 256
    bad = CliRunner().invoke(main, [*args, "--max-kv-memory", "2 parsecs"], env=env)
    assert bad.exit_code == 2 and "bad size '2 parsecs'" in bad.output
    assert len(servers) == 2
