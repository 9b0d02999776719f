"""Codec frames over real loopback TCP: round trips, byte accounting, and clean errors."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from nethelpers import run, socket_pair
from test_wire import EXAMPLES
from wanspec.link import HEADER_BYTES, MSS, segments
from wanspec.net import (
    ConnectionClosed,
    FrameReader,
    MessageStream,
    TrafficCounter,
    read_message,
)
from wanspec.wire import Close, Limits, Message, StartRequest, Tokens, WireError, bits, encode

SMALL = sorted(EXAMPLES, key=lambda m: len(encode(m)))[:8]  # short enough to send byte by byte


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


def _counted(frames: list[bytes]) -> TrafficCounter:
    """What a receiving counter holds after exactly these frames."""
    counter = TrafficCounter()
    for f in frames:
        counter.count(len(f))
    return counter


async def _one_byte_at_a_time(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Every byte in a write (and a TCP segment) of its own, so reads end anywhere."""
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        await writer.drain()
        await asyncio.sleep(0.0005)


def test_frames_sent_one_byte_at_a_time_are_all_read_in_order_and_counted() -> None:
    frames = [encode(m) for m in SMALL]

    async def scenario() -> tuple[list[Message], MessageStream]:
        async with socket_pair() as ((_, cw), (sr, sw)):
            receiver = MessageStream(sr, sw)
            writing = asyncio.create_task(_one_byte_at_a_time(cw, b"".join(frames)))
            got = [await receiver.receive() for _ in frames]
            await writing
            return got, receiver

    got, receiver = run(scenario(), timeout_s=10)
    assert got == SMALL
    assert receiver.received == _counted(frames)


def test_many_frames_in_one_write_are_all_read_in_order_and_counted() -> None:
    messages = [*EXAMPLES, _large_start_request(), *EXAMPLES]
    frames = [encode(m) for m in messages]

    async def scenario() -> tuple[list[Message], MessageStream]:
        async with socket_pair() as ((_, cw), (sr, sw)):
            receiver = MessageStream(sr, sw)
            cw.write(b"".join(frames))
            cw.write_eof()
            got = [await receiver.receive() for _ in frames]
            with pytest.raises(ConnectionClosed):
                await receiver.receive()
            return got, receiver

    got, receiver = run(scenario(), timeout_s=10)
    assert got == messages
    assert receiver.received == _counted(frames)  # one count per frame, its exact bytes


def test_every_reader_of_one_socket_shares_its_decoder() -> None:
    """Bytes read past a frame by one reader (a handshake's) are the next reader's to read."""
    messages = [Close("a"), Tokens((1, 2)), Close("b"), Tokens((3,)), Close("c")]

    async def scenario() -> list[object]:
        async with socket_pair() as ((_, cw), (sr, sw)):
            cw.write(b"".join(encode(m) for m in messages))  # one read takes them all
            await cw.drain()
            got: list[object] = [await read_message(sr)]
            got.append(await MessageStream(sr, sw).receive())
            got.append(await FrameReader(sr).receive_frame())
            got.append(await FrameReader(sr).receive())
            got.append(await read_message(sr))
            return got

    got = run(scenario(), timeout_s=5)
    assert got == [*messages[:2], encode(messages[2]), *messages[3:]]


CUT = {
    "header": (1, "inside a frame header"),
    "header-type": (2, "inside a frame header"),
    "payload-start": (3, "inside a frame \\("),
    "payload": (10, "inside a frame \\("),
}


@pytest.mark.parametrize("where", CUT)
@pytest.mark.parametrize("after", [0, 2], ids=["alone", "after-2-frames"])
def test_end_of_stream_inside_a_frame_is_a_wire_error(where: str, after: int) -> None:
    keep, match = CUT[where]
    frame = encode(StartRequest(3, "hello there", {"max_new_tokens": 4}))  # 3-byte header
    whole = [Close(str(i)) for i in range(after)]

    async def scenario() -> list[Message]:
        async with socket_pair() as ((_, cw), (sr, sw)):
            cw.write(b"".join(encode(m) for m in whole) + frame[:keep])
            cw.close()
            stream = MessageStream(sr, sw)
            got = [await stream.receive() for _ in whole]
            with pytest.raises(WireError, match=match):
                await stream.receive()
            return got

    assert run(scenario(), timeout_s=5) == whole


READERS = {
    "read_message": lambda sr, sw, limits: read_message(sr, limits),
    "MessageStream": lambda sr, sw, limits: MessageStream(sr, sw, limits).receive(),
    "receive_frame": lambda sr, sw, limits: FrameReader(sr, limits).receive_frame(),
}


@pytest.mark.parametrize("reader", READERS)
def test_oversized_frame_is_refused_before_its_payload_arrives(reader: str) -> None:
    limits = Limits(max_frame=4096)
    header = encode(Close("x"))[:2] + bytes([0x90, 0x4E])  # announces a 10 000-byte payload

    async def scenario() -> float:
        async with socket_pair() as ((_, cw), (sr, sw)):
            cw.write(header)  # the payload never comes and the sender stays connected
            await cw.drain()
            began = time.monotonic()
            with pytest.raises(WireError, match="exceeds"):
                await asyncio.wait_for(READERS[reader](sr, sw, limits), 2.0)
            return time.monotonic() - began

    assert run(scenario(), timeout_s=5) < 1.0


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
