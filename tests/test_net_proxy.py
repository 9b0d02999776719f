"""The WAN proxy: its timing model (sans-IO), then measured over loopback TCP, then the CLI.

Timing tolerances are the issue's (within 10% of the settings). A busy machine only ever adds
delay (late wake-ups), never removes it, so a delay is measured as the lower quartile of many
samples, and checked never to come in early.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import struct
import sys

import numpy as np
import pytest

from nethelpers import echo, run, tcp_server
from wanspec.cli import wan_proxy_specs
from wanspec.link import MSS
from wanspec.net import DirectionSpec, Shaper, WanProxy, parse_duration, parse_rate
from wanspec.net.proxy import chunk_bytes

LOCAL = ("127.0.0.1", 0)


# ----------------------------------------------------------------------------- units
@pytest.mark.parametrize(
    ("text", "bps"),
    [("1mbit", 1e6), ("10Mbit/s", 1e7), ("800kbit", 8e5), ("2.5gbit", 2.5e9), ("500bit", 500),
     ("1e6", 1e6), ("unlimited", math.inf)],
)  # fmt: skip
def test_rates_parse_in_bits_per_second(text: str, bps: float) -> None:
    assert parse_rate(text) == bps


@pytest.mark.parametrize(
    ("text", "seconds"), [("50ms", 0.05), ("0.2s", 0.2), ("250us", 250e-6), ("1", 1.0), ("0", 0)]
)
def test_durations_parse_in_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1mbps", "10mb", "fast", "0kbit", "-1mbit", ""])
def test_byte_rates_and_nonsense_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


@pytest.mark.parametrize("text", ["50 sec", "-5ms", "5m", "ms"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


# ----------------------------------------------------------------------------- timing model
def test_back_to_back_chunks_are_serialised_at_the_rate_fifo() -> None:
    shaper = Shaper(DirectionSpec(rate_bps=1e6, delay_s=0.01))
    slots = [shaper.admit(0.0, 1250) for _ in range(10)]  # 10 ms of link time each
    assert [s.sent for s in slots] == pytest.approx([0.01 * (k + 1) for k in range(10)])
    assert [s.deliver for s in slots] == pytest.approx([0.01 * (k + 2) for k in range(10)])
    idle = shaper.admit(5.0, 125)  # the link went idle: no debt carried over
    assert (idle.sent, idle.deliver) == pytest.approx((5.001, 5.011))


def test_jitter_is_half_normal_and_never_reorders() -> None:
    spec = DirectionSpec(delay_s=0.02, jitter_s=0.01)
    spaced = Shaper(spec, seed=1)
    extra = np.array([spaced.admit(t, 1).deliver - t - 0.02 for t in range(4000)])
    assert extra.min() >= 0
    assert extra.mean() == pytest.approx(0.01 * math.sqrt(2 / math.pi), rel=0.05)
    dense = Shaper(spec, seed=1)
    deliveries = np.array([dense.admit(k * 1e-4, 1).deliver for k in range(4000)])
    gaps = np.diff(deliveries)
    assert gaps.min() >= 0  # in order even where the jitter drawn would have overtaken
    assert (gaps == 0).sum() > 100  # ... which happened often: the clamp did work


def test_loss_delays_about_loss_fraction_by_whole_rtos() -> None:
    spec = DirectionSpec(delay_s=0.01, loss=0.1)  # rto: one RTT = 20 ms
    shaper = Shaper(spec, seed=2)
    slots = [shaper.admit(float(t), 100) for t in range(4000)]
    retries = np.array([s.retries for s in slots])
    assert (retries > 0).mean() == pytest.approx(0.1, abs=0.015)
    assert (retries > 1).mean() == pytest.approx(0.01, abs=0.005)
    waits = np.array([s.deliver - s.sent - 0.01 for s in slots])
    assert waits == pytest.approx(retries * 0.02)
    big = Shaper(spec, seed=3)  # ten segments: delayed when any of them is lost
    hit = np.mean([big.admit(float(t), 10 * MSS).retries > 0 for t in range(4000)])
    assert hit == pytest.approx(1 - 0.9**10, abs=0.03)


def test_same_seed_same_delays_and_loss_leaves_jitter_alone() -> None:
    def deliveries(seed: list[int], loss: float) -> list[float]:
        shaper = Shaper(DirectionSpec(delay_s=0.01, jitter_s=0.005, loss=loss), seed=seed)
        return [shaper.admit(float(t), 500).deliver for t in range(200)]

    assert deliveries([0, 1, 0], 0.1) == deliveries([0, 1, 0], 0.1)
    assert deliveries([0, 1, 0], 0.1) != deliveries([0, 1, 1], 0.1)
    lossy, clean = deliveries([4], 0.3), deliveries([4], 0.0)
    same = [a == b for a, b in zip(lossy, clean, strict=True)]
    assert 0.5 < np.mean(same) < 1  # chunks that lost nothing kept their jitter


@pytest.mark.parametrize(
    "bad",
    [{"rate_bps": 0}, {"delay_s": -1}, {"jitter_s": math.inf}, {"loss": 1.0}, {"rto_s": -0.1}],
)
def test_direction_spec_refuses_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        DirectionSpec(**bad)


# ----------------------------------------------------------------------------- over TCP
def typical(samples: list[float]) -> float:
    """The emulated delay in samples that scheduling noise can only lengthen."""
    return float(np.percentile(samples, 25))


async def _stamped_ping_pong(
    up: DirectionSpec, down: DirectionSpec, rounds: int, seed: int = 0
) -> tuple[list[tuple[float, float, float]], WanProxy]:
    """(sent, arrived at server, back at client) per ping on the loop's clock, and the proxy."""
    loop = asyncio.get_running_loop()
    arrivals: asyncio.Queue[float] = asyncio.Queue()

    async def stamp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(64):
            arrivals.put_nowait(loop.time())
            writer.write(data)
        writer.close()

    async with (
        tcp_server(stamp) as upstream,
        WanProxy(LOCAL, upstream, up, down, seed=seed) as proxy,
    ):
        reader, writer = await asyncio.open_connection(*proxy.address)
        times = []
        for k in range(rounds):
            sent = loop.time()
            writer.write(struct.pack("<Q", k))
            assert await reader.readexactly(8) == struct.pack("<Q", k)
            times.append((sent, await arrivals.get(), loop.time()))
        writer.close()
    return times, proxy


def test_one_way_delays_and_round_trip_match_the_settings() -> None:
    up, down = DirectionSpec(delay_s=0.030), DirectionSpec(delay_s=0.020)
    times, _ = run(_stamped_ping_pong(up, down, rounds=31))
    ups = [mid - sent for sent, mid, _ in times]
    downs = [back - mid for _, mid, back in times]
    rtts = [back - sent for sent, _, back in times]
    assert min(ups) >= 0.030 and min(downs) >= 0.020  # never early
    assert typical(ups) == pytest.approx(0.030, rel=0.10)
    assert typical(downs) == pytest.approx(0.020, rel=0.10)
    assert typical(rtts) == pytest.approx(0.050, rel=0.10)


def test_throughput_of_each_direction_matches_its_rate() -> None:
    up_bytes, down_bytes = 125_000, 250_000  # one second each at 1 and 2 Mbit/s

    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        marks: dict[str, float] = {}

        async def sink_then_source(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await reader.readexactly(up_bytes)
            marks["up_done"] = loop.time()
            w.write(bytes(down_bytes))
            await w.drain()

        async with tcp_server(sink_then_source) as upstream:
            up, down = DirectionSpec(rate_bps=1e6), DirectionSpec(rate_bps=2e6)
            async with WanProxy(LOCAL, upstream, up, down) as proxy:
                reader, writer = await asyncio.open_connection(*proxy.address)
                start = loop.time()
                writer.write(bytes(up_bytes))
                await reader.readexactly(down_bytes)
                end = loop.time()
                writer.close()
        stats = proxy.connections[0]
        assert (stats.up.bytes, stats.down.bytes) == (up_bytes, down_bytes)
        return marks["up_done"] - start, end - marks["up_done"]

    up_s, down_s = run(scenario())
    assert up_bytes * 8 / up_s == pytest.approx(1e6, rel=0.10)
    assert down_bytes * 8 / down_s == pytest.approx(2e6, rel=0.10)


def test_jitter_never_reorders_nor_delivers_early() -> None:
    delay, jitter, count = 0.010, 0.015, 100

    async def scenario() -> list[tuple[int, float, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[int, float, float]] = []
        done = asyncio.Event()

        async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(count):
                seq, sent = struct.unpack("<Id", await reader.readexactly(12))
                seen.append((seq, sent, loop.time()))
            done.set()

        async with tcp_server(record) as upstream:
            spec = DirectionSpec(delay_s=delay, jitter_s=jitter)
            async with WanProxy(LOCAL, upstream, spec, spec, seed=5) as proxy:
                _, writer = await asyncio.open_connection(*proxy.address)
                for seq in range(count):
                    writer.write(struct.pack("<Id", seq, loop.time()))
                    await asyncio.sleep(0.002)
                await done.wait()
                writer.close()
        return seen

    seen = run(scenario())
    assert [seq for seq, _, _ in seen] == list(range(count))
    extra = np.array([arrived - sent - delay for _, sent, arrived in seen])
    assert extra.min() > -0.0005  # never before the propagation delay
    assert extra.mean() > 0.5 * jitter * math.sqrt(2 / math.pi)  # the jitter is really there


def test_loss_shows_as_retransmission_delay_on_about_loss_fraction() -> None:
    rto, loss, rounds = 0.060, 0.2, 100
    up = DirectionSpec(delay_s=0.002, loss=loss, rto_s=rto)
    times, proxy = run(_stamped_ping_pong(up, DirectionSpec(delay_s=0.002), rounds, seed=7))
    one_way = np.array([mid - sent for sent, mid, _ in times])
    delayed = one_way > 0.002 + rto / 2
    assert delayed.sum() == proxy.connections[0].up.delayed_chunks  # one chunk per ping
    assert delayed.mean() == pytest.approx(loss, abs=0.1)
    single = one_way[delayed & (one_way < 0.002 + 1.5 * rto)]
    assert np.median(single) - 0.002 == pytest.approx(rto, rel=0.10)


def test_a_receiver_that_never_reads_keeps_the_proxy_buffer_bounded() -> None:
    cap, offered = 256 << 10, 96 << 20

    async def scenario() -> tuple[int, int, bool]:
        stalled: list[asyncio.StreamWriter] = []

        async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stalled.append(writer)  # keep the connection open, read nothing

        async with (
            tcp_server(never_read) as upstream,
            WanProxy(LOCAL, upstream, max_buffer=cap) as proxy,
        ):
            _, writer = await asyncio.open_connection(*proxy.address)
            block = bytes(1 << 20)

            async def flood() -> None:
                for _ in range(offered // len(block)):
                    writer.write(block)
                    await writer.drain()

            flooding = asyncio.create_task(flood())
            await asyncio.sleep(1.5)
            stats = proxy.connections[0].up
            finished = flooding.done()
            flooding.cancel()
            writer.transport.abort()
            return stats.peak_buffered, stats.bytes + stats.buffered, finished

    peak, taken, finished = run(scenario())
    assert not finished  # the sender is held back ...
    assert peak <= cap + chunk_bytes(DirectionSpec())  # ... while the proxy holds at most this
    assert taken < offered // 2  # the rest waits in the sender's socket, not in the proxy


def test_half_close_and_close_propagate_both_ways() -> None:
    async def reply_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's half-close arrives
        writer.write(b"got:" + data)
        writer.close()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def scenario() -> tuple[bytes, bytes, bytes, list[str | None], int]:
        spec = DirectionSpec(delay_s=0.005)
        async with tcp_server(reply_after_eof) as replier, tcp_server(hang_up) as closer:
            async with WanProxy(LOCAL, replier, spec, spec) as proxy:
                reader, writer = await asyncio.open_connection(*proxy.address)
                writer.write(b"hello")
                writer.write_eof()
                replied = await reader.read()
                writer.close()
            async with WanProxy(LOCAL, closer, spec, spec) as hung:
                reader, writer = await asyncio.open_connection(*hung.address)
                hung_up = await reader.read()
                writer.close()
        async with WanProxy(LOCAL, closer, spec, spec) as dead:  # its upstream is gone now
            reader, writer = await asyncio.open_connection(*dead.address)
            refused = await reader.read()
            writer.close()
            await asyncio.sleep(0.05)
        errors = [p.connections[0].error for p in (proxy, hung, dead)]
        return replied, hung_up, refused, errors, proxy.active + hung.active + dead.active

    replied, hung_up, refused, errors, active = run(scenario(), timeout_s=5)
    assert replied == b"got:hello"
    assert hung_up == b"" and refused == b""
    assert errors[:2] == [None, None] and "Refused" in (errors[2] or "")
    assert active == 0


def test_connections_are_relayed_independently_and_counted_apart() -> None:
    """Six clients at once take about as long as one alone through the same proxy: each
    connection has a link of its own. A shared bottleneck would add 5 × 0.2 s of uplink
    serialisation to the six, over 2 × one alone (0.2 s + 50 ms of delay, plus whatever this
    machine adds to both runs)."""
    clients, size = 6, 25_000  # 0.2 s of serialisation each way per connection at 1 Mbit/s

    async def one_client(address: tuple[str, int], k: int) -> bytes:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(bytes([k]) * size)
        data = await reader.readexactly(size)
        writer.close()
        return data

    async def scenario() -> tuple[list[bytes], float, float, WanProxy]:
        loop = asyncio.get_running_loop()
        spec = DirectionSpec(rate_bps=1e6, delay_s=0.025)
        async with tcp_server(echo) as upstream:
            async with WanProxy(LOCAL, upstream, spec, spec) as reference:
                start = loop.time()
                assert await one_client(reference.address, 0) == bytes(size)
                alone = loop.time() - start
            async with WanProxy(LOCAL, upstream, spec, spec) as proxy:
                start = loop.time()
                got = await asyncio.gather(*(one_client(proxy.address, k) for k in range(clients)))
                took = loop.time() - start
                await asyncio.sleep(0.1)  # let the proxy see the closes
        return got, alone, took, proxy

    got, alone, took, proxy = run(scenario())
    assert got == [bytes([k]) * size for k in range(clients)]
    assert alone >= 0.2  # the link's rate was applied: 25 kB at 1 Mbit/s
    assert took < 2 * alone, (took, alone)  # a shared bottleneck: 6 × 0.2 s of uplink alone
    assert sorted(c.id for c in proxy.connections) == list(range(clients))
    assert all(c.up.bytes == c.down.bytes == size for c in proxy.connections)


# ----------------------------------------------------------------------------- command line
def test_cli_link_preset_with_overrides() -> None:
    up, down = wan_proxy_specs("wan-4g", up_bw=1e6, down_bw=None, rtt=None, jitter=0.005)
    assert (up.rate_bps, down.rate_bps) == (1e6, 20e6)  # 4G's 20 Mbit/s downlink kept
    assert up.delay_s == down.delay_s == pytest.approx(0.030)  # half of the preset's 60 ms
    assert up.jitter_s == 0.005 and up.timeout_s == pytest.approx(0.060)
    bare, _ = wan_proxy_specs(None)
    assert bare == DirectionSpec()
    with pytest.raises(ValueError, match="unknown link preset"):
        wan_proxy_specs("wan-moon")


def test_cli_relays_with_delay_and_stops_cleanly_on_ctrl_c() -> None:
    async def scenario() -> tuple[str, list[float], int, str]:
        loop = asyncio.get_running_loop()
        async with tcp_server(echo) as (host, port):
            args = ["-m", "wanspec.cli", "wan-proxy", "--listen", "127.0.0.1:0"]
            args += ["--upstream", f"{host}:{port}", "--rtt", "40ms", "--up-bw", "10mbit"]
            child = await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=asyncio.subprocess.PIPE, env={**os.environ}
            )
            assert child.stdout is not None
            banner = (await child.stdout.readline()).decode()
            address = banner.split(" on ")[1].split(",")[0]
            reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
            rtts = []
            for _ in range(8):  # 8 pings of 4 bytes each way
                start = loop.time()
                writer.write(b"ping")
                await reader.readexactly(4)
                rtts.append(loop.time() - start)
            writer.close()
            child.send_signal(signal.SIGINT)
            rest = (await child.stdout.read()).decode()
            return banner, rtts, await child.wait(), rest

    banner, rtts, code, rest = run(scenario(), timeout_s=120)  # the CLI imports in ~10 s
    assert banner.startswith("wan-proxy listening on 127.0.0.1:")
    assert min(rtts) >= 0.040  # rtt/2 each way, not rtt (the 10% bound is tested in-process;
    assert typical(rtts) == pytest.approx(0.040, rel=0.25)  # a second process waits longer)
    assert code == 0
    assert "up   10 Mbit/s, 20 ms one way" in rest and "down unlimited, 20 ms one way" in rest
    assert "up 32 B, down 32 B" in rest and rest.rstrip().endswith("wan-proxy stopped")
