"""The server's Prometheus metrics against what the runs themselves measured.

After known sessions over real loopback TCP, the counters equal the edges' own figures: verified
rounds, accepted tokens in total and per position, frames and payload bits by direction and
message type, sessions by method and outcome, an error by its code; the HTTP endpoint serves
the same numbers; and `wanspec serve --metrics-port` exposes them from a real process.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import wanspec
from nethelpers import run
from test_net_batch import serving
from test_net_cli import Served
from wanspec import wire
from wanspec.net.client import RemotePair, RemoteRun, generate_async
from wanspec.net.framing import read_message, write_message
from wanspec.net.metrics import ServerMetrics, outcome_kind
from wanspec.net.server import CloudServer
from wanspec.protocols.base import PROTOCOL_VERSION, ErrorCode
from wanspec.protocols.settings import GenerationSettings

RUNS = (("xcosd-e", 3), ("naive", 4), ("xcosd-e", 5))  # method, seed


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@pytest.fixture(scope="module")
def server(pair: wanspec.Pair) -> Iterator[CloudServer]:
    with serving(pair) as cloud:
        yield cloud


@pytest.fixture(scope="module")
def runs(pair: wanspec.Pair, server: CloudServer) -> list[RemoteRun]:
    """The known runs, one after another, on a server that saw nothing before."""
    edge = RemotePair.of_pair(pair)
    out = []
    for method, seed in RUNS:
        settings = GenerationSettings(max_new_tokens=16, temperature=0.9, seed=seed)
        out.append(run(generate_async(edge, "hello world", method, settings, server.address), 60))
    _until(lambda: len(server.records) == len(RUNS))
    return out


def _until(condition: Callable[[], bool]) -> None:
    """Wait (at most 10 s) for the server to count what it just sent: a frame is counted once
    written, which may be a moment after the peer has read it."""

    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    run(wait(), 10)


def test_round_and_acceptance_counters_equal_the_edges_own(
    runs: list[RemoteRun], server: CloudServer
) -> None:
    value = server.metrics.value
    per_round = [a for r in runs for a in r.edge.accepted_per_round]
    assert value("wanspec:spec_decode_num_drafts_total") == len(per_round) > 0
    assert value("wanspec:spec_decode_num_accepted_tokens_total") == sum(per_round)
    for position in range(max(per_round) + 1):
        accepted_here = sum(a > position for a in per_round)
        sample = "wanspec:spec_decode_num_accepted_tokens_per_pos_total"
        assert value(sample, position=str(position)) == accepted_here
    drafted = value("wanspec:spec_decode_num_draft_tokens_total")
    assert sum(per_round) <= drafted <= 4 * len(per_round)  # γ = 4
    for method in {m for m, _ in RUNS}:
        mine = [r for r, (m, _) in zip(runs, RUNS, strict=True) if m == method]
        rounds = sum(len(r.edge.accepted_per_round) for r in mine)
        assert value("wanspec:verify_rounds_total", method=method) == rounds
    assert value("wanspec:verify_latency_seconds_count") == len(per_round)


def test_frame_and_bit_counters_equal_the_edges_own(
    runs: list[RemoteRun], server: CloudServer
) -> None:
    value = server.metrics.value
    for direction in ("up", "down"):
        frames: Counter[str] = Counter()
        bits: Counter[str] = Counter()
        for r in runs:
            for kind, (count, size) in r.record.traffic_by_type[direction].items():
                frames[kind] += count
                bits[kind] += size
        assert ("Draft" if direction == "up" else "VerifyResult") in bits
        for kind in bits:
            assert (
                value("wanspec:wire_frames_total", direction=direction, type=kind) == frames[kind]
            )
            assert value("wanspec:wire_bits_total", direction=direction, type=kind) == bits[kind]
    up = sum(r.sent.payload_bits for r in runs)
    total_up = sum(
        s.value
        for family in server.metrics.registry.collect()
        if family.name == "wanspec:wire_bits"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["direction"] == "up"
    )
    assert total_up == up


def test_sessions_by_method_and_outcome_and_the_open_gauge(
    runs: list[RemoteRun], server: CloudServer
) -> None:
    value = server.metrics.value
    ended = Counter((r.method, outcome_kind(r.outcome)) for r in server.records)
    assert Counter(m for m, _ in ended.elements()) == Counter(m for m, _ in RUNS)
    assert not {kind for _, kind in ended} & {"error", "refused", "edge_gone", "internal_error"}
    for (method, outcome), count in ended.items():
        assert value("wanspec:requests_total", method=method, outcome=outcome) == count
    assert value("wanspec:num_requests_running") == 0
    assert value("wanspec:batch_size_count") > 0


def test_an_error_frame_is_counted_by_its_code(runs: list[RemoteRun], server: CloudServer) -> None:
    async def wrong_tokenizer() -> wire.Message:
        reader, writer = await asyncio.open_connection(*server.address)
        hello = wire.Hello(PROTOCOL_VERSION, "edge", "xcosd", "", "not-this-tokenizer", "")
        await write_message(writer, hello)
        reply = await read_message(reader)
        writer.close()
        return reply

    before = server.metrics.value("wanspec:errors_total", kind=ErrorCode.MISMATCH.name)
    reply = run(wrong_tokenizer(), 10)
    assert isinstance(reply, wire.Error) and reply.code == ErrorCode.MISMATCH
    _until(lambda: server.metrics.value("wanspec:errors_total", kind="MISMATCH") > before)
    assert server.metrics.value("wanspec:errors_total", kind="MISMATCH") == before + 1


def test_the_http_endpoint_serves_the_registry(runs: list[RemoteRun], server: CloudServer) -> None:
    port = server.metrics.serve_http(0)
    try:
        families = _scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.metrics.stop_http()
    per_round = [a for r in runs for a in r.edge.accepted_per_round]
    assert families["wanspec:spec_decode_num_drafts_total"] == len(per_round)


def _scrape(url: str) -> dict[str, float]:
    """Sample name -> value of the unlabelled samples at `url`."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


def test_outcome_labels_keep_only_the_kind() -> None:
    assert outcome_kind("error: no message within 10 s") == "error"
    assert outcome_kind("edge gone: connection lost: reset") == "edge_gone"
    assert outcome_kind("done") == "done" and outcome_kind("") == "unknown"


def test_separate_servers_keep_separate_registries() -> None:
    one, two = ServerMetrics(), ServerMetrics()
    one.num_drafts.inc()
    assert (one.value("wanspec:spec_decode_num_drafts_total"), two.value("x")) == (1, 0)


@pytest.mark.slow  # a server process: ~10 s to start torch and load
def test_serve_metrics_port_exposes_the_process_metrics(
    tiny_pair_hetero: tuple[Path, Path], pair: wanspec.Pair
) -> Any:
    draft, target = tiny_pair_hetero
    args = ["--target", str(target), "--draft-tokenizer", str(draft), "--port", "0"]
    served = Served([*args, "--metrics-port", "0"])
    try:
        port = served.wait_for(r"serving .* on 127\.0\.0\.1:(\d+)").group(1)
        metrics = served.wait_for(r"metrics: (http://\S+)").group(1)
        result = wanspec.generate(
            pair,
            "hello",
            "xcosd-e",
            server=f"127.0.0.1:{port}",
            token="cli-t0ken",
            max_new_tokens=8,
            seed=1,
        )
        families = _scrape(metrics)
        assert families["wanspec:spec_decode_num_drafts_total"] == result.stats["rounds"]
    finally:
        served.proc.kill()
        served.proc.wait(timeout=30)
