"""wanspec.wire: round trips, exact bit counts, sizes, limits, fuzzing and stream framing."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wanspec.sampling import quantize
from wanspec.wire import (
    DEFAULT_LIMITS,
    PROB_SCALE,
    WIRE_VERSION,
    Auth,
    Candidates,
    CandidatesRequest,
    Close,
    Dist,
    Draft,
    DraftWithDists,
    Error,
    FirstCandidates,
    FrameDecoder,
    FrameTooLarge,
    Hello,
    HelloAck,
    HiddenStates,
    Limits,
    OToken,
    ResampleKind,
    ResampleRequest,
    Resume,
    Resumed,
    StartRequest,
    Tokens,
    VerifyResult,
    WireError,
    bits,
    decode,
    dense_size,
    encode,
    parse_header,
    sparse_size,
    validate,
)

V = 151_936  # a real target width (Qwen2.5)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def vlen(value: int) -> int:
    """Bytes of an unsigned LEB128 varint, computed the slow way (independent of the codec)."""
    n = 1
    while value >= 128:
        value >>= 7
        n += 1
    return n


def frame(type_code: int, payload: bytes) -> bytes:
    """A frame with a correct header around an arbitrary payload."""
    length = bytearray()
    n = len(payload)
    while n >= 128:
        length.append(n & 0x7F | 0x80)
        n >>= 7
    length.append(n)
    return bytes([0xA0 | WIRE_VERSION, type_code]) + bytes(length) + payload


def header_size(payload_len: int) -> int:
    return 2 + vlen(payload_len)


def complete_dense(width: int, rng: np.random.Generator) -> np.ndarray:
    """A count array over `width` (≤ 65535) ids summing to PROB_SCALE, every id non-zero."""
    return 1 + rng.multinomial(PROB_SCALE - width, np.full(width, 1 / width))


# ----------------------------------------------------------------------------- strategies
TOKEN_ID = st.integers(0, V - 1)
COUNT = st.integers(0, PROB_SCALE)
TEXT = st.text(max_size=12)
PIECE = st.text(min_size=1, max_size=8)
JSON_LEAF = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)  # fmt: skip
JSON = st.recursive(
    JSON_LEAF,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3),
    max_leaves=8,
)
SETTINGS = st.dictionaries(TEXT, JSON, max_size=4)


@st.composite
def dists(draw: st.DrawFn, complete: bool, width: int | None = None) -> Dist:
    """A quantised distribution of 16, 24 or 32 bits: complete (sums to 2^bits − 1) or a part."""
    if width is None:
        width = draw(st.sampled_from([1, 2, 5, 17, 64, 300, V]))
    bits = draw(st.sampled_from([16, 24, 32]))
    scale = (1 << bits) - 1
    k = draw(st.integers(1, min(width, 40)))
    ids = sorted(draw(st.sets(st.integers(0, width - 1), min_size=k, max_size=k)))
    cuts = sorted(draw(st.sets(st.integers(1, scale - 1), min_size=k - 1, max_size=k - 1)))
    counts = np.diff([0, *cuts, scale])
    dist = Dist(width, ids, counts, bits)
    if complete:
        return dist
    keep = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    return Dist(width, dist.ids[keep], dist.counts[keep], bits)


PROBABILITY = st.floats(min_value=0.0, max_value=1.0, exclude_min=True)


@st.composite
def candidate_lists(draw: st.DrawFn) -> tuple[tuple[int, float], ...]:
    ids = draw(st.lists(TOKEN_ID, max_size=6))
    q = {tid: draw(PROBABILITY) for tid in ids}
    return tuple((tid, q[tid]) for tid in ids)


@st.composite
def pieces_for(draw: st.DrawFn, named: set[int], required: set[int]) -> tuple[tuple[int, str], ...]:
    chosen = required | {tid for tid in sorted(named) if draw(st.booleans())}
    return tuple((tid, draw(PIECE)) for tid in sorted(chosen))


@st.composite
def verify_results(draw: st.DrawFn) -> VerifyResult:
    token = draw(st.none() | TOKEN_ID)
    o_token = draw(st.none() | TOKEN_ID)
    dist, theta_o, truncated = None, draw(st.none() | COUNT), False
    if draw(st.booleans()):  # a dist: complete, HR-split (C part + theta_o) or truncated
        full = draw(dists(complete=True))
        mode = draw(st.sampled_from(["complete", "hr", "truncated"]))
        n = len(full.ids)
        keep = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        part = Dist(full.width, full.ids[keep], full.counts[keep], full.bits)
        if mode == "complete":
            dist, theta_o = full, None
        elif mode == "hr":
            dist, theta_o = part, full.scale - part.total
        else:
            dist, truncated = part, True
            theta_o = draw(st.none() | st.integers(0, full.scale - dist.total))
    cands = draw(st.none() | candidate_lists())
    named = {t for t in (token, o_token) if t is not None} | {c for c, _ in cands or ()}
    pieces = draw(pieces_for(named, {o_token} if o_token is not None else set()))
    return VerifyResult(
        draw(st.integers(0, 2**40)), draw(st.integers(0, 64)), token, dist, theta_o, o_token,
        cands, pieces, truncated=truncated, finished=draw(st.booleans()),
    )  # fmt: skip


@st.composite
def drafts(draw: st.DrawFn) -> Draft:
    tokens = draw(st.lists(TOKEN_ID, max_size=12))
    n = len(tokens)
    probs = draw(st.lists(COUNT, min_size=n, max_size=n)) if draw(st.booleans()) else []
    committed = draw(st.lists(TOKEN_ID, max_size=3))
    base = draw(st.integers(0, 2**40))
    srdv, ahead = draw(st.booleans()), draw(st.booleans())
    return Draft(draw(st.integers(0, 2**63 - 1)), base, committed, tokens, probs, srdv, ahead)


@st.composite
def drafts_with_dists(draw: st.DrawFn) -> DraftWithDists:
    tokens = draw(st.lists(TOKEN_ID, min_size=1, max_size=5))
    width = draw(st.sampled_from([3, 40, 1000]))
    positions = sorted(draw(st.sets(st.integers(0, len(tokens) - 1))))
    ds = tuple(draw(dists(complete=True, width=width)) for _ in positions)
    probs = draw(st.lists(COUNT, min_size=len(tokens), max_size=len(tokens)) | st.just([]))
    committed = draw(st.lists(TOKEN_ID, max_size=2))
    rnd, base = draw(st.integers(0, 999)), draw(st.integers(0, 999))
    fork = draw(st.none() | st.tuples(st.integers(0, 2**63 - 1), TOKEN_ID))
    return DraftWithDists(rnd, base, committed, tokens, probs, width, positions, ds, fork)


@st.composite
def hidden_states(draw: st.DrawFn) -> HiddenStates:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=4)))
    size = int(np.prod(shape))
    values = draw(st.lists(st.floats(-65504, 65504, width=16), min_size=size, max_size=size))
    return HiddenStates(draw(st.integers(0, 99)), np.array(values, np.float16).reshape(shape))


@st.composite
def candidates_msgs(draw: st.DrawFn) -> Candidates:
    cands = draw(candidate_lists())
    pieces = draw(pieces_for({c for c, _ in cands}, set()))
    return Candidates(draw(st.integers(0, 99)), cands, pieces)


MESSAGES = st.one_of(
    st.builds(Hello, st.integers(0, 9), TEXT, TEXT, TEXT, TEXT, TEXT),
    st.builds(HelloAck, st.integers(0, 9), TEXT, TEXT, SETTINGS),
    st.builds(Error, st.integers(-(2**62), 2**62 - 1), TEXT),
    st.builds(Close, TEXT),
    st.builds(StartRequest, st.integers(0, 2**40), st.text(max_size=200), SETTINGS),
    st.builds(Auth, TEXT),
    st.builds(
        Resume,
        st.text(min_size=1, max_size=40),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.lists(TOKEN_ID, max_size=20),
    ),
    st.builds(Resumed, st.integers(0, 2**40)),
    drafts(),
    drafts_with_dists(),
    hidden_states(),
    st.builds(FirstCandidates, st.integers(1, 64)),
    verify_results(),
    st.builds(CandidatesRequest, st.integers(0, 99), st.integers(1, 64)),
    candidates_msgs(),
    st.builds(ResampleRequest, st.integers(0, 99), st.sampled_from(ResampleKind)),
    st.builds(OToken, st.integers(0, 99), TOKEN_ID, PIECE),
    st.builds(Tokens, st.lists(TOKEN_ID, max_size=20), st.booleans()),
)


# ----------------------------------------------------------------------------- round trips
EXAMPLES = [
    Hello(2, "edge", "xcosd", "0123abcd", "4567ef01", "89abcdef"),
    Hello(2, "edge", "ar", "", "4567ef01", ""),
    HelloAck(2, "0123abcd", "4567ef01", {"eos_token_ids": [V - 1]}),
    Error(-3, "model fingerprint mismatch"),
    Close("done"),
    StartRequest(7, "Translate to French: the cat", {"max_new_tokens": 32, "temperature": 0.7}),
    Auth("bearer token: ünïcode ok"),
    Resume("9f3a0c5e", 12, 40, (5, 17, 151_935)),
    Resume("9f3a0c5e"),
    Resumed(12),
    Draft(0, 0, (), (17, 300, 20000, 151_935), (65535, 1200, 3, 40000)),
    Draft(5, 33, (9,), (1, 2, 3), ()),
    Draft(7, 2**40, (4, 5), (), ()),
    Draft(8, 3, (), (17, 300), (65535, 9), srdv=True),
    Draft(9, 5, (), (17, 300), (65535, 9), ahead=True),
    Draft(10, 5, (), (17,), (), srdv=True, ahead=True),
    DraftWithDists(1, 7, (), (1, 2), (30000, 65535), 4, (0, 1), (
        Dist.from_dense(np.array([30000, 35535, 0, 0])), Dist(4, [2], [65535]))),
    HiddenStates(3, np.arange(12, dtype=np.float32).reshape(3, 4) / 7),
    FirstCandidates(8),
    VerifyResult(0, 4, token=1234),
    VerifyResult(1, 2, dist=Dist(V, [5, 77, 100_000], [100, 200, 65235])),
    VerifyResult(2, 0, dist=Dist(V, [5], [60000]), theta_o=5535, o_token=150_000,
                 pieces=((150_000, "Ġhello"),)),
    VerifyResult(2, 0, dist=Dist(V, [5, 9], [2**32 - 3, 1], 32), theta_o=1),
    VerifyResult(1, 2, dist=Dist(V, [5, 77], [1, 2**24 - 2], 24)),
    VerifyResult(3, 1, candidates=((9, 0.25), (150_001, 5e-324), (9, 0.25)),
                 pieces=((150_001, "▁wörld"),)),
    VerifyResult(4, 3, dist=Dist(V, [1, 2], [40000, 20000]), truncated=True, finished=True),
    CandidatesRequest(3, 8),
    Candidates(3, ((4, 1.0), (8, 0.1 + 0.2)), ((8, "Ġx"),)),
    ResampleRequest(2, ResampleKind.O_SAMPLE),
    ResampleRequest(2, ResampleKind.HR_DIST),
    OToken(2, 150_000, "Ġhello"),
    Tokens((1, 2, 151_000)),
    Tokens((), finished=True),
]  # fmt: skip


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_examples_round_trip_with_exact_bits(msg: object) -> None:
    data = encode(msg)
    back = decode(data)
    assert type(back) is type(msg)
    assert back == msg
    assert bits(msg) == 8 * len(data)
    assert encode(back) == data


def test_every_message_type_has_an_example() -> None:
    from wanspec.wire.codec import _CODES

    assert {type(m) for m in EXAMPLES} == set(_CODES)


@ROUND_TRIP
@given(MESSAGES)
def test_generated_messages_round_trip(msg: object) -> None:
    data = encode(msg)
    assert decode(data) == msg
    assert bits(msg) == 8 * len(data)


# ----------------------------------------------------------------------------- sizes
@given(st.lists(TOKEN_ID, min_size=1, max_size=15), st.integers(0, 10_000))
@settings(max_examples=60, deadline=None)
def test_draft_cost_formula(tokens: list[int], rnd: int) -> None:
    msg = Draft(rnd, rnd // 3, (), tokens, [1] * len(tokens))
    ids = sum(vlen(t) for t in tokens)
    payload = vlen(rnd) + vlen(rnd // 3) + vlen(len(tokens) << 4 | 1) + ids + 2 * len(tokens)
    assert bits(msg) == 8 * (header_size(payload) + payload)


def test_draft_of_four_tokens_is_a_few_bytes() -> None:
    msg = Draft(12, 40, (), (151_000, 42, 9000, 100_000), (65535, 1, 300, 20000))
    # header 3 + round 1 + base 1 + count|flags 1 + ids 3+1+2+3 + probs 8
    assert len(encode(msg)) == 23


@pytest.mark.parametrize("n", [1, 4, 7, 8, 64])
@pytest.mark.parametrize(("flag", "bit"), [("srdv", 4), ("ahead", 8)])
def test_the_draft_only_flags_ride_under_the_token_count(n: int, flag: str, bit: int) -> None:
    """A flag costs no byte: a Draft with it is as long as one without, and the four flag bits
    under the count make the count's varint one byte longer from 8 tokens on."""
    tokens, probs = tuple(range(n)), (7,) * n
    plain = encode(Draft(3, 2, (), tokens, probs))
    flagged = encode(Draft(3, 2, (), tokens, probs, **{flag: True}))
    payload = 1 + 1 + vlen(n << 4) + n + 2 * n  # round, base, count|flags, ids, probs
    assert len(flagged) == len(plain) == header_size(payload) + payload
    assert vlen(n << 4) == (1 if n < 8 else 2)
    assert getattr(decode(flagged), flag) is True and getattr(decode(plain), flag) is False
    _, start, _ = parse_header(flagged)
    assert flagged[start + 2] & 0x7F == (n << 4 | 1 | bit) & 0x7F  # probs | flag under the count


def _one_dist_draft(**flags: object) -> DraftWithDists:
    return DraftWithDists(1, 0, (), (2,), (), 4, (0,), (Dist(4, [2], [PROB_SCALE]),), **flags)


@pytest.mark.parametrize("fork", [(300, 3), (0, 0), None])
def test_a_draft_with_dists_carries_a_fork_on_the_srdv_bit(fork: tuple | None) -> None:
    """A fork costs its round's and token's varints, and rides on the bit that means srdv on a
    Draft."""
    plain, forked = encode(_one_dist_draft()), encode(_one_dist_draft(fork=fork))
    extra = 0 if fork is None else vlen(fork[0]) + vlen(fork[1])
    assert len(forked) == len(plain) + extra
    assert decode(forked).fork == fork
    _, start, _ = parse_header(forked)
    assert forked[start + 2] == 1 << 4 | (0 if fork is None else 4)


def test_a_draft_with_dists_carrying_the_ahead_flag_is_refused() -> None:
    """Only a Draft says it was sent ahead (a DraftWithDists names its round in a fork): the
    bit on a DraftWithDists is a malformed frame, refused by name before any id is read."""
    data = bytearray(encode(_one_dist_draft()))
    _, start, _ = parse_header(bytes(data))
    data[start + 2] |= 8
    with pytest.raises(WireError, match=r"^the ahead flag is set, but only a Draft carries it$"):
        decode(bytes(data))
    with pytest.raises(TypeError):
        _one_dist_draft(ahead=True)
    with pytest.raises(WireError, match="fork is"):
        _one_dist_draft(fork=(1, 2, 3))


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value >= 0x80 else 0))
        value >>= 7
        if not value:
            return bytes(out)


@pytest.mark.parametrize(
    ("fork_round", "fork_token", "refusal"),
    [(2**63, 3, "fork round"), (5, 2**40, "fork token"), (2**63 - 1, 3, None)],
)
def test_a_forks_round_and_token_are_bounded_when_decoded(
    fork_round: int, fork_token: int, refusal: str | None
) -> None:
    """A fork's round fits an int64 and its token the id bound, as every round and id does."""
    plain = encode(_one_dist_draft(fork=(0, 0)))
    _, start, _ = parse_header(plain)
    payload = bytearray(plain[start:])
    assert payload[:5] == bytes((1, 0, 1 << 4 | 4, 2, 0)) and payload[5] == 0  # …, fork (0, 0)
    body = bytes(payload[:4]) + _leb128(fork_round) + _leb128(fork_token) + bytes(payload[6:])
    data = frame(plain[1], body)
    if refusal is None:
        assert decode(data).fork == (fork_round, fork_token)
    else:
        with pytest.raises(WireError, match=rf"for {refusal} .*\(limit "):
            decode(data)


def test_verify_result_with_bonus_is_small() -> None:
    assert len(encode(VerifyResult(12, 4, token=100_000))) == 3 + 1 + 1 + 1 + 3


@pytest.mark.parametrize("bits_", [16, 32])
def test_dense_dist_costs_one_varint_per_id_plus_overhead(bits_: int) -> None:
    width = 32_000  # a Llama-sized vocabulary with full support: dense is the smaller form
    counts = complete_dense(width, np.random.default_rng(0)) << (bits_ - 16)
    counts[0] += (1 << bits_) - 1 - counts.sum()
    msg = VerifyResult(0, 2, dist=Dist.from_dense(counts, bits_))
    payload = 1 + 1 + 1 + vlen(width) + 1 + 1 + sum(vlen(int(c)) for c in counts)
    assert bits(msg) == 8 * (header_size(payload) + payload)
    per_count = 1 if bits_ == 16 else 3  # counts ≈ 2 (16 bits) or ≈ 2^17 (32 bits)
    assert 0 < bits(msg) - 8 * per_count * width < 200  # the frame, flags, width, tags
    back = decode(encode(msg)).dist
    assert back.bits == bits_ and back.to_dense().tolist() == counts.tolist()


def test_sparse_dist_is_picked_when_smaller() -> None:
    ids = np.array([3, 1000, 50_000, 150_000])
    dist = Dist(V, ids, [10, 200, 30, 65295])
    gaps = np.diff(ids, prepend=-1) - 1
    body = vlen(len(ids) + 1) + sum(vlen(int(g)) for g in gaps) + 1 + 2 + 1 + 3
    assert sparse_size(dist) == body < dense_size(dist)
    msg = VerifyResult(0, 2, dist=dist)
    payload = 1 + 1 + 1 + vlen(V) + 1 + body
    assert len(encode(msg)) == header_size(payload) + payload


@pytest.mark.parametrize("nnz", [1, 5, 6, 7, 8, 9, 10])
def test_dense_and_sparse_both_round_trip_around_the_crossover(nnz: int) -> None:
    # width 10, ids 0..nnz-1, counts (65536 - nnz, 1, 1, ...): the counts cost 3 + (nnz - 1)
    # bytes either way; sparse adds 1 + nnz (tag, gaps 0), dense 1 + (10 - nnz) (tag, zeros)
    counts = np.zeros(10, dtype=np.int64)
    counts[:nnz] = 1
    counts[0] += PROB_SCALE - nnz
    dist = Dist.from_dense(counts)
    data = encode(VerifyResult(0, 0, dist=dist))
    assert decode(data).dist == dist
    is_sparse = 1 + nnz < 1 + 10 - nnz
    assert (data[8] != 0) == is_sparse  # the body's tag byte (after precision): 0 = dense
    body = 3 + (nnz - 1) + (1 + nnz if is_sparse else 1 + 10 - nnz)
    assert len(data) == 3 + 5 + body


def test_candidates_cost_formula() -> None:
    cands = ((5, 0.5), (200, 1e-9), (20_000, 1.0))
    msg = VerifyResult(1, 0, candidates=cands)
    payload = 1 + 1 + 1 + 1 + sum(vlen(c) for c, _ in cands) + 8 * len(cands)
    assert len(encode(msg)) == header_size(payload) + payload
    assert decode(encode(msg)).candidates == cands  # q(y) comes back bit for bit


def test_tokens_cost_one_frame_per_message() -> None:
    assert len(encode(Tokens((5,)))) == 3 + 1 + 1


# ----------------------------------------------------------------------------- validation on encode
BAD_MESSAGES = [
    Draft(0, 0, (), (V + 300_000,), ()),  # id over the default bound
    Draft(0, 0, (), (1, 2), (65536, 1)),  # count over uint16
    Draft(0, 0, (), (1, 2), (5,)),  # probs length mismatch
    Draft(-1, 0, (), (), ()),  # negative round
    Draft(0, -1, (), (1,), ()),  # negative base
    DraftWithDists(0, 0, (), (1,), (), 4, (0,), (Dist(4, [1], [65534]),)),  # not complete
    DraftWithDists(0, 0, (), (1,), (), 5, (0,), (Dist(4, [1], [65535]),)),  # width mismatch
    DraftWithDists(0, 0, (), (1,), (), 4, (0,), ()),  # dists missing
    VerifyResult(0, 0, dist=Dist(4, [2, 1], [1, 65534])),  # sparse ids not increasing
    VerifyResult(0, 0, dist=Dist(4, [1], [60000])),  # mass missing, not truncated
    VerifyResult(0, 0, dist=Dist(4, [1], [60000]), theta_o=6000),  # mass over 65535
    VerifyResult(0, 0, dist=Dist(4, [7], [65535])),  # id beyond width
    VerifyResult(0, 0, truncated=True),  # truncated without dist
    VerifyResult(0, 0, o_token=5),  # O-token without its piece
    VerifyResult(0, 0, token=5, pieces=((6, "x"),)),  # piece for an unnamed id
    VerifyResult(0, 0, token=5, pieces=((5, ""),)),  # empty piece
    VerifyResult(0, 0, candidates=((5, 0.1), (5, 0.2))),  # inconsistent candidate q
    VerifyResult(0, 0, candidates=((5, 0.0),)),  # a sampled candidate has q > 0
    VerifyResult(0, 0, candidates=((5, 1.5),)),  # a probability
    VerifyResult(0, 0, candidates=((5, float("nan")),)),
    VerifyResult(0, 0, dist=Dist(4, [1], [65535], 20)),  # not a precision
    VerifyResult(0, 0, dist=Dist(4, [1], [2**24 - 1], 16)),  # a count over its scale
    VerifyResult(0, 0, dist=Dist(4, [1], [2**24 - 2], 24), theta_o=2),  # mass over 2^24 - 1
    VerifyResult(0, 5000),  # accepted over max_tokens
    CandidatesRequest(0, 0),
    FirstCandidates(0),
    FirstCandidates(1025),  # k over max_candidates
    HiddenStates(0, np.array([1.0, np.nan])),
    HiddenStates(0, np.zeros((0, 10**7))),  # a dim over the element limit
    HelloAck(1, "a", "b", {"gamma": (1, 2)}),  # tuple does not survive JSON
    HelloAck(1, "a", "b", {"x": float("nan")}),
    Hello(1, "edge", "m", "a", "b", "bad \ud800 surrogate"),
    StartRequest(1, "bad \ud800 surrogate", {}),
    Tokens(tuple(range(2000))),  # over max_tokens
]


@pytest.mark.parametrize("msg", BAD_MESSAGES)
def test_encode_rejects_what_could_not_be_decoded(msg: object) -> None:
    with pytest.raises(WireError):
        encode(msg)


def test_encode_rejects_non_messages_and_oversized_frames() -> None:
    with pytest.raises(WireError, match="not a wire message"):
        encode("hello")  # type: ignore[arg-type]
    big = Tokens(tuple(range(500)))
    with pytest.raises(FrameTooLarge, match="exceeds"):
        encode(big, Limits(max_frame=100))


def test_constructor_rejects_non_integers() -> None:
    with pytest.raises(WireError):
        Draft(0, 0, (), (1.5,), ())
    with pytest.raises(WireError):
        Dist.from_dense(np.array([0.5, 0.5]))
    with pytest.raises(WireError):
        ResampleRequest(0, 9)


def test_dist_drops_zero_counts_and_round_trips_dense() -> None:
    counts = np.array([0, 5, 0, 65530])
    dist = Dist.from_dense(counts)
    assert dist.ids.tolist() == [1, 3]
    assert dist == Dist(4, [0, 1, 3], [0, 5, 65530])
    assert dist.to_dense().tolist() == counts.tolist()
    assert dist.total == PROB_SCALE


@pytest.mark.parametrize("weights", [[0.0, 1.0, 0.0], [1.0, 2.0, 0.0, 4.0], np.arange(300.0)])
def test_quantized_distributions_travel_as_complete_dists(weights: list[float]) -> None:
    """sampling's quantize output is exactly what the wire calls complete and sends count for
    count; a scale mismatch (65536 total, or a 65536 count that wraps in uint16) fails here."""
    counts = quantize(np.asarray(weights))
    msg = VerifyResult(0, 1, dist=Dist.from_dense(counts))
    assert decode(encode(msg)).dist.to_dense().tolist() == counts.tolist()
    one_short = counts.copy()
    one_short[np.argmax(one_short)] -= 1
    with pytest.raises(WireError, match=f"must be {PROB_SCALE}"):
        encode(VerifyResult(0, 1, dist=Dist.from_dense(one_short)))


# ----------------------------------------------------------------------------- decode-side checks
def test_vocab_limit_is_checked_on_decode() -> None:
    data = encode(Draft(0, 0, (), (5, 40_000), ()))
    assert decode(data, DEFAULT_LIMITS.with_vocab(50_000)).tokens == (5, 40_000)
    with pytest.raises(WireError, match=r"exceeds the limit 31999|outside"):
        decode(data, DEFAULT_LIMITS.with_vocab(32_000))


def test_unknown_version_and_bad_magic_are_clear_errors() -> None:
    data = bytearray(encode(Close("x")))
    data[0] = 0xA0 | (WIRE_VERSION + 1)
    with pytest.raises(WireError, match=f"unsupported wire version {WIRE_VERSION + 1}"):
        decode(bytes(data))
    data[0] = 0x17
    with pytest.raises(WireError, match="magic"):
        decode(bytes(data))


def test_trailing_and_missing_bytes_are_rejected() -> None:
    data = encode(Tokens((1, 2)))
    with pytest.raises(WireError, match="trailing"):
        decode(data + b"\x00")
    with pytest.raises(WireError, match="missing"):
        decode(data[:-1])
    # a payload with an extra byte inside a correctly sized frame
    with pytest.raises(WireError, match="trailing"):
        decode(frame(data[1], data[3:] + b"\x00"))


def test_non_canonical_encodings_are_rejected() -> None:
    good = encode(CandidatesRequest(3, 8))
    assert decode(frame(33, b"\x03\x08")) == CandidatesRequest(3, 8) and good[3:] == b"\x03\x08"
    with pytest.raises(WireError, match="non-minimal"):
        decode(frame(33, b"\x83\x00\x08"))
    good = encode(FirstCandidates(8))
    assert decode(frame(19, b"\x08")) == FirstCandidates(8) and good[3:] == b"\x08"
    with pytest.raises(WireError, match="non-minimal"):
        decode(frame(19, b"\x88\x00"))
    one_hot = Dist(V, [7], [PROB_SCALE])  # sparse is smaller; a dense body is non-canonical
    dense_body = bytes([16, 0]) + bytes(7) + b"\xff\xff\x03" + bytes(V - 8)
    width = encode(VerifyResult(0, 0, dist=one_hot))[6:9]
    with pytest.raises(WireError, match="canonical"):
        decode(frame(32, b"\x00\x00\x02" + width + dense_body))
    with pytest.raises(WireError, match="precision of 20 bits"):
        decode(frame(32, b"\x00\x00\x02" + width + bytes([20, 2, 7, 1])))


def test_huge_declared_lengths_fail_before_allocating() -> None:
    cases = [
        frame(37, bytes([0xFF, 0x0F])),  # Tokens declaring 1023 ids, none present
        frame(18, b"\x00\x02" + bytes([0x80, 0x80, 0x04]) * 2),  # hidden 65536 x 65536
        frame(18, b"\x00\x02" + bytes([0x80, 0x80, 0x01]) * 2),  # hidden 16384^2, no data
        frame(32, b"\x00\x00\x02\x80\x80\x10\x00"),  # dense dist of width 2^18, no data
        frame(32, b"\x00\x00\x02\x80\x80\x10\xff\xff\x03"),  # sparse dist of 65535 entries
        frame(1, b"\x01" + bytes([0x80, 0x80, 0x40])),  # a 1 MiB string, absent
    ]
    tracemalloc.start()
    try:
        for data in cases:
            with pytest.raises(WireError) as info:
                decode(data)
            assert "internal" not in str(info.value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_length_longer_than_any_allowed_is_too_large_before_it_ends() -> None:
    head = bytes([0xA0 | WIRE_VERSION, 37])
    assert parse_header(head + b"\x80\x80\x80") is None  # 3 bytes: may still end below 8 MiB
    with pytest.raises(FrameTooLarge, match="exceeds"):
        parse_header(head + b"\x80\x80\x80\x80")  # a 5th length byte means >= 2^28


def test_oversized_frame_header_is_rejected_at_once() -> None:
    dec = FrameDecoder()
    dec.feed(bytes([0xA0 | WIRE_VERSION, 37, 0x80, 0x80, 0x80, 0x40]))  # 2^27 > 8 MiB
    with pytest.raises(FrameTooLarge, match="exceeds"):
        dec.next_message()
    with pytest.raises(WireError):  # the stream stays failed
        dec.feed(encode(Close("x")))


# ----------------------------------------------------------------------------- fuzzing
def _check_decodes_or_wire_error(data: bytes) -> None:
    try:
        msg = decode(data)
    except WireError as exc:
        assert "internal" not in str(exc), exc
        return
    validate(msg)
    assert encode(msg) == data  # canonical: whatever decodes re-encodes to the same bytes


@FUZZ
@given(st.binary(max_size=64))
def test_random_bytes(data: bytes) -> None:
    _check_decodes_or_wire_error(data)


@FUZZ
@given(st.sampled_from([1, 2, 3, 4, 5, 16, 17, 18, 32, 33, 34, 35, 36, 37]), st.binary(max_size=48))
def test_random_payloads_behind_a_valid_header(type_code: int, payload: bytes) -> None:
    _check_decodes_or_wire_error(frame(type_code, payload))


MUTATIONS = ["flip", "truncate", "extend", "insert", "delete", "set"]


@FUZZ
@given(MESSAGES, st.sampled_from(MUTATIONS), st.data())
def test_mutated_frames(msg: object, mutation: str, data: st.DataObject) -> None:
    original = encode(msg)
    head = next(h for h in range(3, 8) if h == header_size(len(original) - h))
    payload = bytearray(original[head:])
    pos = data.draw(st.integers(0, max(len(payload) - 1, 0)))
    if mutation == "flip" and payload:
        payload[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif mutation == "truncate":
        del payload[pos:]
    elif mutation == "extend":
        payload += data.draw(st.binary(min_size=1, max_size=8))
    elif mutation == "insert":
        payload[pos:pos] = data.draw(st.binary(min_size=1, max_size=3))
    elif mutation == "delete" and payload:
        del payload[pos]
    elif mutation == "set" and payload:
        payload[pos] = data.draw(st.integers(0, 255))
    fixed_header = frame(original[1], bytes(payload))
    _check_decodes_or_wire_error(fixed_header)  # the payload parser sees the damage
    raw = original[:head] + bytes(payload)
    _check_decodes_or_wire_error(raw)  # the header may now disagree with the payload


# ----------------------------------------------------------------------------- stream decoding
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MESSAGES, min_size=1, max_size=5), st.data())
def test_frame_decoder_random_chunkings(msgs: list[object], data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in msgs)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(stream) - 1, 1)), max_size=8)))
    dec = FrameDecoder()
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        dec.feed(stream[a:b])
        out.extend(dec)
    assert out == msgs
    assert dec.buffered == 0
    dec.end_of_stream()


def test_frame_decoder_byte_by_byte() -> None:
    stream = b"".join(encode(m) for m in EXAMPLES)
    dec = FrameDecoder()
    out = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        msg = dec.next_message()
        if msg is not None:
            out.append(msg)
            assert dec.next_message() is None
    assert out == EXAMPLES


def test_frame_decoder_reports_a_truncated_stream() -> None:
    dec = FrameDecoder()
    dec.feed(encode(Tokens((1, 2, 3)))[:-1])
    assert dec.next_message() is None
    with pytest.raises(WireError, match="pending"):
        dec.end_of_stream()


def test_frame_decoder_fails_fast_on_a_bad_first_byte() -> None:
    dec = FrameDecoder()
    dec.feed(b"\x00")
    with pytest.raises(WireError, match="magic"):
        dec.next_message()


def test_next_frame_gives_each_frame_raw_and_keeps_what_follows() -> None:
    frames = [encode(m) for m in EXAMPLES]
    tail = encode(Tokens((1, 2, 3)))[:-2]
    dec = FrameDecoder()
    dec.feed(b"".join(frames) + tail)
    assert [dec.next_frame() for _ in frames] == frames
    assert dec.next_frame() is None
    assert dec.buffered == len(tail)


def test_next_frame_is_next_message_undecoded() -> None:
    stream = b"".join(encode(m) for m in EXAMPLES)
    raw, decoded = FrameDecoder(), FrameDecoder()
    for i in range(0, len(stream), 7):
        raw.feed(stream[i : i + 7])
        decoded.feed(stream[i : i + 7])
        while (frame := raw.next_frame()) is not None:
            assert decode(frame) == decoded.next_message()
        assert decoded.next_message() is None
    raw.end_of_stream()


def test_next_frame_checks_the_header_before_the_payload() -> None:
    dec = FrameDecoder(Limits(max_frame=4096))
    dec.feed(encode(Close("x"))[:2] + bytes([0x90, 0x4E]))  # announces 10 000 bytes
    with pytest.raises(FrameTooLarge, match="exceeds"):
        dec.next_frame()


def test_take_buffered_hands_over_exactly_the_bytes_not_yet_returned() -> None:
    first, second, third = (encode(m) for m in (Close("a"), Tokens((4, 5)), Close("b")))
    dec = FrameDecoder()
    dec.feed(first + second + third[:2])
    assert dec.next_frame() == first
    assert dec.take_buffered() == second + third[:2]
    assert (dec.buffered, dec.take_buffered(), dec.next_frame()) == (0, b"", None)
    dec.end_of_stream()  # nothing is left: the taker has the rest of the stream
    dec.feed(third)
    assert dec.next_message() == Close("b")


DONE = encode(Close("done"))  # a 3-byte header


CUTS = [(1, "inside a frame header"), (2, "inside a frame header"), (3, r"3 bytes pending of its")]


@pytest.mark.parametrize(("keep", "match"), CUTS)
def test_end_of_stream_says_where_the_stream_was_cut(keep: int, match: str) -> None:
    dec = FrameDecoder()
    dec.feed(DONE[:keep])
    assert dec.next_frame() is None
    with pytest.raises(WireError, match=match):
        dec.end_of_stream()
