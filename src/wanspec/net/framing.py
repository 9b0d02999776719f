"""Wire-codec messages over asyncio streams, and what each direction's bytes cost.

There is no second length prefix: a codec frame already is a length-delimited frame
(`[magic|version] [type] [varint payload length] [payload]`, see `wanspec.wire.codec`), so the
bytes on the socket are exactly the frames whose bits the papers and the simulator count
(`wanspec.wire.bits`). Framing overhead beyond the codec is therefore zero, and `TrafficCounter`
reports it as such rather than omitting it, so that a future change of transport shows up there.

Reading is bounded: the header is parsed (and checked against `Limits.max_frame`) before a
single payload byte is buffered, so a peer that announces a huge frame is refused at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from wanspec.net.segments import HEADER_BYTES, segments
from wanspec.wire import DEFAULT_LIMITS, Limits, Message, WireError, decode, encode, parse_header


class ConnectionClosed(Exception):
    """The peer closed the stream cleanly, between two frames (not an error of the peer's)."""


@dataclass
class TrafficCounter:
    """Messages and bits that crossed one direction of a connection.

    `payload_bits` are the codec frames' bits (= Σ `wanspec.wire.bits(msg)`); `framing_bits` is
    what the transport adds on top (0: the codec frame is the transport frame);
    `est_tcpip_header_bytes` is an ESTIMATE of the IPv4+TCP headers, assuming every frame goes
    out in its own ceil(len/MSS) segments of 52 header bytes (Nagle off, no coalescing, no ACKs).
    `peak_buffered_bytes` (sending side): the most bytes the transport held unsent just after a
    write; since every write waits for the drain, at most its high-water mark plus one frame.
    """

    messages: int = 0
    payload_bits: int = 0
    framing_bits: int = 0
    est_tcpip_header_bytes: int = 0
    peak_buffered_bytes: int = 0

    def count(self, frame_bytes: int) -> None:
        self.messages += 1
        self.payload_bits += 8 * frame_bytes
        self.est_tcpip_header_bytes += HEADER_BYTES * segments(frame_bytes)


async def _read_header(reader: asyncio.StreamReader, limits: Limits) -> tuple[bytes, int]:
    """The frame header's bytes and its payload length, read a byte at a time so that nothing
    past the header is buffered before the header (and its length) has been checked."""
    head = bytearray()
    while True:
        byte = await reader.read(1)
        if not byte:
            if head:
                raise WireError(f"stream ended inside a frame header ({len(head)} bytes)")
            raise ConnectionClosed("the peer closed the connection")
        head += byte
        parsed = parse_header(bytes(head), limits)
        if parsed is not None:
            return bytes(head), parsed[2]


async def read_message(
    reader: asyncio.StreamReader,
    limits: Limits = DEFAULT_LIMITS,
    counter: TrafficCounter | None = None,
) -> Message:
    """The next message. ConnectionClosed at a clean end of stream between frames; WireError for
    anything malformed, oversized or cut short (after which the stream is unusable)."""
    head, length = await _read_header(reader, limits)
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        got = len(exc.partial)
        raise WireError(f"stream ended inside a frame ({got} of {length} payload bytes)") from exc
    message = decode(head + payload, limits)
    if counter is not None:
        counter.count(len(head) + length)
    return message


async def write_message(
    writer: asyncio.StreamWriter,
    message: Message,
    limits: Limits = DEFAULT_LIMITS,
    counter: TrafficCounter | None = None,
) -> int:
    """Send one message (waiting while the peer's buffers are full); returns its frame's bytes.
    WireError, before anything is written, if the peer could not decode it."""
    frame = encode(message, limits)
    writer.write(frame)
    if counter is not None:
        held = writer.transport.get_write_buffer_size()
        counter.peak_buffered_bytes = max(counter.peak_buffered_bytes, held)
    await writer.drain()
    if counter is not None:
        counter.count(len(frame))
    return len(frame)


@dataclass
class MessageStream:
    """Both directions of one connection with their counters (`sent`, `received`)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    limits: Limits = DEFAULT_LIMITS
    sent: TrafficCounter = field(default_factory=TrafficCounter)
    received: TrafficCounter = field(default_factory=TrafficCounter)

    async def send(self, message: Message) -> int:
        return await write_message(self.writer, message, self.limits, self.sent)

    async def receive(self) -> Message:
        return await read_message(self.reader, self.limits, self.received)

    async def close(self) -> None:
        """Close our side and wait until the transport is gone."""
        self.writer.close()
        await self.writer.wait_closed()
