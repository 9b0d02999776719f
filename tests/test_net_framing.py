"""Codec frames over real loopback TCP: round trips, byte accounting, and clean errors."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from nethelpers import run, socket_pair
from test_wire import EXAMPLES
from wanspec.net import ConnectionClosed, MessageStream, TrafficCounter, read_message
from wanspec.net.segments import HEADER_BYTES, MSS, segments
from wanspec.wire import Close, Limits, StartRequest, WireError, bits, encode


def _large_start_request() -> StartRequest:
    """A frame of ~300 kB, so that reading it takes many socket reads."""
    example = next(m for m in EXAMPLES if isinstance(m, StartRequest))
    return dataclasses.replace(example, prompt="é" * 150_000)


def test_every_message_type_round_trips_over_tcp_with_its_exact_bits() -> None:
    messages = [*EXAMPLES, _large_start_request()]

    async def scenario() -> tuple[list[object], MessageStream, MessageStream]:
        async with socket_pair() as ((cr, cw), (sr, sw)):
            sender, receiver = MessageStream(cr, cw), MessageStream(sr, sw)
            received = []
            for msg in messages:  # one at a time: a frame bigger than the socket buffers
                sending = asyncio.create_task(sender.send(msg))
                received.append(await receiver.receive())
                await sending
            return received, sender, receiver

    received, sender, receiver = run(scenario())
    assert received == messages
    assert [type(m) for m in received] == [type(m) for m in messages]
    sizes = [len(encode(m)) for m in messages]
    for counter in (sender.sent, receiver.received):
        assert counter.messages == len(messages)
        assert counter.payload_bits == sum(bits(m) for m in messages)
        assert counter.framing_bits == 0  # the codec frame is the transport frame
        assert counter.est_tcpip_header_bytes == HEADER_BYTES * sum(segments(s) for s in sizes)
    assert receiver.sent == TrafficCounter() and sender.received == TrafficCounter()


def test_segment_estimate_counts_whole_segments() -> None:
    assert [segments(n) for n in (0, 1, MSS, MSS + 1, 10 * MSS)] == [0, 1, 1, 2, 10]
    counter = TrafficCounter()
    counter.count(MSS + 1)
    counter.count(3)
    assert counter == TrafficCounter(2, 8 * (MSS + 4), 0, 3 * HEADER_BYTES)
    with pytest.raises(ValueError):
        segments(-1)


def test_clean_close_between_frames_is_connection_closed() -> None:
    async def scenario() -> tuple[list[object], BaseException]:
        async with socket_pair() as ((_, cw), (sr, _)):
            cw.write(encode(Close("a")) + encode(Close("b")))
            cw.close()
            got = [await read_message(sr), await read_message(sr)]
            with pytest.raises(ConnectionClosed) as info:
                await read_message(sr)
            return got, info.value

    got, _ = run(scenario(), timeout_s=5)
    assert got == [Close("a"), Close("b")]


@pytest.mark.parametrize("keep", [1, 2, 3, 10], ids=lambda k: f"first-{k}-bytes")
def test_truncated_frame_is_a_clean_wire_error(keep: int) -> None:
    frame = encode(StartRequest(3, "hello there", {"max_new_tokens": 4}))  # 3-byte header

    async def scenario() -> None:
        async with socket_pair() as ((_, cw), (sr, _)):
            cw.write(frame[:keep])
            cw.close()
            with pytest.raises(WireError, match="ended inside a frame"):
                await read_message(sr)

    run(scenario(), timeout_s=5)


def test_oversized_frame_is_refused_before_its_payload_arrives() -> None:
    limits = Limits(max_frame=4096)
    header = encode(Close("x"))[:2] + bytes([0x90, 0x4E])  # announces a 10 000-byte payload

    async def scenario() -> None:
        async with socket_pair() as ((_, cw), (sr, _)):
            cw.write(header)  # the payload never comes and the sender stays connected
            await cw.drain()
            with pytest.raises(WireError, match="exceeds"):
                await asyncio.wait_for(read_message(sr, limits), 2.0)

    run(scenario(), timeout_s=5)


def test_a_message_too_big_to_send_is_refused_before_writing() -> None:
    async def scenario() -> bytes:
        async with socket_pair() as ((_, cw), (sr, _)):
            sender = MessageStream(asyncio.StreamReader(), cw, Limits(max_frame=1000))
            with pytest.raises(WireError, match="exceeds"):
                await sender.send(StartRequest(1, "x" * 2000, {}))
            assert sender.sent == TrafficCounter()
            cw.close()
            return await sr.read()

    assert run(scenario(), timeout_s=5) == b""


def test_random_bytes_are_wire_errors() -> None:
    """Random streams, half of them behind a valid frame start, never decode into anything
    but a WireError: no other exception, no hang."""
    rng = np.random.default_rng(9)
    starts = [encode(m)[:2] for m in EXAMPLES]

    async def read_all(data: bytes) -> BaseException:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        while True:
            try:
                await read_message(reader)
            except Exception as exc:
                return exc

    async def scenario() -> list[BaseException]:
        errors = []
        for k in range(400):
            data = rng.integers(0, 256, size=int(rng.integers(1, 300)), dtype=np.uint8).tobytes()
            if k % 2:
                data = starts[k % len(starts)] + data
            errors.append(await read_all(data))
        return errors

    errors = run(scenario())
    assert all(isinstance(e, WireError) for e in errors), {type(e) for e in errors}
