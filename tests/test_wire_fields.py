"""wanspec.wire field by field: the error that names the field at fault, and plain-int fields.

A peer that sends a bad frame must learn which field was bad, and a message built from numpy
values must hold plain Python ints (they are hashed, compared and JSON-dumped by the machines).
The round trips and fuzzing of test_wire.py cannot see either: a decoder that reads a field under
a garbled name, or a constructor that stores the normalised value under the wrong attribute,
decodes every valid frame the same. These tests pin both, for every message type.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from wanspec.wire import (
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
    codec,
    decode,
    encode,
    parse_header,
    sparse_size,
    validate,
)
from wanspec.wire.validate import settings_json

V = 151_936  # a real target width (Qwen2.5)

# One message of each type with every optional field present. Ids and counts are picked so that
# each field spans several bytes where the layout below needs a cut inside it.
FULL = {
    Hello: Hello(3, "edge", "xcosd", "m", "t", "d"),
    HelloAck: HelloAck(3, "m", "t", {"a": 1}),
    Error: Error(-5, "bad"),
    Close: Close("done"),
    StartRequest: StartRequest(7, "hi", {"t": 1}),
    Auth: Auth("tok"),
    Resume: Resume("s1", 2, 3, (300, 70_000)),
    Resumed: Resumed(4),
    Draft: Draft(1, 2, (3, 300), (4, 500), (100, 200), srdv=True, ahead=True),
    DraftWithDists: DraftWithDists(
        1, 2, (3, 300), (4, 500), (100, 200), 4, (0, 1),
        (Dist.from_dense(np.array([30_000, 35_535, 0, 0])), Dist(4, [2], [65_535])),
        fork=(5, 600),
    ),
    HiddenStates: HiddenStates(1, np.ones((2, 3), np.float16)),
    FirstCandidates: FirstCandidates(4),
    VerifyResult: VerifyResult(
        1, 2, token=3, dist=Dist(V, [70_000, 140_000], [1, 2]), theta_o=65_532,
        o_token=150_000, candidates=((9, 0.5), (300, 0.25)), pieces=((150_000, "x"),),
    ),
    CandidatesRequest: CandidatesRequest(1, 4),
    Candidates: Candidates(1, ((9, 0.5), (70_000, 0.25)), ((70_000, "ab"),)),
    ResampleRequest: ResampleRequest(1, ResampleKind.HR_DIST),
    OToken: OToken(1, 7, "x"),
    Tokens: Tokens((1, 300, 70_000), finished=True),
}  # fmt: skip

# The fields a truncated payload is found short in, in wire order: each decoder's layout. A
# field is missing from a list only where the decoder's count check (the least bytes each element
# takes) fails first on every cut inside it: the ids of SR-DV candidates, DraftWithDists'
# positions and its whole first distribution. LIMIT_CASES below pins those names.
LAYOUT = {
    Hello: ["protocol_version", "role length", "method length", "target_model length",
            "target_tokenizer length", "draft_tokenizer length"],
    HelloAck: ["protocol_version", "target_model length", "target_tokenizer length",
               "settings JSON length"],
    Error: ["error code", "error message length"],
    Close: ["close reason length"],
    StartRequest: ["request_id", "prompt length", "settings JSON length"],
    Auth: ["token length"],
    Resume: ["session length", "received", "committed", "prefix length", "prefix"],
    Resumed: ["received"],
    Draft: ["round", "base", "token count", "tokens", "committed count", "committed", "probs"],
    DraftWithDists: ["round", "base", "token count", "tokens", "committed count", "committed",
                     "fork round", "fork token", "probs", "width", "dist count",
                     "dists[1] precision", "dists[1] tag", "dists[1]", "dists[1] counts"],
    HiddenStates: ["round", "hidden states ndim", "hidden states dim", "hidden states"],
    FirstCandidates: ["k"],
    VerifyResult: ["round", "accepted", "flags", "token", "dist width", "dist precision",
                   "dist tag", "dist", "dist ids", "dist counts", "theta_o", "o_token",
                   "candidate count", "candidate probabilities", "piece count", "piece ids",
                   "piece length"],
    CandidatesRequest: ["round", "k"],
    Candidates: ["round", "candidate count", "candidate probabilities", "piece count",
                 "piece ids", "piece length"],
    ResampleRequest: ["round", "resample kind"],
    OToken: ["round", "token", "piece length"],
    Tokens: ["token count", "ids"],
}  # fmt: skip

_SHORT = re.compile(r"^truncated (?P<field>.+?): |^(?P<counted>.+?) = \d+ needs at least \d+ bytes")


def _frame(code: int, payload: bytes) -> bytes:
    """A well-formed frame header around `payload` (one length byte: payloads here are short)."""
    assert len(payload) < 128
    return bytes((0xA0 | WIRE_VERSION, code, len(payload))) + payload


def _short_field(error: WireError) -> str:
    match = _SHORT.match(str(error))
    assert match, f"not a truncation error: {error}"
    return match["field"] or match["counted"]


def _fields_found_short(msg: object) -> list[str]:
    """Cut the payload after 0, 1, 2… bytes; the fields the decoder reports, in order."""
    full = encode(msg)
    code, start, _ = parse_header(full)
    payload = full[start:]
    fields: list[str] = []
    for cut in range(len(payload)):
        with pytest.raises(WireError) as err:
            decode(_frame(code, payload[:cut]))
        field = _short_field(err.value)
        if not fields or fields[-1] != field:
            fields.append(field)
    return fields


def test_every_message_type_has_a_full_example_and_a_layout() -> None:
    from wanspec.wire.codec import _TYPES

    assert set(FULL) == set(LAYOUT) == {cls for cls, _, _ in _TYPES.values()}
    for cls, msg in FULL.items():
        assert type(msg) is cls and decode(encode(msg)) == msg


@pytest.mark.parametrize("cls", list(LAYOUT), ids=lambda c: c.__name__)
def test_a_truncated_payload_names_each_field_in_wire_order(cls: type) -> None:
    assert _fields_found_short(FULL[cls]) == LAYOUT[cls]


# Values a decoder refuses inside complete frames; each error names its field. The frames are
# encoded under wide limits and decoded under narrow ones (a small vocabulary, few candidates).
SMALL_VOCAB = Limits().with_vocab(100)
LIMIT_CASES = [
    (Resume("s", 0, 0, (5, 120)), SMALL_VOCAB, "prefix = 120 exceeds the limit 99"),
    (Draft(0, 0, (), (5, 120)), SMALL_VOCAB, "tokens = 120 exceeds the limit 99"),
    (Draft(0, 0, (120,), (5,)), SMALL_VOCAB, "committed = 120 exceeds the limit 99"),
    (Tokens((5, 120)), SMALL_VOCAB, "ids = 120 exceeds the limit 99"),
    (VerifyResult(0, 0, token=120), SMALL_VOCAB, "token = 120 exceeds the limit 99"),
    (VerifyResult(0, 0, candidates=((120, 1.0),)), SMALL_VOCAB,
     "candidate ids = 120 exceeds the limit 99"),
    (VerifyResult(0, 0, dist=Dist(120, [1], [65_535])), SMALL_VOCAB,
     "dist width = 120 exceeds the limit 100"),
    (VerifyResult(0, 0, dist=Dist(100, [5], [60_000]), theta_o=5535, o_token=120,
                  pieces=((120, "x"),)), SMALL_VOCAB, "o_token = 120 exceeds the limit 99"),
    (Candidates(0, ((5, 1.0), (7, 0.5)), ((7, "x"),)), Limits(max_candidates=1),
     "candidate count = 2 exceeds the limit 1"),
    (OToken(0, 120, "x"), SMALL_VOCAB, "token = 120 exceeds the limit 99"),
    (CandidatesRequest(0, 9), Limits(max_candidates=8), "k = 9 exceeds the limit 8"),
    (FirstCandidates(9), Limits(max_candidates=8), "k = 9 exceeds the limit 8"),
    (DraftWithDists(0, 0, (), (1,), (), 120, (0,), (Dist(120, [1], [65_535]),)), SMALL_VOCAB,
     "width = 120 exceeds the limit 100"),
    (HiddenStates(0, np.ones((3, 2), np.float16)), Limits(max_hidden=2),
     "hidden states dim = 3 exceeds the limit 2"),
    (HiddenStates(0, np.ones((2, 2), np.float16)), Limits(max_hidden=3),
     "hidden states of 4 elements, limit 3"),
    (HiddenStates(0, np.ones((1, 1, 1), np.float16)), Limits(max_ndim=2),
     "hidden states ndim = 3 exceeds the limit 2"),
    (Error(3, "abc"), Limits(max_string=2), "error message length = 3 exceeds the limit 2"),
    (Close("abc"), Limits(max_string=2), "close reason length = 3 exceeds the limit 2"),
    (Auth("abc"), Limits(max_string=2), "token length = 3 exceeds the limit 2"),
    (Resume("abc"), Limits(max_string=2), "session length = 3 exceeds the limit 2"),
    (StartRequest(0, "abc"), Limits(max_string=2), "prompt length = 3 exceeds the limit 2"),
    (OToken(0, 1, "abc"), Limits(max_string=2), "piece length = 3 exceeds the limit 2"),
    (Candidates(0, ((7, 1.0),), ((7, "abc"),)), Limits(max_string=2),
     "piece length = 3 exceeds the limit 2"),
]  # fmt: skip


@pytest.mark.parametrize(("msg", "limits", "error"), LIMIT_CASES, ids=lambda v: str(v)[:30])
def test_a_value_over_the_receivers_limit_is_refused_by_name(
    msg: object, limits: Limits, error: str
) -> None:
    frame = encode(msg)
    with pytest.raises(WireError) as err:
        decode(frame, limits)
    assert str(err.value) == error


def _patched(msg: object, old: bytes, new: bytes) -> bytes:
    """`msg`'s frame with one byte string of its payload replaced (same length)."""
    frame = encode(msg)
    assert len(old) == len(new) and frame.count(old) == 1
    return frame.replace(old, new)


def test_positions_past_the_draft_are_refused_by_name() -> None:
    dwd = DraftWithDists(0, 0, (), (1, 2), (), 4, (0, 1), (Dist(4, [2], [65_535]),) * 2)
    frame = encode(dwd)  # positions travel as gaps 0, 0: a gap of 1 puts the second at 2
    code, start, _ = parse_header(frame)
    payload = bytearray(frame[start:])
    at = payload.index(bytes((4, 2, 0, 0)))  # width 4, 2 dists, gaps 0 0
    payload[at + 3] = 1
    with pytest.raises(WireError) as err:
        decode(_frame(code, bytes(payload)))
    assert str(err.value) == "dist_positions reach 2, must stay below 2"


# ----------------------------------------------------------------------------- constructors
def _annotated(cls: type, kind: str) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.type == kind]


def _named(field: object) -> object:
    """Test ids: a class by its name."""
    return getattr(field, "__name__", field)


def _fields(kind: str) -> list[tuple[type, str]]:
    return [(cls, name) for cls in FULL for name in _annotated(cls, kind)]


SCALARS = _fields("int") + _fields("int | None") + [(Dist, "width"), (Dist, "bits")]
ID_TUPLES = _fields("tuple[int, ...]")
FLAGS = _fields("bool")
# the names a constructor's errors use where they are not the attribute's own
CONSTRUCTOR_LABEL = {(Error, "code"): "error code", (Dist, "width"): "dist width",
                     (Dist, "bits"): "dist bits"}  # fmt: skip
_DIST = Dist(4, [1], [65_535])


def _example(cls: type) -> object:
    return _DIST if cls is Dist else FULL[cls]


def test_the_field_lists_cover_every_numeric_field() -> None:
    """Counted by hand from messages.py, so a field whose annotation changes is not skipped."""
    assert len(SCALARS) == 27 and len(ID_TUPLES) == 9 and len(FLAGS) == 5


@pytest.mark.parametrize(("cls", "name"), SCALARS, ids=_named)
def test_integer_fields_hold_plain_ints_and_name_themselves_when_not_integers(
    cls: type, name: str
) -> None:
    value = getattr(_example(cls), name)
    msg = dataclasses.replace(_example(cls), **{name: np.int64(value)})
    assert type(getattr(msg, name)) is int and getattr(msg, name) == value
    label = CONSTRUCTOR_LABEL.get((cls, name), name)
    with pytest.raises(WireError) as err:
        dataclasses.replace(_example(cls), **{name: 1.5})
    assert str(err.value) == f"{label} must be an integer, got float"


@pytest.mark.parametrize(("cls", "name"), ID_TUPLES, ids=_named)
def test_id_lists_become_tuples_of_plain_ints_and_name_themselves(cls: type, name: str) -> None:
    value = getattr(FULL[cls], name)
    msg = dataclasses.replace(FULL[cls], **{name: np.array(value, np.int64)})
    assert getattr(msg, name) == value and all(type(v) is int for v in getattr(msg, name))
    assert type(getattr(msg, name)) is tuple
    with pytest.raises(WireError) as err:
        dataclasses.replace(FULL[cls], **{name: [*value[:-1], 1.5]})
    assert str(err.value) == f"{name} must be an integer, got float"
    with pytest.raises(WireError) as err:
        dataclasses.replace(FULL[cls], **{name: np.array(value, np.float64)})
    assert str(err.value) == f"{name} must hold integers, got dtype float64"


@pytest.mark.parametrize(("cls", "name"), FLAGS, ids=_named)
def test_flags_hold_plain_bools(cls: type, name: str) -> None:
    msg = dataclasses.replace(FULL[cls], **{name: np.int64(1)})
    assert getattr(msg, name) is True


def test_candidate_pairs_and_pieces_hold_plain_values_and_refuse_other_shapes() -> None:
    cands, pieces = [[np.int64(9), np.float32(0.5)]], [[np.int64(9), "x"]]
    for msg in (Candidates(1, cands, pieces), VerifyResult(1, 0, candidates=cands, pieces=pieces)):
        assert msg.candidates == ((9, 0.5),) and msg.pieces == ((9, "x"),)
        assert [type(v) for v in msg.candidates[0]] == [int, float]
        assert type(msg.pieces) is tuple and type(msg.pieces[0][0]) is int
    bad = {
        "candidates must be (id, probability) pairs": [
            {"candidates": [(9, "0.5")]}, {"candidates": [(9, True)]}, {"candidates": [9]},
        ],
        "candidate id must be an integer, got float": [{"candidates": [(9.0, 0.5)]}],
        "pieces must be (id, str) pairs": [{"pieces": [(9, b"x")]}, {"pieces": [9]}],
        "piece id must be an integer, got float": [{"pieces": [(9.0, "x")]}],
    }  # fmt: skip
    for error, cases in bad.items():
        for fields in cases:
            with pytest.raises(WireError) as err:
                Candidates(**{"round": 1, "candidates": [(9, 0.5)], **fields})
            assert str(err.value) == error, fields


def test_array_fields_refuse_other_element_types_by_name() -> None:
    cases = {
        "dist ids must be integers, got dtype float64": lambda: Dist(4, [1.0], [5]),
        "dist counts must be integers, got dtype float64": lambda: Dist(4, [1], [5.0]),
        "dist has 2 ids but 1 counts": lambda: Dist(4, [1, 2], [5]),
        "dense dist must be a 1-D int array, got float64(2,)": lambda: Dist.from_dense(
            np.array([0.5, 0.5])
        ),
        "hidden states must be floating point, got int64": lambda: HiddenStates(0, np.ones(2, int)),
        "unknown resample kind 9": lambda: ResampleRequest(0, 9),
    }
    for error, build in cases.items():
        with pytest.raises(WireError) as err:
            build()
        assert str(err.value) == error


# ----------------------------------------------------------------------------- validation
# the names validation uses where they are not the attribute's own
VALIDATE_LABEL = {(Error, "code"): "error code", (Error, "message"): "error message",
                  (Close, "reason"): "close reason", (VerifyResult, "token"): "token/o_token",
                  (VerifyResult, "o_token"): "token/o_token"}  # fmt: skip
# a value each field's rule refuses: below zero, except where a negative number is valid
OUT_OF_RANGE = {(Error, "code"): 1 << 62, (CandidatesRequest, "k"): 0, (FirstCandidates, "k"): 0}


def _refusal(msg: object, **fields: object) -> str:
    with pytest.raises(WireError) as err:
        encode(dataclasses.replace(msg, **fields))
    return str(err.value)


@pytest.mark.parametrize(("cls", "name"), [f for f in SCALARS if f[0] is not Dist], ids=_named)
def test_a_number_out_of_its_range_is_refused_by_name(cls: type, name: str) -> None:
    label = VALIDATE_LABEL.get((cls, name), name)
    error = _refusal(FULL[cls], **{name: OUT_OF_RANGE.get((cls, name), -1)})
    assert re.match(rf"{re.escape(label)}(: | = )", error), error


@pytest.mark.parametrize(("cls", "name"), ID_TUPLES, ids=_named)
def test_an_id_list_with_a_negative_entry_is_refused_by_name(cls: type, name: str) -> None:
    error = _refusal(FULL[cls], **{name: (-1,) * len(getattr(FULL[cls], name))})
    assert re.match(rf"{name}(: | must )", error), error


@pytest.mark.parametrize(("cls", "name"), _fields("str"), ids=_named)
def test_a_string_field_that_is_not_a_string_is_refused_by_name(cls: type, name: str) -> None:
    label = VALIDATE_LABEL.get((cls, name), name)
    assert _refusal(FULL[cls], **{name: 5}) == f"{label} must be a str, got int"


_VR = FULL[VerifyResult]
_DWD = FULL[DraftWithDists]
_HALF = Dist(V, [5], [65_535 - 100])
REFUSALS = [
    (Draft(0, 0, (), (1, 2), (5,)), "1 probs for 2 verified tokens"),
    (Draft(0, 0, (), (1,), (65_536,)), "probs: count 65536 outside [0, 65535]"),
    (dataclasses.replace(_DWD, dist_positions=(0,)), "2 dists for 1 dist_positions"),
    (dataclasses.replace(_DWD, width=5), "dists[0] has width 4, message width 5"),
    (dataclasses.replace(_DWD, dists=(_DWD.dists[0], Dist(4, [2], [5]))),
     "dists[1]: counts sum to 5, need == 65535"),
    (VerifyResult(0, 0, dist=Dist(V, [5], [65_535], 8)),
     "dist: precision of 8 bits, must be one of (16, 24, 32)"),
    (VerifyResult(0, 0, dist=Dist(4, [2, 1], [5, 65_530])),
     "dist: ids must be strictly increasing in [0, 4)"),
    (VerifyResult(0, 0, dist=Dist(4, [1, 2], [65_536, 5])), "dist: counts must lie in [1, 65535]"),
    (VerifyResult(0, 0, dist=Dist(4, [1], [100])),
     "dist total + theta_o = 100, must be 65535 unless truncated"),
    (VerifyResult(0, 0, dist=Dist(4, [1], [100]), theta_o=65_536),
     "theta_o: count 65536 outside [0, 65535]"),
    (VerifyResult(0, 0, dist=_HALF, theta_o=101, truncated=True),
     "dist total + theta_o = 65536, must be 65535 unless truncated"),
    (VerifyResult(0, 0, dist=Dist(4, [1, 2], [65_535, 1]), truncated=True),
     "dist: counts sum to 65536, need <= 65535"),
    (VerifyResult(0, 0, dist=Dist(0, [], [])), "dist width = 0 outside [1, 262144]"),
    (VerifyResult(0, 0, dist="q"), "dist must be a Dist, got str"),
    (VerifyResult(0, 0, token=1, truncated=True), "truncated is set but no dist is present"),
    (VerifyResult(0, 0, candidates=((9, 1.5),)), "candidate 9: probability 1.5 outside (0, 1]"),
    (VerifyResult(0, 0, candidates=((9, 0.5), (9, 0.25))),
     "candidate 9 listed with probabilities 0.5 and 0.25"),
    (VerifyResult(0, 0, candidates=((-1, 0.5),)),
     "candidates: token id -1 outside the vocabulary [0, 262144)"),
    (VerifyResult(0, 0, dist=_HALF, theta_o=100, o_token=7), "o_token travels without its piece"),
    (VerifyResult(0, 0, candidates=((7, 0.5), (9, 0.5)), pieces=((9, "a"), (7, "b"))),
     "pieces must have strictly increasing ids"),
    (VerifyResult(0, 0, token=9, pieces=((7, "b"),)),
     "piece for id 7, which the message does not name"),
    (VerifyResult(0, 0, token=9, pieces=((9, ""),)), "piece of 9 must not be empty"),
    (VerifyResult(0, 1025), "accepted = 1025 outside [0, 1024]"),
    (Candidates(0, ((7, 0.5),), ((9, "a"),)), "piece for id 9, which the message does not name"),
    (Tokens(tuple(range(1025))), "ids: 1025 ids, limit 1024"),
    (Resume(""), "session must not be empty"),
    (OToken(0, 1, ""), "piece must not be empty"),
    (StartRequest(0, "hi", [1]), "settings must be a dict, got list"),
    (StartRequest(0, "hi", {"a": (1,)}),
     "settings do not survive JSON (use str keys, lists, not tuples)"),
    (HelloAck(3, "m", "t", {"a": {1, 2}}),
     "settings are not JSON-serialisable: Object of type set is not JSON serializable"),
    (HiddenStates(0, np.float16(1.0)), "hidden states ndim = 0 outside [1, 4]"),
    (HiddenStates(0, np.array([1.0, np.inf])), "hidden states contain non-finite values"),
    (CandidatesRequest(0, 1025), "k = 1025 outside [1, 1024]"),
    (FirstCandidates(1025), "k = 1025 outside [1, 1024]"),
    (FirstCandidates(0), "k = 0 outside [1, 1024]"),
    (Resume("s", 0, 0, (1 << 20,) * 2),
     "prefix: token id 1048576 outside the vocabulary [0, 262144)"),
    (Error(-(1 << 62) - 1, "x"),
     "error code = -4611686018427387905 outside [-4611686018427387904, 4611686018427387903]"),
    (Error(1 << 62, "x"),
     "error code = 4611686018427387904 outside [-4611686018427387904, 4611686018427387903]"),
    (Resume("s", 0, 0, (0,) * ((1 << 20) + 1)), "prefix: 1048577 ids, limit 1048576"),
    (7, "not a wire message: int"),
]  # fmt: skip


@pytest.mark.parametrize(("msg", "error"), REFUSALS, ids=lambda v: str(v)[:40])
def test_what_would_not_decode_is_refused_before_sending_with_its_exact_reason(
    msg: object, error: str
) -> None:
    with pytest.raises(WireError) as err:
        validate(msg)
    assert str(err.value) == error


@pytest.mark.parametrize(
    ("msg", "limits", "error"),
    [
        (HiddenStates(0, np.ones((2, 2), np.float16)), Limits(max_hidden=3),
         "hidden states size = 4 outside [0, 3]"),
        (StartRequest(0, "abc"), Limits(max_string=2), "prompt is 3 bytes, limit 2"),
        (DraftWithDists(0, 0, (), (1, 2), (), 4, (0, 1), (Dist(4, [2], [65_535]),) * 2),
         Limits(max_dists=1), "2 dists, limit 1"),
        (Draft(0, 0, (), (1, 2)), Limits(max_tokens=1), "tokens: 2 ids, limit 1"),
        (HiddenStates(0, np.ones((0, 5), np.float16)), Limits(max_hidden=4),
         "hidden states dim = 5 outside [0, 4]"),
    ],
)  # fmt: skip
def test_the_senders_limits_are_refused_by_name(msg: object, limits: Limits, error: str) -> None:
    with pytest.raises(WireError) as err:
        validate(msg, limits)
    assert str(err.value) == error


def test_the_widest_values_each_rule_allows_travel() -> None:
    """The edges of the ranges above: an error code of ±2^62 − 1 / −2^62 (zigzag keeps them
    in 63 bits) and a resumed session's whole output as its prefix, past the token limit."""
    for msg in (
        Error(-(1 << 62), "x"),
        Error((1 << 62) - 1, "x"),
        Resume("s", 0, 0, tuple(range(2000))),
    ):
        assert decode(encode(msg)) == msg


@pytest.mark.parametrize(
    ("msg", "declared", "error"),
    [
        (Tokens((1, 2, 3)), 1000 << 1, "truncated ids: needs 1000 bytes, 3 left"),
        (Draft(0, 0, (), (1, 2, 3)), 1000 << 4, "truncated tokens: needs 1000 bytes, 3 left"),
    ],
)
def test_a_count_past_the_payload_fails_before_any_id_is_read(
    msg: object, declared: int, error: str
) -> None:
    """A claimed count is checked against the bytes present first (no work for a lie)."""
    full = encode(msg)
    code, start, _ = parse_header(full)
    payload = full[start:]
    head = bytes((0x80 | declared & 0x7F, declared >> 7))  # the count as a 2-byte varint
    at = 0 if isinstance(msg, Tokens) else 2  # Draft: after round and base (one byte each)
    patched = payload[:at] + head + payload[at + 1 :]
    with pytest.raises(WireError) as err:
        decode(_frame(code, patched))
    assert str(err.value) == error


def _vlen(value: int) -> int:
    """Bytes of an unsigned LEB128 varint, counted the slow way (independent of the codec)."""
    return 1 + (value >= 128) + (value >= 1 << 14) + (value >= 1 << 21)


@pytest.mark.parametrize("n", [125, 126, 127])
def test_a_sparse_distribution_costs_what_its_varints_take_at_the_tag_boundary(n: int) -> None:
    """The tag is n + 1: one byte up to 126 entries, two from 127 (bits are counted from it)."""
    ids = np.arange(n) * 1000
    dist = Dist(V, ids, [1] * (n - 1) + [65_535 - (n - 1)])
    size = _vlen(n + 1) + sum(_vlen(g) for g in np.diff(ids, prepend=-1) - 1)
    size += sum(_vlen(int(c)) for c in dist.counts)
    assert sparse_size(dist) == size
    payload = 4 + _vlen(V) + size  # round, accepted, flags, precision (a byte each), width
    assert len(encode(VerifyResult(0, 0, dist=dist))) == 2 + _vlen(payload) + payload


def test_a_tag_past_the_width_is_refused_by_name() -> None:
    """Sparse tags count entries + 1, so a tag over width + 1 cannot be a distribution."""
    full = encode(VerifyResult(0, 0, dist=Dist(4, [0, 1, 2, 3], [65_532, 1, 1, 1])))
    code, start, _ = parse_header(full)
    payload = bytearray(full[start:])
    assert payload[3:6] == bytes((4, 16, 0))  # width, precision, tag 0 (dense)
    payload[5] = 6
    with pytest.raises(WireError) as err:
        decode(_frame(code, bytes(payload)))
    assert str(err.value) == "dist tag = 6 exceeds the limit 5"


def test_the_smallest_distribution_fits_the_least_bytes_a_distribution_takes() -> None:
    """Six bytes: its position's gap, precision, tag and one count of 2^16 − 1 (dense, width 1).
    A claimed number of distributions is checked against six bytes each, before any is read."""
    one = DraftWithDists(0, 0, (), (1,), (), 1, (0,), (Dist(1, [0], [65_535]),))
    frame = encode(one)
    assert decode(frame) == one
    assert frame[-6:] == bytes((0, 16, 0, 0xFF, 0xFF, 0x03))
    two = DraftWithDists(0, 0, (), (1, 2), (), 1, (0, 1), one.dists * 2)
    full = encode(two)
    code, start, _ = parse_header(full)
    payload = full[start:-1]  # one byte short of two minimal distributions
    with pytest.raises(WireError) as err:
        decode(_frame(code, payload))
    assert str(err.value) == "dist count = 2 needs at least 12 bytes, 11 left"


def test_hidden_states_hold_a_read_only_float16_copy() -> None:
    source = np.arange(6, dtype=np.float32).reshape(2, 3)
    msg = HiddenStates(0, source)
    source[0, 0] = 99
    assert msg.data.dtype == np.float16 and msg.shape == (2, 3) and msg.data[0, 0] == 0
    assert not msg.data.flags.writeable


# ------------------------------------------------------------ boundaries make mutate found open
def test_settings_travel_in_one_canonical_form_whatever_their_key_order() -> None:
    """Equal settings must give equal bytes: the cloud compares them and bits are counted."""
    one, other = {"b": 1, "a": [2, "é"]}, {"a": [2, "é"], "b": 1}
    assert settings_json(one) == settings_json(other) == '{"a":[2,"é"],"b":1}'
    assert encode(StartRequest(0, "p", one)) == encode(StartRequest(0, "p", other))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (b'{"b":2,"a":1}', "settings must be a JSON object in canonical compact form"),
        (b'{"a":1,"a":2}', "settings are not valid JSON: settings JSON repeats a key"),
        (b'{"a":1,"b":N}',
         "settings are not valid JSON: Expecting value: line 1 column 12 (char 11)"),
    ],
)  # fmt: skip
def test_settings_text_a_peer_did_not_write_canonically_is_refused(text: bytes, error: str) -> None:
    frame = _patched(StartRequest(0, "p", {"a": 1, "b": 2}), b'{"a":1,"b":2}', text)
    with pytest.raises(WireError) as err:
        decode(frame)
    assert str(err.value) == error


def test_an_unknown_type_is_refused_from_the_second_byte() -> None:
    """A stream fails as soon as the bytes seen are invalid, not when the length arrives."""
    with pytest.raises(WireError) as err:
        parse_header(bytes((0xA0 | WIRE_VERSION, 250)))
    assert str(err.value) == "unknown message type 250"
    assert parse_header(bytes((0xA0 | WIRE_VERSION, encode(Close("x"))[1]))) is None


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (b"\x80\x00", "non-minimal varint for payload length"),
        (b"", "truncated frame header"),
    ],
)
def test_a_bad_frame_header_is_named(header: bytes, error: str) -> None:
    frame = bytes((0xA0 | WIRE_VERSION, encode(Close("x"))[1])) + header
    with pytest.raises(WireError) as err:
        decode(frame)
    assert str(err.value) == error


def test_the_decoders_safety_net_names_the_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parser bug must still surface as a WireError (the server drops only that client),
    naming what went wrong inside."""
    frame = encode(Close("x"))
    cls, enc, _ = codec._TYPES[frame[1]]

    def broken(r: object, limits: Limits) -> None:
        raise KeyError("lost")

    monkeypatch.setitem(codec._TYPES, frame[1], (cls, enc, broken))
    with pytest.raises(WireError) as err:
        decode(frame)
    assert str(err.value) == "malformed frame (internal KeyError: 'lost')"


def test_a_string_of_exactly_the_limit_travels() -> None:
    limits = Limits(max_string=3)
    for msg in (Close("abc"), Close("é1")):
        validate(msg, limits)
        assert decode(encode(msg), limits) == msg


def test_a_string_that_is_not_utf8_is_refused_by_name() -> None:
    with pytest.raises(WireError) as err:
        decode(_patched(Close("ab"), b"ab", b"\xff\xfe"))
    assert str(err.value) == "close reason is not valid UTF-8: invalid start byte"


def test_pieces_may_name_every_candidate_the_token_and_the_o_token_but_no_more() -> None:
    """Pieces travel for the candidates plus at most two more ids (token and O-token), so a
    receiver caps their count at max_candidates + 2 (it travels as count - 1)."""
    limits = Limits(max_candidates=1)
    fits = VerifyResult(0, 0, token=6, dist=_HALF, theta_o=100, o_token=7,
                        candidates=((5, 1.0),), pieces=((5, "a"), (6, "b"), (7, "c")))  # fmt: skip
    frame = encode(fits)
    assert decode(frame, limits) == fits
    code, start, _ = parse_header(frame)
    payload = bytearray(frame[start:])
    at = payload.index(b"\x01a\x01b\x01c") - 4  # count - 1, then the ids' gaps: 5, 0, 0
    assert payload[at] == 2  # three pieces
    payload[at] = 3
    with pytest.raises(WireError) as err:
        decode(_frame(code, bytes(payload)), limits)
    assert str(err.value) == "piece count = 3 exceeds the limit 2"


def test_an_overlong_varint_in_a_long_id_list_is_refused_by_name() -> None:
    """Lists of more than 16 ids are read vectorised; that path names its field too."""
    frame = encode(Tokens((1,) * 20))
    code, start, _ = parse_header(frame)
    payload = frame[start:]
    assert payload[:2] == bytes((20 << 1, 1))  # count << 1 | finished, first id
    longest = len(encode(Tokens((Limits().id_bound - 1,)))) - 4  # bytes of the widest id
    overlong = bytes((0x81,) + (0x80,) * longest + (0x00,))
    with pytest.raises(WireError) as err:
        decode(_frame(code, payload[:1] + overlong + payload[2:]))
    assert str(err.value) == f"varint in ids longer than {longest} bytes"
