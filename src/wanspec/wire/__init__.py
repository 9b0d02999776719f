"""The one binary codec for every wanspec message; it also counts the bits that travel.

    frame = encode(msg)            # bytes: header (magic|version, type, length) + payload
    msg = decode(frame, limits)    # WireError (a ValueError) on anything malformed
    bits(msg) == 8 * len(encode(msg))
    dec = FrameDecoder(); dec.feed(chunk); for msg in dec: ...   # dec.next_frame(): raw bytes

Messages are frozen dataclasses (see `wanspec.wire.messages`); `Limits` bounds what a decoder
accepts and `Limits.with_vocab(V)` adds the per-connection token-id bound.

Costs (v(x) = bytes of the LEB128 varint of x; a frame with an L-byte payload is 2 + v(L) + L):
- Draft, γ tokens, probs, nothing committed: L = v(round) + v(base) + v(16γ+1) + Σ v(x_i) + 2γ
  (v(16γ+5) with the srdv flag, v(16γ+9) with the ahead flag). A DraftWithDists with a fork
  (round r, token t) takes v(16γ+5) there and v(r) + v(t) more.
- VerifyResult: L = v(round) + v(accepted) + 1 (presence flags) + each present field:
  token v(id); dist v(W) + 1 (precision) + min(dense, sparse) with, over the n non-zero
  counts c_k, dense = 1 + (W − n) + Σ v(c_k) and sparse = v(n+1) + Σ v(id_k − id_{k−1} − 1) +
  Σ v(c_k) (id_0 = −1); theta_o v(θ); o_token v(id); candidates v(K) + Σ v(y_k) + 8K (q(y)
  as float64); pieces v(n−1) + Σ (v(gap) + v(len) + len).
- Tokens: L = v(2n + finished) + Σ v(id).
- FirstCandidates: L = v(k) (1 byte for k ≤ 127).
"""

from wanspec.wire.codec import (
    WIRE_VERSION,
    FrameDecoder,
    bits,
    decode,
    dense_size,
    encode,
    parse_header,
    sparse_size,
)
from wanspec.wire.errors import FrameTooLarge, WireError
from wanspec.wire.messages import (
    DEFAULT_LIMITS,
    PROB_SCALE,
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
)
from wanspec.wire.validate import validate

__all__ = [
    "DEFAULT_LIMITS",
    "PROB_SCALE",
    "WIRE_VERSION",
    "Auth",
    "Candidates",
    "CandidatesRequest",
    "Close",
    "Dist",
    "Draft",
    "DraftWithDists",
    "Error",
    "FirstCandidates",
    "FrameDecoder",
    "FrameTooLarge",
    "Hello",
    "HelloAck",
    "HiddenStates",
    "Limits",
    "Message",
    "OToken",
    "ResampleKind",
    "ResampleRequest",
    "Resume",
    "Resumed",
    "StartRequest",
    "Tokens",
    "VerifyResult",
    "WireError",
    "bits",
    "decode",
    "dense_size",
    "encode",
    "parse_header",
    "sparse_size",
    "validate",
]
