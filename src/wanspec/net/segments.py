"""TCP segment arithmetic shared by the WAN emulator (loss per segment) and the byte counters.

Both only estimate what the kernel does: the real segmentation depends on Nagle, coalescing of
writes, TSO and the path MTU. The constants describe the common case of an Ethernet path
(MTU 1500) carrying IPv4 and TCP with the timestamp option, which Linux enables by default.
"""

from __future__ import annotations

MSS = 1448  # payload bytes per segment: 1500 − 20 (IPv4) − 20 (TCP) − 12 (timestamp option)
HEADER_BYTES = 52  # IPv4 + TCP headers of one such segment


def segments(nbytes: int) -> int:
    """Segments that carry `nbytes` of payload, each at most MSS long (0 bytes: no segment)."""
    if nbytes < 0:
        raise ValueError(f"a byte count must be >= 0, got {nbytes}")
    return -(-nbytes // MSS)
