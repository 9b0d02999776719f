"""Byte-level primitives: LEB128 varints, zigzag, uint16 arrays, bounded reads.

The reader checks every declared length against the bytes that remain (and the caller's limit)
before anything is allocated, and rejects non-minimal varints so that every decodable frame has
exactly one encoding (decode then re-encode gives the same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wanspec.wire.errors import WireError

_U16 = np.dtype("<u2")


def varint_size(value: int) -> int:
    """Bytes an unsigned LEB128 varint of `value` takes."""
    return max(1, (value.bit_length() + 6) // 7)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Vectorised `varint_size` for a non-negative integer array (values < 2**63)."""
    v = values.astype(np.uint64, copy=False)
    sizes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        sizes += v >= np.uint64(1 << (7 * k))
    return sizes


def zigzag(value: int) -> int:
    """Map a signed int to an unsigned one so small magnitudes stay small (0,-1,1,-2 → 0,1,2,3)."""
    return 2 * value if value >= 0 else -2 * value - 1


def unzigzag(value: int) -> int:
    return value // 2 if value % 2 == 0 else -(value + 1) // 2


class Writer:
    """Appends encoded fields to a growing buffer."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def varint(self, value: int) -> None:
        while value >= 0x80:
            self.buf.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buf.append(value)

    def varints(self, values: np.ndarray) -> None:
        """Append many varints at once (no count prefix)."""
        self.buf += varints_bytes(values)

    def u16s(self, values: Sequence[int]) -> None:
        """Append little-endian uint16s (the caller has checked their range)."""
        self.buf += np.asarray(values, dtype=_U16).tobytes()

    def raw(self, data: bytes) -> None:
        self.buf += data

    def string(self, value: str) -> None:
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise WireError(f"string is not encodable as UTF-8: {exc.reason}") from exc
        self.varint(len(data))
        self.buf += data


def varints_bytes(values: np.ndarray) -> bytes:
    """LEB128-encode a non-negative integer array, vectorised."""
    v = np.asarray(values).astype(np.uint64, copy=False)
    sizes = varint_sizes(v)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])) if len(v) else np.zeros(0, np.int64)
    out = np.zeros(int(sizes.sum()), dtype=np.uint8)
    for k in range(int(sizes.max()) if len(v) else 0):
        mask = sizes > k
        chunk = (v[mask] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (sizes[mask] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[mask] + k] = (chunk | more).astype(np.uint8)
    return out.tobytes()


class Reader:
    """Consumes a payload; every failure (truncation, bad value, overlong varint) is a WireError."""

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise WireError(f"truncated {what}: needs {n} bytes, {self.remaining} left")

    def byte(self, what: str) -> int:
        self.need(1, what)
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self, what: str, max_value: int = (1 << 63) - 1) -> int:
        """Read one minimal varint no larger than `max_value`."""
        value = 0
        shift = 0
        max_len = varint_size(max_value)
        for i in range(max_len):
            b = self.byte(what)
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                if b == 0 and i > 0:
                    raise WireError(f"non-minimal varint for {what}")
                if value > max_value:
                    raise WireError(f"{what} = {value} exceeds the limit {max_value}")
                return value
        raise WireError(f"varint for {what} longer than {max_len} bytes (limit {max_value})")

    def count(self, what: str, limit: int, min_item_bytes: int) -> int:
        """Read an element count and check it against `limit` and the bytes that remain."""
        n = self.varint(what, limit)
        if n * min_item_bytes > self.remaining:
            raise WireError(
                f"{what} = {n} needs at least {n * min_item_bytes} bytes, {self.remaining} left"
            )
        return n

    def varints(self, n: int, what: str, max_value: int) -> np.ndarray:
        """Read `n` minimal varints (each ≤ max_value) into an int64 array, vectorised."""
        if n <= 16:  # numpy's per-call overhead dominates short lists
            return np.array([self.varint(what, max_value) for _ in range(n)], dtype=np.int64)
        max_len = varint_size(max_value)
        window = np.frombuffer(
            self.data, dtype=np.uint8, count=min(self.remaining, n * max_len), offset=self.pos
        )
        ends = np.flatnonzero(window < 0x80)
        if len(ends) < n:
            raise WireError(f"truncated {what}: {len(ends)} of {n} varints present")
        ends = ends[:n]
        starts = np.concatenate(([0], ends[:-1] + 1))
        lengths = ends - starts + 1
        if lengths.max() > max_len:
            raise WireError(f"varint in {what} longer than {max_len} bytes")
        if np.any((window[ends] == 0) & (lengths > 1)):
            raise WireError(f"non-minimal varint in {what}")
        body = window[: ends[-1] + 1].astype(np.int64)
        offsets = np.arange(len(body)) - np.repeat(starts, lengths)
        values = np.add.reduceat((body & 0x7F) << (7 * offsets), starts)
        if values.max() > max_value:
            raise WireError(f"value in {what} exceeds the limit {max_value}")
        self.pos += int(ends[-1]) + 1
        return values

    def u16s(self, n: int, what: str) -> np.ndarray:
        self.need(2 * n, what)
        arr = np.frombuffer(self.data, dtype=_U16, count=n, offset=self.pos).astype(np.int64)
        self.pos += 2 * n
        return arr

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def string(self, what: str, limit: int) -> str:
        n = self.count(f"{what} length", limit, 1)
        data = self.raw(n, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"{what} is not valid UTF-8: {exc.reason}") from exc

    def finish(self, what: str) -> None:
        if self.remaining:
            raise WireError(f"{self.remaining} trailing bytes after {what}")
