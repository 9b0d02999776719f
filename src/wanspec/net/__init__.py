"""Real networking: the asyncio transport of the wire codec and a user-space WAN emulator.

Floor 3 (beside `wanspec.sim`): imports `wanspec.wire` and `wanspec.link`, never the protocol
machines or the simulator. `framing` carries codec frames over asyncio streams (each socket read
through one `wanspec.wire.FrameDecoder`, `FrameReader`) and counts what they cost; `proxy` is a
transparent TCP proxy that shapes each direction like a WAN link, with the simulator's own link
model (`wanspec.link`, re-exported here: `DirectionSpec`, `Shaper`, `Slot`; `shaping.link_specs`
maps a simulator `Link` onto it); `units` parses `tc`-style rates and durations.
"""

from wanspec.link import DirectionSpec, Shaper, Slot
from wanspec.net.framing import (
    ConnectionClosed,
    FrameReader,
    MessageStream,
    TrafficCounter,
    read_message,
    write_message,
)
from wanspec.net.proxy import ConnectionStats, DirectionStats, WanProxy
from wanspec.net.units import parse_duration, parse_rate

__all__ = [
    "ConnectionClosed",
    "ConnectionStats",
    "DirectionSpec",
    "DirectionStats",
    "FrameReader",
    "MessageStream",
    "Shaper",
    "Slot",
    "TrafficCounter",
    "WanProxy",
    "parse_duration",
    "parse_rate",
    "read_message",
    "write_message",
]
