"""Semantic checks shared by `encode` (never send what cannot be decoded) and `decode`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wanspec.wire.errors import WireError
from wanspec.wire.messages import (
    DEFAULT_LIMITS,
    DIST_BITS,
    MAX_RESUME_PREFIX,
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
    OToken,
    ResampleRequest,
    Resume,
    Resumed,
    StartRequest,
    Tokens,
    VerifyResult,
)

U63 = (1 << 63) - 1  # bound of rounds, ids of requests, versions: they fit an int64


def check_uint(value: int, what: str, limit: int = U63, low: int = 0) -> None:
    if not isinstance(value, int) or not low <= value <= limit:
        raise WireError(f"{what} = {value!r} outside [{low}, {limit}]")


def check_ids(ids: Sequence[int], what: str, limits: Limits, max_len: int | None = None) -> None:
    max_len = limits.max_tokens if max_len is None else max_len
    if len(ids) > max_len:
        raise WireError(f"{what}: {len(ids)} ids, limit {max_len}")
    bound = limits.id_bound
    for tid in ids:
        if not 0 <= tid < bound:
            raise WireError(f"{what}: token id {tid} outside the vocabulary [0, {bound})")


def check_counts(counts: Sequence[int], what: str, low: int = 0, high: int = PROB_SCALE) -> None:
    for c in counts:
        if not low <= c <= high:
            raise WireError(f"{what}: count {c} outside [{low}, {high}]")


def check_positions(positions: Sequence[int], n: int, what: str) -> None:
    """Strictly increasing indices into a list of n tokens."""
    prev = -1
    for p in positions:
        if not prev < p < n:
            raise WireError(f"{what} must be strictly increasing indices below {n}, got {p}")
        prev = p


def check_string(value: str, what: str, limits: Limits, nonempty: bool = False) -> None:
    if not isinstance(value, str):
        raise WireError(f"{what} must be a str, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise WireError(f"{what} is not encodable as UTF-8: {exc.reason}") from exc
    if size > limits.max_string:
        raise WireError(f"{what} is {size} bytes, limit {limits.max_string}")
    if nonempty and not size:
        raise WireError(f"{what} must not be empty")


def settings_json(settings: dict[str, Any]) -> str:
    """Canonical compact JSON of a settings dict; rejects what would not round-trip equal."""
    if not isinstance(settings, dict):
        raise WireError(f"settings must be a dict, got {type(settings).__name__}")
    try:
        text = json.dumps(
            settings, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise WireError(f"settings are not JSON-serialisable: {exc}") from exc
    try:
        same = json.loads(text) == settings
    except RecursionError as exc:
        raise WireError("settings are nested too deeply") from exc
    if not same:
        raise WireError("settings do not survive JSON (use str keys, lists, not tuples)")
    return text


def check_settings(settings: dict[str, Any], limits: Limits) -> None:
    check_string(settings_json(settings), "settings JSON", limits)


def check_dist(dist: Dist, what: str, limits: Limits, complete: bool) -> None:
    if not isinstance(dist, Dist):
        raise WireError(f"{what} must be a Dist, got {type(dist).__name__}")
    check_uint(dist.width, f"{what} width", min(limits.max_width, limits.id_bound), low=1)
    if dist.bits not in DIST_BITS:
        raise WireError(f"{what}: precision of {dist.bits} bits, must be one of {DIST_BITS}")
    ids, counts, scale = dist.ids, dist.counts, dist.scale
    if len(ids) and (ids[0] < 0 or ids[-1] >= dist.width or np.any(np.diff(ids) <= 0)):
        raise WireError(f"{what}: ids must be strictly increasing in [0, {dist.width})")
    if len(counts) and (counts.min() < 1 or counts.max() > scale):
        raise WireError(f"{what}: counts must lie in [1, {scale}]")
    total = dist.total
    if total > scale or (complete and total != scale):
        need = "==" if complete else "<="
        raise WireError(f"{what}: counts sum to {total}, need {need} {scale}")


def check_candidates(cands: Sequence[tuple[int, float]], limits: Limits) -> None:
    check_ids([c for c, _ in cands], "candidates", limits, limits.max_candidates)
    seen: dict[int, float] = {}
    for tid, q in cands:
        if not (isinstance(q, float) and math.isfinite(q) and 0.0 < q <= 1.0):
            raise WireError(f"candidate {tid}: probability {q!r} outside (0, 1]")
        if seen.setdefault(tid, q) != q:
            raise WireError(f"candidate {tid} listed with probabilities {seen[tid]} and {q}")


def check_pieces(pieces: Sequence[tuple[int, str]], named: set[int], limits: Limits) -> None:
    """Pieces are keyed by strictly increasing ids, each one named elsewhere in the message."""
    prev = -1
    for tid, piece in pieces:
        if tid <= prev:
            raise WireError("pieces must have strictly increasing ids")
        if tid not in named:
            raise WireError(f"piece for id {tid}, which the message does not name")
        check_string(piece, f"piece of {tid}", limits, nonempty=True)
        prev = tid


# ----------------------------------------------------------------------------- per message
def _hello(m: Hello, limits: Limits) -> None:
    check_uint(m.protocol_version, "protocol_version")
    for name in ("role", "method", "target_model", "target_tokenizer", "draft_tokenizer"):
        check_string(getattr(m, name), name, limits)


def _hello_ack(m: HelloAck, limits: Limits) -> None:
    check_uint(m.protocol_version, "protocol_version")
    check_string(m.target_model, "target_model", limits)
    check_string(m.target_tokenizer, "target_tokenizer", limits)
    check_settings(m.info, limits)


def _error(m: Error, limits: Limits) -> None:
    check_uint(m.code, "error code", U63 // 2, low=-(U63 // 2) - 1)
    check_string(m.message, "error message", limits)


def _close(m: Close, limits: Limits) -> None:
    check_string(m.reason, "close reason", limits)


def _start(m: StartRequest, limits: Limits) -> None:
    check_uint(m.request_id, "request_id")
    check_string(m.prompt, "prompt", limits)
    check_settings(m.settings, limits)


def _auth(m: Auth, limits: Limits) -> None:
    check_string(m.token, "token", limits)


def _resume(m: Resume, limits: Limits) -> None:
    check_string(m.session, "session", limits, nonempty=True)
    check_uint(m.received, "received")
    check_uint(m.committed, "committed")
    check_ids(m.prefix, "prefix", limits, MAX_RESUME_PREFIX)


def _resumed(m: Resumed, limits: Limits) -> None:
    check_uint(m.received, "received")


def _draft_common(m: Draft | DraftWithDists, limits: Limits, n_verified: int) -> None:
    check_uint(m.round, "round")
    check_uint(m.base, "base")
    check_ids(m.committed, "committed", limits)
    check_ids(m.tokens, "tokens", limits)
    if m.probs and len(m.probs) != n_verified:
        raise WireError(f"{len(m.probs)} probs for {n_verified} verified tokens")
    check_counts(m.probs, "probs")


def _draft(m: Draft, limits: Limits) -> None:
    _draft_common(m, limits, len(m.tokens))


def _draft_dists(m: DraftWithDists, limits: Limits) -> None:
    _draft_common(m, limits, len(m.tokens))
    if m.fork is not None:
        check_uint(m.fork[0], "fork round")
        check_ids(m.fork[1:], "fork token", limits)
    check_uint(m.width, "width", min(limits.max_width, limits.id_bound))
    check_positions(m.dist_positions, len(m.tokens), "dist_positions")
    if len(m.dists) != len(m.dist_positions):
        raise WireError(f"{len(m.dists)} dists for {len(m.dist_positions)} dist_positions")
    if len(m.dists) > limits.max_dists:
        raise WireError(f"{len(m.dists)} dists, limit {limits.max_dists}")
    for k, dist in enumerate(m.dists):
        check_dist(dist, f"dists[{k}]", limits, complete=True)
        if dist.width != m.width:
            raise WireError(f"dists[{k}] has width {dist.width}, message width {m.width}")


def _hidden(m: HiddenStates, limits: Limits) -> None:
    check_uint(m.round, "round")
    check_uint(m.data.ndim, "hidden states ndim", limits.max_ndim, low=1)
    check_uint(m.data.size, "hidden states size", limits.max_hidden)
    check_uint(max(m.data.shape), "hidden states dim", limits.max_hidden)
    if not np.all(np.isfinite(m.data)):
        raise WireError("hidden states contain non-finite values")


def _verify(m: VerifyResult, limits: Limits) -> None:
    check_uint(m.round, "round")
    check_uint(m.accepted, "accepted", limits.max_tokens)
    named = {t for t in (m.token, m.o_token) if t is not None}
    check_ids(sorted(named), "token/o_token", limits)
    if m.theta_o is not None:
        scale = m.dist.scale if isinstance(m.dist, Dist) else PROB_SCALE
        check_counts([m.theta_o], "theta_o", high=scale)
    if m.dist is not None:
        check_dist(m.dist, "dist", limits, complete=False)
        mass, scale = m.dist.total + (m.theta_o or 0), m.dist.scale
        if mass > scale or (not m.truncated and mass != scale):
            raise WireError(f"dist total + theta_o = {mass}, must be {scale} unless truncated")
    elif m.truncated:
        raise WireError("truncated is set but no dist is present")
    if m.candidates is not None:
        check_candidates(m.candidates, limits)
        named.update(c for c, _ in m.candidates)
    if m.o_token is not None and m.o_token not in {tid for tid, _ in m.pieces}:
        raise WireError("o_token travels without its piece")
    check_pieces(m.pieces, named, limits)


def _candidates(m: Candidates, limits: Limits) -> None:
    check_uint(m.round, "round")
    check_candidates(m.candidates, limits)
    check_pieces(m.pieces, {c for c, _ in m.candidates}, limits)


def _cand_request(m: CandidatesRequest, limits: Limits) -> None:
    check_uint(m.round, "round")
    check_uint(m.k, "k", limits.max_candidates, low=1)


def _first_cands(m: FirstCandidates, limits: Limits) -> None:
    check_uint(m.k, "k", limits.max_candidates, low=1)


def _resample(m: ResampleRequest, limits: Limits) -> None:
    check_uint(m.round, "round")


def _otoken(m: OToken, limits: Limits) -> None:
    check_uint(m.round, "round")
    check_ids([m.token], "token", limits)
    check_string(m.piece, "piece", limits, nonempty=True)


def _tokens(m: Tokens, limits: Limits) -> None:
    check_ids(m.ids, "ids", limits)


_CHECKS: dict[type, Callable[[Any, Limits], None]] = {
    Hello: _hello,
    HelloAck: _hello_ack,
    Error: _error,
    Close: _close,
    StartRequest: _start,
    Auth: _auth,
    Resume: _resume,
    Resumed: _resumed,
    Draft: _draft,
    DraftWithDists: _draft_dists,
    HiddenStates: _hidden,
    FirstCandidates: _first_cands,
    VerifyResult: _verify,
    Candidates: _candidates,
    CandidatesRequest: _cand_request,
    ResampleRequest: _resample,
    OToken: _otoken,
    Tokens: _tokens,
}


def validate(msg: object, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise WireError unless `msg` is a message that encodes and decodes under `limits`."""
    check = _CHECKS.get(type(msg))
    if check is None:
        raise WireError(f"not a wire message: {type(msg).__name__}")
    check(msg, limits)
