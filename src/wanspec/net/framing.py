"""Wire-codec messages over asyncio streams, and what each direction's bytes cost.

There is no second length prefix: a codec frame already is a length-delimited frame
(`[magic|version] [type] [varint payload length] [payload]`, see `wanspec.wire.codec`), so the
bytes on the socket are exactly the frames whose bits the papers and the simulator count
(`wanspec.wire.bits`). Framing overhead beyond the codec is therefore zero, and `TrafficCounter`
reports it as such rather than omitting it, so that a future change of transport shows up there.

Every frame read from a socket goes through that socket's one `wanspec.wire.FrameDecoder`,
kept for the reader's whole life (`FrameReader`; `MessageStream` and `read_message` read through
it): the socket is read `CHUNK` bytes at a time, and bytes read past one frame stay buffered for
the next, whoever reads it. Reading is bounded: a frame's header is checked against
`Limits.max_frame` as soon as it is in, so at most one chunk is buffered beyond a frame before
its header is checked, and a peer that announces a huge frame is refused without its payload
being awaited.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

from wanspec.link import HEADER_BYTES, segments
from wanspec.wire import DEFAULT_LIMITS, FrameDecoder, Limits, Message, decode, encode

CHUNK = 64 << 10  # bytes asked of the socket per read


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


# One decoder per reader for the reader's whole life; it goes with the reader.
_DECODERS: weakref.WeakKeyDictionary[asyncio.StreamReader, FrameDecoder] = (
    weakref.WeakKeyDictionary()
)


class FrameReader:
    """Frames and messages from one asyncio stream, through its one `FrameDecoder`.

    Every FrameReader made for the same `StreamReader` shares that reader's decoder, so bytes
    read past a frame are never lost, whichever of them reads next; each checks the frames it
    reads against its own `limits`.
    """

    def __init__(self, reader: asyncio.StreamReader, limits: Limits = DEFAULT_LIMITS) -> None:
        self.reader, self.limits = reader, limits
        decoder = _DECODERS.get(reader)
        if decoder is None:
            decoder = _DECODERS[reader] = FrameDecoder(limits)
        self._decoder = decoder

    async def receive_frame(self) -> bytes:
        """The next frame's raw bytes (header checked, payload not decoded). ConnectionClosed at
        a clean end of stream between frames; WireError for a bad or oversized header, or an end
        of stream inside a frame."""
        decoder = self._decoder
        decoder.limits = self.limits
        while (frame := decoder.next_frame()) is None:
            data = await self.reader.read(CHUNK)
            if not data:
                decoder.end_of_stream()
                raise ConnectionClosed("the peer closed the connection")
            decoder.feed(data)
        return frame

    async def receive(self, counter: TrafficCounter | None = None) -> Message:
        """The next message, counted in `counter` once it decodes; errors as `receive_frame`'s,
        and WireError for a malformed payload (after which the stream is unusable)."""
        frame = await self.receive_frame()
        message = decode(frame, self.limits)
        if counter is not None:
            counter.count(len(frame))
        return message

    def take_buffered(self) -> bytes:
        """The bytes read past the frames returned so far, handed over: a relay that routes on
        a connection's first frames forwards these too, then the rest of the stream as is."""
        return self._decoder.take_buffered()


async def read_message(
    reader: asyncio.StreamReader,
    limits: Limits = DEFAULT_LIMITS,
    counter: TrafficCounter | None = None,
) -> Message:
    """The next message on `reader` (through its one decoder: see `FrameReader.receive`).
    ConnectionClosed at a clean end of stream between frames; WireError for anything malformed,
    oversized or cut short (after which the stream is unusable)."""
    return await FrameReader(reader, limits).receive(counter)


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
        """The next message, counted in `received` (see `FrameReader.receive`)."""
        return await FrameReader(self.reader, self.limits).receive(self.received)

    async def close(self) -> None:
        """Close our side and wait until the transport is gone."""
        self.writer.close()
        await self.writer.wait_closed()
