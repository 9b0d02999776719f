"""Wire messages: frozen dataclasses of plain data, plus the `Dist` and `Limits` value types.

Token-id lists are tuples of Python ints (equality in tests and protocols is then trivial; the
lists are short). Bulk data stays numpy: a `Dist` holds int64 arrays, `HiddenStates` a float16
array; both are read-only copies with value equality. Constructors only normalise types (lists to
tuples, numpy ints to ints, arrays to read-only copies); range and consistency checks happen in
`wanspec.wire.validate`, which `encode` and `decode` both run.

All ids are target-vocabulary ids. Counts are quantised probabilities: a `Dist` of `bits` bits
(16, 24 or 32) holds integers in [0, 2^bits − 1] and a complete one sums to exactly 2^bits − 1;
a draft's p(x) is 16-bit (`PROB_SCALE`); SR-DV's q(y) travel as float64 (see
docs/ARCHITECTURE.md, "Quantised probabilities").
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wanspec.wire.errors import WireError

PROB_SCALE = 65535  # the total of a complete 16-bit distribution (= wanspec.sampling.quant's)
DIST_BITS = (16, 24, 32)  # precisions a Dist may have (= wanspec.sampling.quant.Q_BITS)


def dist_scale(bits: int) -> int:
    """The total of a complete `bits`-bit distribution."""
    return (1 << bits) - 1


@dataclass(frozen=True)
class Limits:
    """Hard bounds a decoder enforces (and an encoder, so that whatever it sends decodes).

    `max_vocab`, when set (per connection, e.g. the target's logits width), bounds every token id
    and distribution width; otherwise ids are bounded by `max_width`.
    """

    max_frame: int = 8 << 20  # bytes of one frame, header included
    max_tokens: int = 1024  # entries of one id / prob / position list
    max_width: int = 1 << 18  # width of a distribution
    max_vocab: int | None = None
    max_string: int = 1 << 20  # UTF-8 bytes of one string (prompt, piece, settings JSON)
    max_candidates: int = 1024
    max_dists: int = 64  # distributions in one DraftWithDists
    max_hidden: int = 1 << 22  # float16 elements in one HiddenStates
    max_ndim: int = 4  # dimensions of a HiddenStates array

    @property
    def id_bound(self) -> int:
        """Exclusive upper bound on token ids."""
        return self.max_width if self.max_vocab is None else self.max_vocab

    def with_vocab(self, vocab: int) -> Limits:
        """These limits with token ids checked against a connection's vocabulary width."""
        return dataclasses.replace(self, max_vocab=vocab)


DEFAULT_LIMITS = Limits()


# ----------------------------------------------------------------------------- normalisers
def _index(value: Any, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError as exc:
        raise WireError(f"{what} must be an integer, got {type(value).__name__}") from exc


def _opt_index(value: Any, what: str) -> int | None:
    return None if value is None else _index(value, what)


def _ints(values: Iterable[Any], what: str) -> tuple[int, ...]:
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iub":
            raise WireError(f"{what} must hold integers, got dtype {values.dtype}")
        return tuple(values.tolist())
    return tuple(_index(v, what) for v in values)


def _pairs(values: Iterable[Any], shape: str) -> list[tuple[Any, Any]]:
    """The items of `values` as 2-tuples; a WireError saying `shape` if they are not pairs."""
    try:
        return [(a, b) for a, b in values]
    except (TypeError, ValueError) as exc:
        raise WireError(f"{shape} pairs") from exc


def _candidate_pairs(values: Iterable[Any]) -> tuple[tuple[int, float], ...]:
    """SR-DV's (id, q(id)) pairs: an integer id and a real probability, kept as a float64."""
    shape = "candidates must be (id, probability)"
    out = [(_index(tid, "candidate id"), q) for tid, q in _pairs(values, shape)]
    real = (int, float, np.floating, np.integer)
    if not all(isinstance(q, real) and not isinstance(q, bool) for _, q in out):
        raise WireError(f"{shape} pairs")
    return tuple((tid, float(q)) for tid, q in out)


def _pieces(values: Iterable[Any]) -> tuple[tuple[int, str], ...]:
    shape = "pieces must be (id, str)"
    out = tuple((_index(tid, "piece id"), piece) for tid, piece in _pairs(values, shape))
    if not all(isinstance(piece, str) for _, piece in out):
        raise WireError(f"{shape} pairs")
    return out


def _int_array(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise WireError(f"{what} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64).reshape(-1)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


# ----------------------------------------------------------------------------- Dist
@dataclass(frozen=True, eq=False)
class Dist:
    """A (possibly partial) quantised distribution over `width` ids, stored sparse.

    `ids` (strictly increasing) and `counts` (each in 1..2^bits − 1, total ≤ 2^bits − 1) list the
    non-zero entries; zero counts given to the constructor are dropped. Counts travel as varints
    (small tail counts take one byte whatever the precision); the codec picks the smaller of the
    dense (a varint per id) and sparse (delta-varint ids + varint counts) encodings.
    """

    width: int
    ids: np.ndarray
    counts: np.ndarray
    bits: int = 16

    def __post_init__(self) -> None:
        _set(self, "width", _index(self.width, "dist width"))
        _set(self, "bits", _index(self.bits, "dist bits"))
        ids, counts = _int_array(self.ids, "dist ids"), _int_array(self.counts, "dist counts")
        if ids.shape != counts.shape:
            raise WireError(f"dist has {len(ids)} ids but {len(counts)} counts")
        keep = counts != 0
        _set(self, "ids", _readonly(ids[keep]))
        _set(self, "counts", _readonly(counts[keep]))

    @classmethod
    def from_dense(cls, counts: np.ndarray, bits: int = 16) -> Dist:
        """From a width-V count array (e.g. the output of `wanspec.sampling.quant`)."""
        dense = np.asarray(counts)
        if dense.ndim != 1 or dense.dtype.kind not in "iu":
            raise WireError(f"dense dist must be a 1-D int array, got {dense.dtype}{dense.shape}")
        ids = np.flatnonzero(dense)
        return cls(len(dense), ids, dense[ids], bits)

    def to_dense(self) -> np.ndarray:
        """The width-V int64 count array."""
        out = np.zeros(self.width, dtype=np.int64)
        out[self.ids] = self.counts
        return out

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def scale(self) -> int:
        """The total of a complete distribution at this precision."""
        return dist_scale(self.bits)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dist):
            return NotImplemented
        return (
            self.width == other.width
            and self.bits == other.bits
            and np.array_equal(self.ids, other.ids)
            and np.array_equal(self.counts, other.counts)
        )

    def __hash__(self) -> int:
        return hash((self.width, self.bits, self.ids.tobytes(), self.counts.tobytes()))


# ----------------------------------------------------------------------------- control
@dataclass(frozen=True)
class Hello:
    """Edge → cloud at connect: the protocol version, the method, and the fingerprints the edge
    expects of the cloud (target model, target tokenizer; "" = any model) and its own draft
    tokenizer's, so a mismatched pair is refused before any model work."""

    protocol_version: int
    role: str
    method: str
    target_model: str
    target_tokenizer: str
    draft_tokenizer: str

    def __post_init__(self) -> None:
        _set(self, "protocol_version", _index(self.protocol_version, "protocol_version"))


@dataclass(frozen=True)
class HelloAck:
    """Cloud → edge: the cloud's own fingerprints and facts the edge needs (eos ids, limits)."""

    protocol_version: int
    target_model: str
    target_tokenizer: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "protocol_version", _index(self.protocol_version, "protocol_version"))


@dataclass(frozen=True)
class Error:
    """Either side: a fatal protocol error (code is signed, zigzag-coded)."""

    code: int
    message: str

    def __post_init__(self) -> None:
        _set(self, "code", _index(self.code, "error code"))


@dataclass(frozen=True)
class Close:
    reason: str


@dataclass(frozen=True)
class StartRequest:
    """Edge → cloud: start one generation (max_new_tokens, temperature, top_k, top_p, seed, …)."""

    request_id: int
    prompt: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "request_id", _index(self.request_id, "request_id"))


@dataclass(frozen=True)
class Auth:
    """Edge → cloud, before `Hello`, only to a server that asks for one: a bearer token. It is
    the transport's business (the protocol machines never see it), so it is checked before any
    model work and costs nothing when no token is used."""

    token: str


# Committed ids a restarted session's `Resume` may carry (its whole output so far).
MAX_RESUME_PREFIX = 1 << 20


@dataclass(frozen=True)
class Resume:
    """Edge → cloud, before `Hello` (after `Auth`), only from an edge that wants its session to
    survive a dropped connection. Transport business, like `Auth`: the machines never see it.
    `session` is a random id the edge chose; `received` the protocol messages it has received in
    this session so far (the cloud resends the rest), `committed` its output tokens so far.
    A session's first connection sends received = 0 and, when it continues an earlier session
    whose grace period passed, `prefix`: the committed ids the target must condition on after
    the prompt. Answered by `Resumed`, or an `Error` when the session is gone."""

    session: str
    received: int = 0
    committed: int = 0
    prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "received", _index(self.received, "received"))
        _set(self, "committed", _index(self.committed, "committed"))
        _set(self, "prefix", _ints(self.prefix, "prefix"))


@dataclass(frozen=True)
class Resumed:
    """Cloud → edge, the answer to `Resume`: the protocol messages the cloud has received in
    this session (the edge resends the rest)."""

    received: int

    def __post_init__(self) -> None:
        _set(self, "received", _index(self.received, "received"))


# ----------------------------------------------------------------------------- uplink
@dataclass(frozen=True)
class Draft:
    """Edge → cloud: one round of drafted tokens.

    base: how many generated tokens the edge had committed before `committed`; the draft extends
      exactly that prefix, so a cloud whose committed output differs knows the draft is stale.
    committed: ids the edge finalised since its last message (e.g. its own resample).
    tokens: drafted ids. probs: the count p_i(x_i) of each drafted token (empty: none sent).
    srdv: a rejection in this round is resolved by SR-DV rather than the method's HR (a method
      that chooses per round, `xcosd-auto`); the cloud needs it before it verifies, since HR
      decides with the rounded q̂ and SR-DV with the float q.
    ahead: this chain continues round `round − 1` as if that round were accepted whole (a chain
      sent before the verdict on the one before it, `deepspec`, `deepspec-x`); the cloud verifies
      it only if that round was accepted whole with nothing of its own appended, and otherwise
      drops it as stale, whatever its base.
    """

    round: int
    base: int = 0
    committed: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    probs: tuple[int, ...] = ()
    srdv: bool = False
    ahead: bool = False

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        _set(self, "base", _index(self.base, "base"))
        _set(self, "committed", _ints(self.committed, "committed"))
        _set(self, "tokens", _ints(self.tokens, "tokens"))
        _set(self, "probs", _ints(self.probs, "probs"))
        _set(self, "srdv", bool(self.srdv))
        _set(self, "ahead", bool(self.ahead))


@dataclass(frozen=True)
class DraftWithDists:
    """Edge → cloud (UL, U-HLM, SD's answer, `deepspec-tree`): a Draft plus full draft
    distributions p_i.

    dist_positions: strictly increasing indices into `tokens`; dists[k] is p at dist_positions[k],
    a complete distribution over `width` ids (the target's index space). It has no `srdv` or
    `ahead` flag: a round's mechanism is named by its Draft (SD's answer and SR-DV's fallback
    follow the round's verdict).
    fork: (r, t): this chain was sent before the verdict on round r (`deepspec-tree`) and
      continues it as if that verdict left token t at output position base − 1: r accepted whole
      with t its last token (the tree's continuation), or r rejected there and t drawn by the
      cloud (one of the tree's branches). The cloud verifies it only if that is what round r's
      verdict did, and otherwise drops it as stale.
    """

    round: int
    base: int = 0
    committed: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    probs: tuple[int, ...] = ()
    width: int = 0
    dist_positions: tuple[int, ...] = ()
    dists: tuple[Dist, ...] = ()
    fork: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        _set(self, "base", _index(self.base, "base"))
        _set(self, "committed", _ints(self.committed, "committed"))
        _set(self, "tokens", _ints(self.tokens, "tokens"))
        _set(self, "probs", _ints(self.probs, "probs"))
        _set(self, "width", _index(self.width, "width"))
        _set(self, "dist_positions", _ints(self.dist_positions, "dist_positions"))
        _set(self, "dists", tuple(self.dists))
        if self.fork is not None:
            fork = _ints(self.fork, "fork")
            if len(fork) != 2:
                raise WireError(f"fork is (round, token), got {len(fork)} values")
            _set(self, "fork", fork)


@dataclass(frozen=True, eq=False)
class HiddenStates:
    """Edge → cloud (split inference): activations after the edge's layers, float16, any shape."""

    round: int
    data: np.ndarray

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        arr = np.asarray(self.data)
        if arr.dtype.kind != "f":
            raise WireError(f"hidden states must be floating point, got {arr.dtype}")
        _set(self, "data", _readonly(arr.astype(np.float16, copy=True)))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HiddenStates):
            return NotImplemented
        return (
            self.round == other.round
            and self.shape == other.shape
            and self.data.tobytes() == other.data.tobytes()
        )

    def __hash__(self) -> int:
        return hash((self.round, self.shape, self.data.tobytes()))


@dataclass(frozen=True)
class FirstCandidates:
    """Edge → cloud (SR-DV with K chosen online, `srdv_k="auto"`).

    Every rejection the cloud answers after this arrives opens with a first candidate set of k
    candidates (1 ≤ k ≤ the request's srdv_k).
    """

    k: int

    def __post_init__(self) -> None:
        _set(self, "k", _index(self.k, "k"))


# ----------------------------------------------------------------------------- downlink
@dataclass(frozen=True)
class VerifyResult:
    """Cloud → edge: the verification outcome of one round; absent fields cost no bytes.

    accepted: number of leading draft tokens accepted.
    token: a token the cloud chose (bonus after full acceptance, replacement, GR's argmax).
    dist: q at the first rejected position (Naive: complete; HR: restricted to C; TR/top-mass:
      truncated) or q_{γ+1}. Unless `truncated`, dist.total + (theta_o or 0) == dist.scale.
    theta_o: HR's count of q's mass on the LLM-only region O, at the dist's precision.
    o_token: HR's pre-drawn sample of q restricted to O (its piece must be in `pieces`).
    candidates: SR-DV's K (id, q(id)) samples of q in draw order, q(id) a float64 in (0, 1].
    pieces: (id, vocabulary piece) for LLM-only ids named above, ids strictly increasing.
    truncated: dist is a lossy truncation (TR, top-mass). finished: generation is over.
    """

    round: int
    accepted: int
    token: int | None = None
    dist: Dist | None = None
    theta_o: int | None = None
    o_token: int | None = None
    candidates: tuple[tuple[int, float], ...] | None = None
    pieces: tuple[tuple[int, str], ...] = ()
    truncated: bool = False
    finished: bool = False

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        _set(self, "accepted", _index(self.accepted, "accepted"))
        _set(self, "token", _opt_index(self.token, "token"))
        _set(self, "theta_o", _opt_index(self.theta_o, "theta_o"))
        _set(self, "o_token", _opt_index(self.o_token, "o_token"))
        if self.candidates is not None:
            _set(self, "candidates", _candidate_pairs(self.candidates))
        _set(self, "pieces", _pieces(self.pieces))
        _set(self, "truncated", bool(self.truncated))
        _set(self, "finished", bool(self.finished))


@dataclass(frozen=True)
class CandidatesRequest:
    """Edge → cloud (SR-DV): all K candidates were rejected, send k more for this round."""

    round: int
    k: int

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        _set(self, "k", _index(self.k, "k"))


@dataclass(frozen=True)
class Candidates:
    """Cloud → edge (SR-DV): more (id, q(id)) samples of q for this round, pieces for O ids."""

    round: int
    candidates: tuple[tuple[int, float], ...]
    pieces: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        _set(self, "candidates", _candidate_pairs(self.candidates))
        _set(self, "pieces", _pieces(self.pieces))


class ResampleKind(enum.IntEnum):
    """What a ResampleRequest asks for."""

    O_SAMPLE = 0  # HR, region O chosen: a sample of q restricted to O (answered by OToken)
    # the paper's SR-DV fallback (HR: q restricted to C and theta_o); it still decodes, but no
    # scheme sends or answers it: wanspec's SR-DV falls back by uploading p̃ of that position
    HR_DIST = 1


@dataclass(frozen=True)
class ResampleRequest:
    round: int
    kind: ResampleKind

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        try:
            _set(self, "kind", ResampleKind(self.kind))
        except ValueError as exc:
            raise WireError(f"unknown resample kind {self.kind!r}") from exc


@dataclass(frozen=True)
class OToken:
    """Cloud → edge: an LLM-only token, by id (for output) and piece (for re-tokenising)."""

    round: int
    token: int
    piece: str

    def __post_init__(self) -> None:
        _set(self, "round", _index(self.round, "round"))
        _set(self, "token", _index(self.token, "token"))


@dataclass(frozen=True)
class Tokens:
    """Cloud → edge (cloud-only autoregressive): generated ids streamed down."""

    ids: tuple[int, ...]
    finished: bool = False

    def __post_init__(self) -> None:
        _set(self, "ids", _ints(self.ids, "ids"))
        _set(self, "finished", bool(self.finished))


Message = (
    Hello
    | HelloAck
    | Error
    | Close
    | StartRequest
    | Auth
    | Resume
    | Resumed
    | Draft
    | DraftWithDists
    | HiddenStates
    | FirstCandidates
    | VerifyResult
    | CandidatesRequest
    | Candidates
    | ResampleRequest
    | OToken
    | Tokens
)
