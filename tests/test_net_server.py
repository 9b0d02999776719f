"""`wanspec serve` and the edge over real loopback TCP, on tiny transformers models.

Parity: every method through the WAN proxy gives the simulator's tokens, text and payload bits
(greedy and sampled), and greedy equals `transformers` greedy. Then one server under load: eight
sessions at once and a ninth refused as busy; bad input of every kind refused with a clear error
while a healthy session on the same server completes; TLS with a self-signed certificate; and a
shutdown that ends an in-flight session with a reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import wanspec
from nethelpers import run
from wanspec import wire
from wanspec.net import DirectionSpec
from wanspec.net.background import cloud_behind_wan
from wanspec.net.client import ClientOptions, RemoteError, RemotePair, generate_async
from wanspec.net.framing import ConnectionClosed, read_message
from wanspec.net.server import CloudServer, ServerLimits, server_tls
from wanspec.protocols.base import PROTOCOL_VERSION, ErrorCode
from wanspec.protocols.registry import METHODS, edge_fingerprints
from wanspec.protocols.settings import DEFAULT_TREE_BUDGET, GenerationSettings
from wanspec.sim import Link

PROMPT = "hello world"
NEW = 8
WAN = DirectionSpec(rate_bps=10e6, delay_s=0.01, jitter_s=0.003)  # seeded jitter: real timing
SIM_LINK = Link(bandwidth_bps=10e6, rtt_s=0.02)
TOKEN = "t0ken-for-tests"
HETERO = [m for m, info in METHODS.items() if not info.shared_vocab_only]
SHARED_ONLY = [m for m, info in METHODS.items() if info.shared_vocab_only]
# A pipeline's draft probabilities come from a tree pass on a cache hit and from a one-token
# decode on a miss; by default those logits differ in the last bits, so its sampled tokens depend
# on which happened, that is on timing. Its sampled parity is checked in invariant mode, where
# the two are bitwise equal.
PIPELINES = [m for m, info in METHODS.items() if info.family == "pipeline"]


def _load(folders: tuple[Path, Path], invariant: bool = False) -> wanspec.Pair:
    draft, target = folders
    # one thread: no thread fights on 2 cores
    return wanspec.load_pair(target=target, draft=draft, threads=1, invariant=invariant)


@pytest.fixture(scope="module")
def hetero(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    return _load(tiny_pair_hetero)


@pytest.fixture(scope="module")
def shared(tiny_pair_shared: tuple[Path, Path]) -> wanspec.Pair:
    return _load(tiny_pair_shared)


@pytest.fixture(scope="module")
def hetero_cloud(hetero: wanspec.Pair) -> Iterator[tuple[str, CloudServer, Any]]:
    with cloud_behind_wan(hetero.target, hetero.cloud_info, WAN, WAN, seed=1) as cloud:
        yield cloud


@pytest.fixture(scope="module")
def shared_cloud(shared: wanspec.Pair) -> Iterator[tuple[str, CloudServer, Any]]:
    with cloud_behind_wan(shared.target, shared.cloud_info, WAN, WAN, seed=2) as cloud:
        yield cloud


def _transformers_greedy_text(pair: wanspec.Pair) -> str:
    ids = torch.tensor([pair.target_encode(PROMPT)])
    out = pair.target.model.generate(
        ids, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(ids)
    )
    return pair.decode(out[0, ids.shape[1] :].tolist())


def _check_parity(pair: wanspec.Pair, address: str, method: str, **settings: Any) -> Any:
    """The run over TCP equals the simulated one: tokens, text, payload bits per type (except
    for a method that sends chains ahead: how many it sends before their verdicts, and so its
    uplink, depends on when each verdict arrives; and for xcosd-auto, whose messages are those
    of the mechanism its clock chose each round)."""
    settings = {"max_new_tokens": NEW, **settings}
    sim = wanspec.generate(pair, PROMPT, method, link=SIM_LINK, **settings)
    net = wanspec.generate(pair, PROMPT, method, server=address, **settings)
    assert net.token_ids == sim.token_ids and net.text == sim.text
    assert net.stats["clock"] == "wall" and net.stats["uplink_framing_bits"] == 0
    if METHODS[method].sends_ahead or METHODS[method].tokens_follow_timing:
        return net
    assert net.stats["bits_by_type"] == sim.stats["bits_by_type"]
    assert (net.stats["uplink_bits"], net.stats["downlink_bits"]) == (
        sim.stats["uplink_bits"],
        sim.stats["downlink_bits"],
    )
    return net


def _sampled_params(methods: list[str]) -> list[str]:
    """Methods whose sampled tokens must not depend on timing (xcosd-auto's do, by design)."""
    return [m for m in methods if m not in PIPELINES and not METHODS[m].tokens_follow_timing]


@pytest.mark.parametrize("method", HETERO)
def test_greedy_over_tcp_is_the_simulators_and_transformers_text_hetero(
    hetero: wanspec.Pair, hetero_cloud: Any, method: str
) -> None:
    net = _check_parity(hetero, hetero_cloud[0], method, temperature=0.0)
    if METHODS[method].lossless:
        assert net.text == _transformers_greedy_text(hetero)


def test_srdv_k_and_m_chosen_online_over_tcp_keep_transformers_greedy_text(
    hetero: wanspec.Pair, hetero_cloud: Any
) -> None:
    """The edge's first-set K reaches the cloud over TCP (`FirstCandidates`) and greedy text
    stays the target's."""
    settings = {"max_new_tokens": NEW, "temperature": 0.0, "srdv_k": "auto", "srdv_m": "auto"}
    net = wanspec.generate(hetero, PROMPT, "xcosd-e", server=hetero_cloud[0], **settings)
    assert net.text == _transformers_greedy_text(hetero)
    assert net.stats["first_candidates_set"] >= 1 and net.stats["srdv_candidate_rounds"] >= 1


def test_tree_budget_chosen_online_over_tcp_gives_the_tokens_of_a_fixed_budget(
    invariant_pairs: dict[bool, wanspec.Pair], shared: wanspec.Pair, shared_cloud: Any
) -> None:
    """A live edge has no latency profile: its controller prices the budgets by the tree
    passes it times and drafts trees at budgets other than the default's 16; the tokens stay
    a fixed budget's (sampled, tree and decode logits bitwise equal), and greedy text the
    target's."""
    pair, settings = invariant_pairs[True], {"max_new_tokens": 32, "temperature": 0.9, "seed": 5}
    with cloud_behind_wan(pair.target, pair.cloud_info, WAN, WAN, seed=3) as cloud:
        fixed = wanspec.generate(pair, PROMPT, "acespec", server=cloud[0], **settings)
        auto = wanspec.generate(
            pair, PROMPT, "acespec", server=cloud[0], tree_budget="auto", **settings
        )
    assert auto.token_ids == fixed.token_ids
    assert set(auto.stats["budget_per_round"]) - {DEFAULT_TREE_BUDGET}, auto.stats
    greedy = wanspec.generate(shared, PROMPT, "acespec", server=shared_cloud[0],
                              max_new_tokens=NEW, temperature=0.0, tree_budget="auto")  # fmt: skip
    assert greedy.text == _transformers_greedy_text(shared)


@pytest.mark.parametrize("method", _sampled_params(HETERO))
def test_sampled_over_tcp_is_the_simulators_run_hetero(
    hetero: wanspec.Pair, hetero_cloud: Any, method: str
) -> None:
    _check_parity(hetero, hetero_cloud[0], method, temperature=0.9, top_p=0.95, seed=7)


@pytest.mark.parametrize("method", SHARED_ONLY)
def test_greedy_over_tcp_is_the_simulators_and_transformers_text_shared(
    shared: wanspec.Pair, shared_cloud: Any, method: str
) -> None:
    net = _check_parity(shared, shared_cloud[0], method, temperature=0.0)
    assert net.text == _transformers_greedy_text(shared)


@pytest.mark.parametrize("method", _sampled_params(SHARED_ONLY))
def test_sampled_over_tcp_is_the_simulators_run_shared(
    shared: wanspec.Pair, shared_cloud: Any, method: str
) -> None:
    _check_parity(shared, shared_cloud[0], method, temperature=0.9, seed=11)


@pytest.fixture(scope="module")
def invariant_pairs(
    tiny_pair_shared: tuple[Path, Path], tiny_pair_hetero: tuple[Path, Path]
) -> dict[bool, wanspec.Pair]:
    """Both tiny pairs in pass-shape-invariant mode, by `shared_vocab_only`."""
    return {True: _load(tiny_pair_shared, True), False: _load(tiny_pair_hetero, True)}


@pytest.mark.parametrize("method", PIPELINES)
def test_sampled_pipelines_over_tcp_are_the_simulators_run_in_invariant_mode(
    invariant_pairs: dict[bool, wanspec.Pair], method: str
) -> None:
    """With tree and decode logits bitwise equal, a pipeline's sampled tokens are the same over
    TCP (real timing, jittered WAN) as in the simulator, hits and misses wherever they fall."""
    pair = invariant_pairs[METHODS[method].shared_vocab_only]
    # deepspec-tree chooses each chain's p̃ by the clock: here every chain carries it
    pinned = {"chain_dists": "always"} if METHODS[method].sends_forks else {}
    with cloud_behind_wan(pair.target, pair.cloud_info, WAN, WAN, seed=3) as cloud:
        net = _check_parity(
            pair, cloud[0], method, temperature=0.9, seed=5, max_new_tokens=16, **pinned
        )
    assert net.stats.get("cache_hits", 0) + net.stats.get("cache_misses", 0) >= 2


def test_an_edge_with_only_the_draft_and_the_target_tokenizer(
    hetero: wanspec.Pair, hetero_cloud: Any, tiny_pair_hetero: tuple[Path, Path]
) -> None:
    """No target model on the edge: the server's handshake gives the logits width."""
    address = hetero_cloud[0]
    sim = wanspec.generate(hetero, PROMPT, "xcosd-e", temperature=0.9, seed=3, max_new_tokens=NEW)
    net = wanspec.generate(
        hetero.draft,
        PROMPT,
        "xcosd-e",
        server=address,
        target_tokenizer=tiny_pair_hetero[1],
        temperature=0.9,
        seed=3,
        max_new_tokens=NEW,
    )
    assert net.token_ids == sim.token_ids
    with pytest.raises(ValueError, match="target_tokenizer"):
        wanspec.generate(hetero.draft, PROMPT, "xcosd", server=address)


# ============================================================================ one server, loaded


async def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def _settings(seed: int, **more: Any) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=NEW, temperature=0.9, seed=seed, **more)


def test_eight_sessions_at_once_are_all_correct_and_a_ninth_is_busy(
    hetero: wanspec.Pair, hetero_cloud: Any
) -> None:
    address, server, _ = hetero_cloud
    jobs = list(zip(["xcosd", "xcosd-e", "naive", "ar"] * 2, range(8), strict=True))
    expected = [
        wanspec.generate(hetero, PROMPT, m, link=SIM_LINK, **vars(_settings(seed))).token_ids
        for m, seed in jobs
    ]
    edge = RemotePair.of_pair(hetero)

    async def scenario() -> tuple[RemoteError, list[Any]]:
        tasks = [
            asyncio.create_task(generate_async(edge, PROMPT, m, _settings(seed), address))
            for m, seed in jobs
        ]
        await _until(lambda: server.active == 8)
        with pytest.raises(RemoteError) as ninth:
            await generate_async(edge, PROMPT, "xcosd", _settings(99), address)
        return ninth.value, await asyncio.gather(*tasks)

    busy, runs = run(scenario(), timeout_s=180)
    assert busy.code == ErrorCode.BUSY and "busy" in str(busy)
    assert [r.tokens for r in runs] == expected


# ---------------------------------------------------------------------------- bad input

GUARD = ServerLimits(
    handshake_timeout_s=2.0,
    idle_timeout_s=1.0,
    request_timeout_s=60.0,
    write_timeout_s=2.0,
    write_buffer_bytes=4096,
    max_new_tokens=64,
    linger_s=0.5,
)


@pytest.fixture(scope="module")
def guarded(hetero: wanspec.Pair) -> Iterator[tuple[str, CloudServer, Any]]:
    """A server that requires a token and has short deadlines."""
    with cloud_behind_wan(hetero.target, hetero.cloud_info, token=TOKEN, limits=GUARD) as cloud:
        yield cloud


@pytest.fixture(scope="module")
def healthy_tokens(hetero: wanspec.Pair) -> list[int]:
    return wanspec.generate(
        hetero, PROMPT, "xcosd-e", link=SIM_LINK, **vars(_settings(5))
    ).token_ids


def _frames(*messages: Any) -> bytes:
    return b"".join(wire.encode(m) for m in messages)


def _hello(pair: wanspec.Pair, method: str = "xcosd", **changes: Any) -> wire.Hello:
    fp = edge_fingerprints(pair.alignment, pair.target.fingerprint)
    fields = {
        "protocol_version": PROTOCOL_VERSION,
        "role": "edge",
        "method": method,
        "target_model": fp.target_model,
        "target_tokenizer": fp.target_tokenizer,
        "draft_tokenizer": fp.draft_tokenizer,
        **changes,
    }
    return wire.Hello(**fields)


AUTH = wire.Auth(TOKEN)
START = wire.StartRequest(0, PROMPT, {"max_new_tokens": NEW})


def _bad_inputs(pair: wanspec.Pair) -> dict[str, tuple[bytes, ErrorCode, str]]:
    """name -> (bytes the edge sends, then half-closes; the code and words of the answer)."""
    hello = _frames(AUTH, _hello(pair))
    return {
        "random bytes": (bytes(range(255, 0, -3)), ErrorCode.PROTOCOL, "bad magic"),
        "truncated frame": (hello[:-4], ErrorCode.PROTOCOL, "stream ended inside a frame"),
        "oversized frame": (
            _frames(AUTH) + bytes([0xA0 | wire.WIRE_VERSION, 37, 0x80, 0x80, 0x80, 0x08]),
            ErrorCode.LIMIT,
            "exceeds the limit",
        ),
        "wrong wire version": (
            bytes([0xA0 | (wire.WIRE_VERSION + 1), 1, 0]),
            ErrorCode.PROTOCOL,
            f"wire version {wire.WIRE_VERSION + 1}",
        ),
        "wrong protocol version": (
            _frames(AUTH, _hello(pair, protocol_version=PROTOCOL_VERSION + 7), START),
            ErrorCode.VERSION,
            "protocol",
        ),
        "missing token": (
            _frames(_hello(pair), START),
            ErrorCode.UNAUTHORIZED,
            "requires a bearer",
        ),
        "wrong token": (
            _frames(wire.Auth("guess"), _hello(pair), START),
            ErrorCode.UNAUTHORIZED,
            "wrong bearer token",
        ),
        "unknown method": (
            _frames(AUTH, _hello(pair, method="telepathy"), START),
            ErrorCode.UNSUPPORTED,
            "unknown method 'telepathy'",
        ),
        "target tokenizer mismatch": (
            _frames(AUTH, _hello(pair, target_tokenizer="0123456789abcdef"), START),
            ErrorCode.MISMATCH,
            "target tokenizer",
        ),
        "unknown draft tokenizer": (
            _frames(AUTH, _hello(pair, draft_tokenizer="fedcba9876543210"), START),
            ErrorCode.MISMATCH,
            "no alignment",
        ),
        "too many new tokens": (
            _frames(AUTH, _hello(pair), wire.StartRequest(0, PROMPT, {"max_new_tokens": 5000})),
            ErrorCode.LIMIT,
            "over this server's limit 64",
        ),
        "bad settings": (
            _frames(AUTH, _hello(pair), wire.StartRequest(0, PROMPT, {"temperature": -1})),
            ErrorCode.BAD_SETTINGS,
            "temperature",
        ),
        "message out of place": (
            _frames(AUTH, wire.Draft(0, 0, (), (5,), (30000,))),
            ErrorCode.PROTOCOL,
            "unexpected Draft",
        ),
    }


async def _send_and_read_error(
    address: tuple[str, int], data: bytes, *, half_close: bool = True
) -> wire.Error | None:
    """Send raw bytes, then read frames until an Error (returned) or the end (None)."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        while True:
            msg = await asyncio.wait_for(read_message(reader), 10.0)
            if isinstance(msg, wire.Error):
                return msg
    except ConnectionClosed:
        return None
    finally:
        writer.close()


def _alongside_a_healthy_session(
    pair: wanspec.Pair, cloud: Any, bad: Any, expected: list[int]
) -> Any:
    """Run the coroutine `bad` while a healthy session runs on the same server; check the
    healthy one's tokens and return what `bad` returned."""
    address, _, _ = cloud

    async def scenario() -> Any:
        edge = RemotePair.of_pair(pair)
        healthy = generate_async(edge, PROMPT, "xcosd-e", _settings(5), address, _with_token())
        good, outcome = await asyncio.gather(healthy, bad)
        assert good.tokens == expected
        return outcome

    return run(scenario(), timeout_s=60)


def _with_token() -> ClientOptions:
    return ClientOptions(token=TOKEN)


@pytest.mark.parametrize(
    "case",
    [
        "random bytes",
        "truncated frame",
        "oversized frame",
        "wrong wire version",
        "wrong protocol version",
        "missing token",
        "wrong token",
        "unknown method",
        "target tokenizer mismatch",
        "unknown draft tokenizer",
        "too many new tokens",
        "bad settings",
        "message out of place",
    ],
)
def test_bad_input_gets_a_clear_error_while_a_healthy_session_completes(
    hetero: wanspec.Pair, guarded: Any, healthy_tokens: list[int], case: str
) -> None:
    data, code, words = _bad_inputs(hetero)[case]
    server = guarded[1]
    error = _alongside_a_healthy_session(
        hetero, guarded, _send_and_read_error(server.address, data), healthy_tokens
    )
    assert isinstance(error, wire.Error), case
    assert (ErrorCode(error.code), words in error.message) == (code, True), error.message


def test_a_silent_edge_is_cut_off_by_the_idle_timeout(
    hetero: wanspec.Pair, guarded: Any, healthy_tokens: list[int]
) -> None:
    data = _frames(AUTH, _hello(hetero), START)  # then waits without drafting
    bad = _send_and_read_error(guarded[1].address, data, half_close=False)
    error = _alongside_a_healthy_session(hetero, guarded, bad, healthy_tokens)
    assert error.code == ErrorCode.LIMIT and "no message from the peer for 1 s" in error.message


def test_an_edge_vanishing_mid_round_ends_only_its_session(
    hetero: wanspec.Pair, guarded: Any, healthy_tokens: list[int]
) -> None:
    server = guarded[1]
    draft = wire.Draft(0, 0, (), (5, 6), (30000, 20000))

    async def vanish() -> None:
        _, writer = await asyncio.open_connection(*server.address)
        writer.write(_frames(AUTH, _hello(hetero, method="naive"), START, draft))
        await writer.drain()
        await asyncio.sleep(0.2)  # the cloud has read it all and is verifying now
        writer.transport.abort()  # a reset, no goodbye
        gone = lambda: any(r.method == "naive" for r in server.records)  # noqa: E731
        await _until(gone)

    _alongside_a_healthy_session(hetero, guarded, vanish(), healthy_tokens)
    record = next(r for r in server.records if r.method == "naive")
    assert record.outcome.startswith("edge gone"), record.outcome


def test_an_edge_that_never_reads_costs_one_bounded_session(
    hetero: wanspec.Pair, guarded: Any, healthy_tokens: list[int]
) -> None:
    """It asks for 64 streamed tokens and neither reads nor closes: the server's own buffer
    stays within its high-water mark plus one frame, and the session ends on its own."""
    server = guarded[1]
    data = _frames(
        AUTH,
        _hello(hetero, method="ar"),
        wire.StartRequest(0, PROMPT, {"max_new_tokens": 64, "ignore_eos": True}),
    )

    async def never_read() -> float:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        sock.connect(server.address)
        _, writer = await asyncio.open_connection(sock=sock)
        began = time.monotonic()
        writer.write(data)
        await _until(lambda: any(r.method == "ar" for r in server.records), 30)
        writer.close()
        return time.monotonic() - began

    took = _alongside_a_healthy_session(hetero, guarded, never_read(), healthy_tokens)
    record = next(r for r in server.records if r.method == "ar")
    assert record.outcome == "done" and record.down_bytes > 64  # it did stream its tokens
    assert record.peak_write_buffer <= GUARD.write_buffer_bytes + 16
    assert took < 30


def test_a_failure_inside_a_session_is_internal_and_the_server_goes_on(
    hetero: wanspec.Pair,
    guarded: Any,
    healthy_tokens: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug on the server's own side (its prompt encoder failing on one prompt) ends only that
    session, with INTERNAL; a peer's mistakes get their own codes (tests/test_peer_errors.py)."""
    server = guarded[1]
    encode = server.info.encode

    def buggy(text: str) -> list[int]:
        if text == "boom":
            raise RuntimeError("a bug in the server's encoder")
        return encode(text)

    monkeypatch.setattr(server, "info", dataclasses.replace(server.info, encode=buggy))
    data = _frames(AUTH, _hello(hetero), wire.StartRequest(0, "boom", {"max_new_tokens": NEW}))
    bad = _send_and_read_error(server.address, data)
    error = _alongside_a_healthy_session(hetero, guarded, bad, healthy_tokens)
    assert error.code == ErrorCode.INTERNAL and "internal error" in error.message


# ---------------------------------------------------------------------------- TLS, shutdown


def _self_signed(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_a_self_signed_certificate_the_edge_verifies(
    hetero: wanspec.Pair, healthy_tokens: list[int], tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path / "server")
    other, _ = _self_signed(tmp_path / "stranger")
    info, tls = hetero.cloud_info, server_tls(cert, key)
    settings = vars(_settings(5))
    with cloud_behind_wan(hetero.target, info, WAN, WAN, token=TOKEN, tls=tls) as (address, *_):
        res = wanspec.generate(
            hetero, PROMPT, "xcosd-e", server=address, token=TOKEN, tls_ca=cert, **settings
        )
        assert res.token_ids == healthy_tokens and res.stats["auth_bits"] > 0
        with pytest.raises(RemoteError, match="not trusted"):
            wanspec.generate(hetero, PROMPT, "ar", server=address, token=TOKEN, tls_ca=other)
        with pytest.raises(RemoteError):  # plain TCP to a TLS server
            wanspec.generate(hetero, PROMPT, "ar", server=address, token=TOKEN, max_new_tokens=2)


def test_shutdown_ends_an_in_flight_session_with_a_reason(hetero: wanspec.Pair) -> None:
    async def scenario() -> RemoteError:
        async with CloudServer(hetero.target, hetero.cloud_info, port=0) as server:
            address = server.address
            long = GenerationSettings(max_new_tokens=500, ignore_eos=True)
            edge = RemotePair.of_pair(hetero)
            task = asyncio.create_task(generate_async(edge, PROMPT, "ar", long, address))
            await _until(lambda: server.active == 1)
            await server.stop()
        with pytest.raises(RemoteError) as stopped:
            await task
        return stopped.value

    error = run(scenario(), timeout_s=60)
    assert error.code == ErrorCode.SHUTDOWN and "shutting down" in str(error)
