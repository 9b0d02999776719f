"""Frames: encode / decode one message, count its bits, and split a byte stream into messages.

Frame = [0xA0 | WIRE_VERSION] [type] [varint payload length] [payload]. Payloads are hand-packed
(varints, uint16 draft probs, varint distribution counts, float64 SR-DV probabilities, float16
arrays); only control messages carry JSON (settings). Encodings are canonical: a frame that
decodes re-encodes to the very same bytes.

Version 4: a distribution carries its precision (16, 24 or 32 bits) and varint counts, theta_o
is a varint at that precision, SR-DV candidates carry q(y) as float64, and a draft packs four
flag bits under its token count (probs, committed, srdv, ahead), so a version-3 peer would
misread it.
Version 5: adds FirstCandidates (type 19), which a version-4 peer would not know.
Version 6: a DraftWithDists may carry a fork (round, token); on it the flag bit that means
srdv on a Draft means fork, so a version-5 peer would refuse it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from wanspec.wire._bytes import Reader, Writer, unzigzag, varint_size, varint_sizes, zigzag
from wanspec.wire.errors import FrameTooLarge, WireError
from wanspec.wire.messages import (
    DEFAULT_LIMITS,
    DIST_BITS,
    MAX_RESUME_PREFIX,
    Auth,
    Candidates,
    CandidatesRequest,
    Close,
    Dist,
    Draft,
    DraftWithDists,
    Error,
    FirstCandidates,
    Hello,
    HelloAck,
    HiddenStates,
    Limits,
    Message,
    OToken,
    ResampleKind,
    ResampleRequest,
    Resume,
    Resumed,
    StartRequest,
    Tokens,
    VerifyResult,
    dist_scale,
)
from wanspec.wire.validate import U63, settings_json, validate

WIRE_VERSION = 6
_MAGIC = 0xA0  # high nibble of the first byte; the low nibble is the version


# ----------------------------------------------------------------------------- field helpers
def _put_ids(w: Writer, ids: Sequence[int]) -> None:
    for tid in ids:
        w.varint(tid)


def _get_ids(r: Reader, n: int, what: str, limits: Limits) -> tuple[int, ...]:
    return tuple(r.varints(n, what, limits.id_bound - 1).tolist())


def _get_u16s(r: Reader, n: int, what: str) -> tuple[int, ...]:
    return tuple(r.u16s(n, what).tolist())


def _put_increasing(w: Writer, values: Sequence[int]) -> None:
    """Strictly increasing ints as gaps: first value, then (difference − 1)."""
    prev = -1
    for v in values:
        w.varint(v - prev - 1)
        prev = v


def _get_increasing(r: Reader, n: int, what: str, bound: int) -> np.ndarray:
    gaps = r.varints(n, what, max(bound - 1, 0))
    values = np.cumsum(gaps + 1) - 1
    if n and values[-1] >= bound:
        raise WireError(f"{what} reach {values[-1]}, must stay below {bound}")
    return values


def _put_settings(w: Writer, settings: dict[str, Any]) -> None:
    w.string(settings_json(settings))


def _reject_constant(name: str) -> None:
    raise WireError(f"settings JSON contains {name}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise WireError("settings JSON repeats a key")
    return out


def _get_settings(r: Reader, limits: Limits) -> dict[str, Any]:
    text = r.string("settings JSON", limits.max_string)
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"settings are not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or settings_json(value) != text:
        raise WireError("settings must be a JSON object in canonical compact form")
    return value


# ----------------------------------------------------------------------------- distributions
def sparse_size(dist: Dist) -> int:
    """Bytes of a distribution body in sparse form (after its precision byte): tag, id gaps,
    varint counts."""
    gaps = np.diff(dist.ids, prepend=-1) - 1
    counts = int(varint_sizes(dist.counts).sum())
    return varint_size(len(dist.ids) + 1) + int(varint_sizes(gaps).sum()) + counts


def dense_size(dist: Dist) -> int:
    """Bytes of a distribution body in dense form (after its precision byte): tag 0, then one
    varint count per id (a zero is one byte)."""
    return 1 + (dist.width - len(dist.ids)) + int(varint_sizes(dist.counts).sum())


def _put_dist_body(w: Writer, dist: Dist) -> None:
    w.buf.append(dist.bits)
    if sparse_size(dist) < dense_size(dist):
        w.varint(len(dist.ids) + 1)
        gaps = np.diff(dist.ids, prepend=-1) - 1
        w.varints(gaps)
        w.varints(dist.counts)
    else:
        w.varint(0)
        w.varints(dist.to_dense())


def _get_dist_body(r: Reader, width: int, what: str) -> Dist:
    bits = r.byte(f"{what} precision")
    if bits not in DIST_BITS:
        raise WireError(f"{what}: precision of {bits} bits, must be one of {DIST_BITS}")
    scale = dist_scale(bits)
    tag = r.varint(f"{what} tag", min(width, scale) + 1)
    if tag == 0:
        dist = Dist.from_dense(r.varints(width, what, scale), bits)
        sparse = sparse_size(dist) < dense_size(dist)
    else:
        n = tag - 1
        r.need(2 * n, what)  # at least one gap byte and one count byte per entry
        ids = _get_increasing(r, n, f"{what} ids", width)
        counts = r.varints(n, f"{what} counts", scale)
        if np.any(counts == 0):
            raise WireError(f"{what}: sparse entry with count 0")
        dist = Dist(width, ids, counts, bits)
        sparse = sparse_size(dist) < dense_size(dist)
    if sparse != (tag != 0):
        raise WireError(f"{what}: not in its smaller (canonical) encoding")
    return dist


def _put_dist(w: Writer, dist: Dist) -> None:
    w.varint(dist.width)
    _put_dist_body(w, dist)


def _get_dist(r: Reader, limits: Limits, what: str) -> Dist:
    width = r.varint(f"{what} width", min(limits.max_width, limits.id_bound))
    return _get_dist_body(r, width, what)


# ----------------------------------------------------------------------------- control messages
def _enc_hello(w: Writer, m: Hello) -> None:
    w.varint(m.protocol_version)
    for text in (m.role, m.method, m.target_model, m.target_tokenizer, m.draft_tokenizer):
        w.string(text)


def _dec_hello(r: Reader, limits: Limits) -> Hello:
    version = r.varint("protocol_version", U63)
    names = ("role", "method", "target_model", "target_tokenizer", "draft_tokenizer")
    return Hello(version, *(r.string(name, limits.max_string) for name in names))


def _enc_hello_ack(w: Writer, m: HelloAck) -> None:
    w.varint(m.protocol_version)
    w.string(m.target_model)
    w.string(m.target_tokenizer)
    _put_settings(w, m.info)


def _dec_hello_ack(r: Reader, limits: Limits) -> HelloAck:
    version = r.varint("protocol_version", U63)
    model = r.string("target_model", limits.max_string)
    tok = r.string("target_tokenizer", limits.max_string)
    return HelloAck(version, model, tok, _get_settings(r, limits))


def _enc_error(w: Writer, m: Error) -> None:
    w.varint(zigzag(m.code))
    w.string(m.message)


def _dec_error(r: Reader, limits: Limits) -> Error:
    code = unzigzag(r.varint("error code", U63))
    return Error(code, r.string("error message", limits.max_string))


def _enc_close(w: Writer, m: Close) -> None:
    w.string(m.reason)


def _dec_close(r: Reader, limits: Limits) -> Close:
    return Close(r.string("close reason", limits.max_string))


def _enc_auth(w: Writer, m: Auth) -> None:
    w.string(m.token)


def _dec_auth(r: Reader, limits: Limits) -> Auth:
    return Auth(r.string("token", limits.max_string))


def _enc_resume(w: Writer, m: Resume) -> None:
    w.string(m.session)
    for value in (m.received, m.committed, len(m.prefix)):
        w.varint(value)
    _put_ids(w, m.prefix)


def _dec_resume(r: Reader, limits: Limits) -> Resume:
    session = r.string("session", limits.max_string)
    received, committed = r.varint("received", U63), r.varint("committed", U63)
    n = r.count("prefix length", MAX_RESUME_PREFIX, 1)
    return Resume(session, received, committed, _get_ids(r, n, "prefix", limits))


def _enc_resumed(w: Writer, m: Resumed) -> None:
    w.varint(m.received)


def _dec_resumed(r: Reader, limits: Limits) -> Resumed:
    return Resumed(r.varint("received", U63))


def _enc_start(w: Writer, m: StartRequest) -> None:
    w.varint(m.request_id)
    w.string(m.prompt)
    _put_settings(w, m.settings)


def _dec_start(r: Reader, limits: Limits) -> StartRequest:
    request_id = r.varint("request_id", U63)
    prompt = r.string("prompt", limits.max_string)
    return StartRequest(request_id, prompt, _get_settings(r, limits))


# ----------------------------------------------------------------------------- uplink messages
# flag bits packed under the token count; on a DraftWithDists the srdv bit means fork
_PROBS, _COMMITTED, _SRDV, _AHEAD = 1, 2, 4, 8
_FORK = _SRDV
_DRAFT_FLAG_BITS = 4


def _enc_draft_head(w: Writer, m: Draft | DraftWithDists) -> None:
    flags = (_PROBS if m.probs else 0) | (_COMMITTED if m.committed else 0)
    if isinstance(m, Draft):
        flags |= (_SRDV if m.srdv else 0) | (_AHEAD if m.ahead else 0)
    elif m.fork is not None:
        flags |= _FORK
    w.varint(m.round)
    w.varint(m.base)
    w.varint(len(m.tokens) << _DRAFT_FLAG_BITS | flags)
    _put_ids(w, m.tokens)
    if m.committed:
        w.varint(len(m.committed) - 1)
        _put_ids(w, m.committed)


def _dec_draft_head(
    r: Reader, limits: Limits
) -> tuple[int, int, tuple[int, ...], tuple[int, ...], int]:
    """Round, base, tokens, committed and the flag bits."""
    rnd = r.varint("round", U63)
    base = r.varint("base", U63)
    mask = (1 << _DRAFT_FLAG_BITS) - 1
    head = r.varint("token count", limits.max_tokens << _DRAFT_FLAG_BITS | mask)
    n, flags = head >> _DRAFT_FLAG_BITS, head & mask
    r.need(n, "tokens")
    tokens = _get_ids(r, n, "tokens", limits)
    committed: tuple[int, ...] = ()
    if flags & _COMMITTED:
        nc = r.count("committed count", limits.max_tokens - 1, 1) + 1
        committed = _get_ids(r, nc, "committed", limits)
    return rnd, base, tokens, committed, flags


def _get_probs(r: Reader, n: int) -> tuple[int, ...]:
    if n == 0:
        raise WireError("probs flag set but no token is verified")
    return _get_u16s(r, n, "probs")


def _enc_draft(w: Writer, m: Draft) -> None:
    _enc_draft_head(w, m)
    w.u16s(m.probs)


def _dec_draft(r: Reader, limits: Limits) -> Draft:
    rnd, base, tokens, committed, flags = _dec_draft_head(r, limits)
    probs = _get_probs(r, len(tokens)) if flags & _PROBS else ()
    srdv, ahead = bool(flags & _SRDV), bool(flags & _AHEAD)
    return Draft(rnd, base, committed, tokens, probs, srdv, ahead)


# A distribution in a DraftWithDists takes at least 6 bytes: its position's gap, the precision,
# the tag and the counts of a complete distribution (their varints sum to at least 2^16 − 1: 3
# bytes); a claimed count of distributions is checked against that before any is read.
_MIN_DIST_BYTES = 6


def _enc_draft_dists(w: Writer, m: DraftWithDists) -> None:
    _enc_draft_head(w, m)
    if m.fork is not None:
        w.varint(m.fork[0])
        w.varint(m.fork[1])
    w.u16s(m.probs)
    w.varint(m.width)
    w.varint(len(m.dists))
    _put_increasing(w, m.dist_positions)
    for dist in m.dists:
        _put_dist_body(w, dist)


def _dec_draft_dists(r: Reader, limits: Limits) -> DraftWithDists:
    rnd, base, tokens, committed, flags = _dec_draft_head(r, limits)
    if flags & _AHEAD:
        raise WireError("the ahead flag is set, but only a Draft carries it")
    fork = None
    if flags & _FORK:
        fork = (r.varint("fork round", U63), _get_ids(r, 1, "fork token", limits)[0])
    probs = _get_probs(r, len(tokens)) if flags & _PROBS else ()
    width = r.varint("width", min(limits.max_width, limits.id_bound))
    n = r.count("dist count", min(limits.max_dists, len(tokens)), _MIN_DIST_BYTES)
    positions = tuple(_get_increasing(r, n, "dist_positions", len(tokens)).tolist())
    dists = tuple(_get_dist_body(r, width, f"dists[{k}]") for k in range(n))
    return DraftWithDists(rnd, base, committed, tokens, probs, width, positions, dists, fork)


def _enc_hidden(w: Writer, m: HiddenStates) -> None:
    w.varint(m.round)
    w.varint(m.data.ndim)
    _put_ids(w, m.data.shape)
    w.raw(np.ascontiguousarray(m.data, dtype="<f2").tobytes())


def _dec_hidden(r: Reader, limits: Limits) -> HiddenStates:
    rnd = r.varint("round", U63)
    ndim = r.varint("hidden states ndim", limits.max_ndim)
    shape = tuple(r.varint("hidden states dim", limits.max_hidden) for _ in range(ndim))
    size = int(np.prod(shape, dtype=object)) if shape else 1
    if size > limits.max_hidden:
        raise WireError(f"hidden states of {size} elements, limit {limits.max_hidden}")
    r.need(2 * size, "hidden states")
    data = np.frombuffer(r.data, dtype="<f2", count=size, offset=r.pos).reshape(shape)
    r.pos += 2 * size
    return HiddenStates(rnd, data)


# ----------------------------------------------------------------------------- downlink messages
_TOKEN, _DIST, _THETA, _OTOKEN, _CANDS, _PIECES, _TRUNC, _FINISHED = (1 << k for k in range(8))


def _put_candidates(w: Writer, cands: Sequence[tuple[int, float]]) -> None:
    w.varint(len(cands))
    _put_ids(w, [c for c, _ in cands])
    w.raw(struct.pack(f"<{len(cands)}d", *(q for _, q in cands)))


def _get_candidates(r: Reader, limits: Limits) -> tuple[tuple[int, float], ...]:
    n = r.count("candidate count", limits.max_candidates, 9)
    ids = _get_ids(r, n, "candidate ids", limits)
    probs = struct.unpack(f"<{n}d", r.raw(8 * n, "candidate probabilities"))
    return tuple(zip(ids, probs, strict=True))


def _put_pieces(w: Writer, pieces: Sequence[tuple[int, str]]) -> None:
    _put_increasing(w, [tid for tid, _ in pieces])
    for _, piece in pieces:
        w.string(piece)


def _get_pieces(r: Reader, n: int, limits: Limits) -> tuple[tuple[int, str], ...]:
    ids = _get_increasing(r, n, "piece ids", limits.id_bound).tolist()
    return tuple((tid, r.string("piece", limits.max_string)) for tid in ids)


def _enc_verify(w: Writer, m: VerifyResult) -> None:
    present = [m.token, m.dist, m.theta_o, m.o_token, m.candidates, m.pieces or None]
    flags = sum(1 << k for k, v in enumerate(present) if v is not None)
    flags |= (_TRUNC if m.truncated else 0) | (_FINISHED if m.finished else 0)
    w.varint(m.round)
    w.varint(m.accepted)
    w.buf.append(flags)
    if m.token is not None:
        w.varint(m.token)
    if m.dist is not None:
        _put_dist(w, m.dist)
    if m.theta_o is not None:
        w.varint(m.theta_o)
    if m.o_token is not None:
        w.varint(m.o_token)
    if m.candidates is not None:
        _put_candidates(w, m.candidates)
    if m.pieces:
        w.varint(len(m.pieces) - 1)
        _put_pieces(w, m.pieces)


def _dec_verify(r: Reader, limits: Limits) -> VerifyResult:
    rnd = r.varint("round", U63)
    accepted = r.varint("accepted", limits.max_tokens)
    flags = r.byte("flags")
    bound = limits.id_bound - 1
    token = r.varint("token", bound) if flags & _TOKEN else None
    dist = _get_dist(r, limits, "dist") if flags & _DIST else None
    theta_o = r.varint("theta_o", dist_scale(max(DIST_BITS))) if flags & _THETA else None
    o_token = r.varint("o_token", bound) if flags & _OTOKEN else None
    cands = _get_candidates(r, limits) if flags & _CANDS else None
    pieces: tuple[tuple[int, str], ...] = ()
    if flags & _PIECES:
        n = r.count("piece count", limits.max_candidates + 1, 2) + 1
        pieces = _get_pieces(r, n, limits)
    return VerifyResult(
        rnd, accepted, token, dist, theta_o, o_token, cands, pieces,
        truncated=bool(flags & _TRUNC), finished=bool(flags & _FINISHED),
    )  # fmt: skip


def _enc_candidates(w: Writer, m: Candidates) -> None:
    w.varint(m.round)
    _put_candidates(w, m.candidates)
    w.varint(len(m.pieces))
    _put_pieces(w, m.pieces)


def _dec_candidates(r: Reader, limits: Limits) -> Candidates:
    rnd = r.varint("round", U63)
    cands = _get_candidates(r, limits)
    n = r.count("piece count", len(cands), 2)
    return Candidates(rnd, cands, _get_pieces(r, n, limits))


def _enc_cand_request(w: Writer, m: CandidatesRequest) -> None:
    w.varint(m.round)
    w.varint(m.k)


def _dec_cand_request(r: Reader, limits: Limits) -> CandidatesRequest:
    return CandidatesRequest(r.varint("round", U63), r.varint("k", limits.max_candidates))


def _enc_first_cands(w: Writer, m: FirstCandidates) -> None:
    w.varint(m.k)


def _dec_first_cands(r: Reader, limits: Limits) -> FirstCandidates:
    return FirstCandidates(r.varint("k", limits.max_candidates))


def _enc_resample(w: Writer, m: ResampleRequest) -> None:
    w.varint(m.round)
    w.varint(int(m.kind))


def _dec_resample(r: Reader, limits: Limits) -> ResampleRequest:
    rnd = r.varint("round", U63)
    return ResampleRequest(rnd, r.varint("resample kind", max(ResampleKind)))


def _enc_otoken(w: Writer, m: OToken) -> None:
    w.varint(m.round)
    w.varint(m.token)
    w.string(m.piece)


def _dec_otoken(r: Reader, limits: Limits) -> OToken:
    rnd = r.varint("round", U63)
    token = r.varint("token", limits.id_bound - 1)
    return OToken(rnd, token, r.string("piece", limits.max_string))


def _enc_tokens(w: Writer, m: Tokens) -> None:
    w.varint(len(m.ids) << 1 | int(m.finished))
    _put_ids(w, m.ids)


def _dec_tokens(r: Reader, limits: Limits) -> Tokens:
    head = r.varint("token count", limits.max_tokens << 1 | 1)
    r.need(head >> 1, "ids")
    return Tokens(_get_ids(r, head >> 1, "ids", limits), finished=bool(head & 1))


# ----------------------------------------------------------------------------- frames
Encoder = Callable[[Writer, Any], None]
Decoder = Callable[[Reader, Limits], Any]

_TYPES: dict[int, tuple[type, Encoder, Decoder]] = {
    1: (Hello, _enc_hello, _dec_hello),
    2: (HelloAck, _enc_hello_ack, _dec_hello_ack),
    3: (Error, _enc_error, _dec_error),
    4: (Close, _enc_close, _dec_close),
    5: (StartRequest, _enc_start, _dec_start),
    6: (Auth, _enc_auth, _dec_auth),
    7: (Resume, _enc_resume, _dec_resume),
    8: (Resumed, _enc_resumed, _dec_resumed),
    16: (Draft, _enc_draft, _dec_draft),
    17: (DraftWithDists, _enc_draft_dists, _dec_draft_dists),
    18: (HiddenStates, _enc_hidden, _dec_hidden),
    19: (FirstCandidates, _enc_first_cands, _dec_first_cands),
    32: (VerifyResult, _enc_verify, _dec_verify),
    33: (CandidatesRequest, _enc_cand_request, _dec_cand_request),
    34: (Candidates, _enc_candidates, _dec_candidates),
    35: (ResampleRequest, _enc_resample, _dec_resample),
    36: (OToken, _enc_otoken, _dec_otoken),
    37: (Tokens, _enc_tokens, _dec_tokens),
}
_CODES: dict[type, int] = {cls: code for code, (cls, _, _) in _TYPES.items()}


def encode(msg: Message, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """One complete frame for `msg`; raises WireError if the peer could not decode it."""
    validate(msg, limits)
    _, enc, _ = _TYPES[_CODES[type(msg)]]
    w = Writer()
    enc(w, msg)
    head = Writer()
    head.buf += bytes((_MAGIC | WIRE_VERSION, _CODES[type(msg)]))
    head.varint(len(w.buf))
    frame = bytes(head.buf + w.buf)
    if len(frame) > limits.max_frame:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the limit {limits.max_frame}")
    return frame


def bits(msg: Message, limits: Limits = DEFAULT_LIMITS) -> int:
    """Exact size of `msg` on the wire, in bits (8 × the encoded frame length)."""
    return 8 * len(encode(msg, limits))


def parse_header(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[int, int, int] | None:
    """(type code, header length, payload length) of the frame `data` starts with.

    None while the header is incomplete; WireError as soon as the bytes seen are invalid.
    """
    if not data:
        return None
    if data[0] & 0xF0 != _MAGIC:
        raise WireError(f"bad magic byte 0x{data[0]:02x}: not a wanspec frame")
    if data[0] & 0x0F != WIRE_VERSION:
        version = data[0] & 0x0F
        raise WireError(f"unsupported wire version {version} (this build speaks {WIRE_VERSION})")
    if len(data) < 2:
        return None
    if data[1] not in _TYPES:
        raise WireError(f"unknown message type {data[1]}")
    longest = 2 + varint_size(limits.max_frame)
    end = min(len(data), longest)
    if all(b & 0x80 for b in data[2:end]):
        if end < longest:
            return None  # the length varint continues past the bytes received so far
        raise FrameTooLarge(f"frame length over {longest - 2} bytes: exceeds {limits.max_frame}")
    r = Reader(bytes(data[2:end]))
    length = r.varint("payload length")
    if 2 + r.pos + length > limits.max_frame:
        raise FrameTooLarge(
            f"frame of {2 + r.pos + length} bytes exceeds the limit {limits.max_frame}"
        )
    return data[1], 2 + r.pos, length


def _decode(frame: bytes, limits: Limits) -> Message:
    head = parse_header(frame, limits)
    if head is None:
        raise WireError("truncated frame header")
    code, start, length = head
    if start + length != len(frame):
        gap = len(frame) - start - length
        kind = "trailing" if gap > 0 else "missing"
        raise WireError(f"frame length mismatch: {abs(gap)} bytes {kind}")
    cls, _, dec = _TYPES[code]
    r = Reader(frame, start)
    msg = dec(r, limits)
    r.finish(cls.__name__)
    validate(msg, limits)
    return msg


def decode(frame: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Message:
    """The message in one complete frame; any malformed input raises WireError only."""
    try:
        return _decode(bytes(frame), limits)
    except WireError:
        raise
    except Exception as exc:  # a safety net: the parsers above are meant never to get here
        raise WireError(f"malformed frame (internal {type(exc).__name__}: {exc})") from exc


class FrameDecoder:
    """Splits a byte stream into frames and messages (sans-IO, h11 style): `feed` bytes, then
    take frames (`next_frame`) or messages (`next_message`, or iterate).

    Each frame's header is checked against `limits` as soon as it is in, so an oversized frame
    is refused before its payload is awaited. `limits` may change between frames (the next frame
    is checked against the new ones). After a WireError the stream is unusable (frame boundaries
    are lost) and every later call raises the same error.
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._buf = bytearray()
        self._error: WireError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame or message."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next complete frame's raw bytes, its header checked but its payload not decoded
        (for relays that forward frames), or None until more bytes arrive."""
        if self._error is not None:
            raise self._error
        try:
            head = self._header()
        except WireError as exc:
            self._error = exc
            raise
        if head is None or len(self._buf) < head[1] + head[2]:
            return None
        size = head[1] + head[2]
        frame = bytes(self._buf[:size])
        del self._buf[:size]
        return frame

    def _header(self) -> tuple[int, int, int] | None:
        longest = 2 + varint_size(self.limits.max_frame)
        return parse_header(bytes(self._buf[:longest]), self.limits)

    def next_message(self) -> Message | None:
        """The next complete message, or None until more bytes arrive."""
        frame = self.next_frame()
        if frame is None:
            return None
        try:
            return decode(frame, self.limits)
        except WireError as exc:
            self._error = exc
            raise

    def __iter__(self) -> Iterator[Message]:
        while (msg := self.next_message()) is not None:
            yield msg

    def take_buffered(self) -> bytes:
        """The bytes fed but not yet returned (the start of the frames to come), handed over and
        forgotten: a relay that read a stream's first frames passes on the rest unread."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def end_of_stream(self) -> None:
        """Call when the peer closed: raises WireError if a partial frame is left over."""
        if not self._buf:
            return
        if self._error is not None:
            raise self._error
        pending, head = len(self._buf), self._header()
        if head is None:
            raise WireError(f"stream ended inside a frame header ({pending} bytes pending)")
        size = head[1] + head[2]
        raise WireError(f"stream ended inside a frame ({pending} bytes pending of its {size})")
