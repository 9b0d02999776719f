"""A peer's mistakes are blamed on the peer, at whichever event they come to light.

The error policy (wanspec.protocols.base) turns what the peer got wrong into an `Error` with
PROTOCOL, BAD_SETTINGS or LIMIT and a clear reason; INTERNAL is left for the server's own bugs.
Each test brings a real machine to the state where the bad message arrives (through the wire
codec, as a driver delivers it), then checks the code, the reason, and that nothing raised out
of `handle`; the last tests go over real TCP, where a peer error (a machine's, or one the driver
enforces: a frame over the limit, a flood) must reach the peer as an `Error` with its code, be the
session's outcome, and leave no traceback in the server's log.

A bad draft queued behind one in verification is refused when it ARRIVES, with an error naming
its round: the session ends there, so the verdict still being computed is cancelled, not sent.
What can only be judged when a draft's turn comes (the request's length) is refused after the
verdict before it has gone out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import wanspec
from nethelpers import run
from wanspec import wire
from wanspec.models.jobs import session_executor
from wanspec.net.background import BackgroundLoop
from wanspec.net.framing import ConnectionClosed, read_message
from wanspec.net.server import CloudServer, ServerLimits
from wanspec.protocols.base import (
    PROTOCOL_VERSION,
    Cancel,
    Compute,
    ComputeDone,
    ErrorCode,
    Machine,
    ProtocolError,
    Send,
    Start,
)
from wanspec.protocols.registry import edge_fingerprints, make_cloud
from wanspec.protocols.settings import MAX_STOP_STRINGS
from worlds import PROMPT_IDS, World, deliver, greedy, refusal

GAMMA = 2
WIDTH = 300  # the worlds' target vocabulary


def _hello(world: World, method: str) -> wire.Hello:
    fp = edge_fingerprints(world.alignment, world.target.fingerprint)
    return wire.Hello(
        PROTOCOL_VERSION, "edge", method, fp.target_model, fp.target_tokenizer, fp.draft_tokenizer
    )


def _cloud(
    world: World, method: str, *, info: Any = None, prompt: str = "synthetic", **settings: Any
) -> tuple[Any, list[Any]]:
    """A cloud past the handshake, handed a request of `prompt` and `settings` (as given,
    unchecked); the cloud and the actions the request brought."""
    cloud = make_cloud(info or world.info)
    acks = deliver(cloud, _hello(world, method))
    assert [type(a.msg) for a in acks] == [wire.HelloAck], acks
    request = wire.StartRequest(0, prompt, {"gamma": GAMMA, "max_new_tokens": 20, **settings})
    return cloud, deliver(cloud, request)


def _ready(world: World, method: str, **settings: Any) -> tuple[Any, Any]:
    """A cloud whose prompt is prefilled, waiting for the first draft, and its executor."""
    cloud, actions = _cloud(world, method, **settings)
    execute = session_executor(world.target)
    (prefill,) = actions
    assert cloud.handle(ComputeDone(prefill.job_id, execute(prefill.job))) == []
    return cloud, execute


def _run(machine: Any, execute: Any, compute: Compute) -> list[Any]:
    return machine.handle(ComputeDone(compute.job_id, execute(compute.job)))


def _dists_draft(
    round_: int, base: int, tokens: tuple[int, ...], width: int = WIDTH, mass_on: int | None = None
) -> wire.DraftWithDists:
    """A UL draft: each token's distribution all on that token (or all on `mass_on`)."""
    dists = []
    for token in tokens:
        counts = np.zeros(width, dtype=np.int64)
        counts[token if mass_on is None else mass_on] = 65535
        dists.append(wire.Dist.from_dense(counts))
    positions = tuple(range(len(tokens)))
    return wire.DraftWithDists(
        round_, base, tokens=tokens, width=width, dist_positions=positions, dists=tuple(dists)
    )


def _impossible(world: World) -> int:
    """A token the target cannot produce after the prompt: a draft of it is rejected surely."""
    world.target.reset()
    token = int(world.target.extend(PROMPT_IDS)[-1].argmin())
    world.target.reset()
    return token


# ============================================================================ drafts


@pytest.mark.parametrize(
    ("method", "first", "bad", "reason"),
    [
        (
            "naive",
            wire.Draft(0, 0, (), (5, 6), (30000, 30000)),
            wire.Draft(1, 2, (), (7, 8), ()),
            "draft for round 1: every drafted token needs its p(x)",
        ),
        (
            "ul",
            _dists_draft(0, 0, (5, 6)),
            _dists_draft(1, 2, (7, 8), width=WIDTH - 1),
            "draft for round 1: distributions over 299 ids, target has 300",
        ),
    ],
)
def test_a_bad_draft_queued_behind_one_in_verification_is_refused_on_arrival(
    shared_world: World, method: str, first: Any, bad: Any, reason: str
) -> None:
    cloud, execute = _ready(shared_world, method)
    (verify,) = deliver(cloud, first)
    assert isinstance(verify, Compute) and verify.label == "verify"
    actions = deliver(cloud, bad)
    assert refusal(actions) == (ErrorCode.PROTOCOL, reason)
    assert Cancel(verify.job_id) in actions and cloud.done  # the verdict is not computed
    assert _run(cloud, execute, verify) == []  # a late result changes nothing


def test_a_draft_past_the_requested_length_is_refused_after_the_verdict_before_it(
    shared_world: World,
) -> None:
    """The request's length is judged when the queued draft's turn comes, under a ComputeDone:
    the verdict of the round before still goes out, then the error, blamed on the peer."""
    g = greedy(shared_world, 3)
    cloud, execute = _ready(shared_world, "naive", temperature=0, max_new_tokens=3)
    (verify,) = deliver(cloud, wire.Draft(0, 0, (), (g[0], g[1]), (65535, 65535)))
    assert deliver(cloud, wire.Draft(1, 3, (), (5, 6), (65535, 65535))) == []  # queued
    actions = _run(cloud, execute, verify)
    assert actions[0] == Send(wire.VerifyResult(0, 2, token=g[2]))
    reason = "draft for round 1: the request's max_new_tokens=3 are all generated"
    assert refusal(actions[1:]) == (ErrorCode.LIMIT, reason) and cloud.done


@pytest.mark.parametrize(
    ("method", "draft", "reason"),
    [
        (
            "naive",
            wire.Draft(0, 0, (), (5, 6), (30000, 0)),
            "draft for round 0: token 1 has p(x) = 0: it could not have been drafted",
        ),
        (
            "ul",
            _dists_draft(0, 0, (5, 6), mass_on=6),
            "draft for round 0: token 0 has p(x) = 0 in its own distribution",
        ),
    ],
)
def test_a_draft_with_p_of_x_zero_is_refused_before_any_model_work(
    shared_world: World, method: str, draft: Any, reason: str
) -> None:
    cloud, _ = _ready(shared_world, method)
    actions = deliver(cloud, draft)
    assert refusal(actions) == (ErrorCode.PROTOCOL, reason)
    assert not any(isinstance(a, Compute) for a in actions)


@pytest.mark.parametrize(
    ("method", "draft", "code", "reason"),
    [
        (
            "ul",
            wire.Draft(0, 0, (), (5, 6), (30000, 30000)),
            ErrorCode.PROTOCOL,
            "draft for round 0: this method's drafts travel as DraftWithDists, not Draft",
        ),
        (
            "naive",
            wire.Draft(0, 0, (), (5, 6, 7), (30000, 30000, 30000)),
            ErrorCode.LIMIT,
            "draft for round 0: 3 tokens, but the request's gamma is 2",
        ),
    ],
)
def test_a_draft_of_the_wrong_kind_or_longer_than_gamma_is_refused(
    shared_world: World, method: str, draft: Any, code: ErrorCode, reason: str
) -> None:
    cloud, _ = _ready(shared_world, method)
    assert refusal(deliver(cloud, draft)) == (code, reason)


# ============================================================================ rejections


def test_srdv_candidate_requests_stop_at_m_sets_and_must_ask_for_k(shared_world: World) -> None:
    cloud, execute = _ready(shared_world, "xcosd-e", srdv_k=1, srdv_m=2)
    (verify,) = deliver(cloud, wire.Draft(0, 0, (), (_impossible(shared_world),), (65535,)))
    (reply,) = _run(cloud, execute, verify)
    assert reply.msg.accepted == 0 and len(reply.msg.candidates) == 1  # candidate set 1
    (more,) = deliver(cloud, wire.CandidatesRequest(0, 1))
    assert isinstance(more.msg, wire.Candidates)  # set 2 of M = 2
    reason = "candidate set 3 asked for round 0, but the request's srdv_m is 2"
    assert refusal(deliver(cloud, wire.CandidatesRequest(0, 1))) == (ErrorCode.LIMIT, reason)

    cloud, execute = _ready(shared_world, "xcosd-e", srdv_k=1, srdv_m=2)
    (verify,) = deliver(cloud, wire.Draft(0, 0, (), (_impossible(shared_world),), (65535,)))
    _run(cloud, execute, verify)
    reason = "7 candidates asked for, but the request's srdv_k is 1"
    assert refusal(deliver(cloud, wire.CandidatesRequest(0, 7))) == (ErrorCode.PROTOCOL, reason)


@pytest.mark.parametrize("follow_up", ["repeated", "wrong width"])
def test_sd_refuses_a_second_or_malformed_answer_about_the_rejected_position(
    shared_world: World, follow_up: str
) -> None:
    impossible = _impossible(shared_world)
    cloud, execute = _ready(shared_world, "sd")
    (verify,) = deliver(cloud, wire.Draft(0, 0, (), (impossible,), (65535,)))
    assert [a.msg for a in _run(cloud, execute, verify)] == [wire.VerifyResult(0, 0)]
    if follow_up == "wrong width":
        answer = _dists_draft(0, 0, (impossible,), width=WIDTH - 1)
        reason = "the draft distribution is over 299 ids, not 300"
    else:
        answer = _dists_draft(0, 0, (impossible,))
        (token,) = deliver(cloud, answer)
        assert token.msg.token is not None  # the rejection is resolved
        reason = "DraftWithDists for round 0, whose rejected position is already resolved"
    assert refusal(deliver(cloud, answer)) == (ErrorCode.PROTOCOL, reason)


# ============================================================================ activations


@pytest.mark.parametrize("shape", [(1, 3), (0, 8), (1, 1, 8)])
def test_split_activations_of_the_wrong_shape_are_refused_before_the_forward(
    shared_world: World, shape: tuple[int, ...]
) -> None:
    info = dataclasses.replace(shared_world.info, accepts_activations=True, hidden_size=8)
    cloud, actions = _cloud(shared_world, "split", info=info, prompt="")
    assert actions == []
    bad = deliver(cloud, wire.HiddenStates(1, np.zeros(shape, dtype=np.float16)))
    reason = f"activations must be [n, 8] with n >= 1, got {shape}"
    assert refusal(bad) == (ErrorCode.PROTOCOL, reason)
    cloud, _ = _cloud(shared_world, "split", info=info, prompt="")
    (good,) = deliver(cloud, wire.HiddenStates(1, np.zeros((2, 8), dtype=np.float16)))
    assert isinstance(good, Compute)


# ============================================================================ admission


def _counting_info(world: World, **limits: Any) -> Any:
    """The world's target with one prompt token per character, and the given limits."""
    return dataclasses.replace(world.info, encode=lambda text: [5] * len(text), **limits)


@pytest.mark.parametrize("method", ["naive", "ar"])
def test_an_empty_prompt_is_refused_at_the_request(shared_world: World, method: str) -> None:
    _, actions = _cloud(shared_world, method, info=_counting_info(shared_world), prompt="")
    code, reason = refusal(actions)
    assert code == ErrorCode.BAD_SETTINGS and reason.startswith("the prompt is empty")


@pytest.mark.parametrize("method", ["naive", "ar", "split"])
def test_a_prompt_over_the_context_or_the_servers_cap_is_refused_before_any_model_work(
    shared_world: World, method: str
) -> None:
    def request(prompt_tokens: int, max_new_tokens: int, **limits: Any) -> list[Any]:
        limits = {"accepts_activations": True, "hidden_size": 8, **limits}
        info = _counting_info(shared_world, **limits)
        prompt = "" if method == "split" else "p" * prompt_tokens
        cloud, actions = _cloud(
            shared_world, method, info=info, prompt=prompt, max_new_tokens=max_new_tokens
        )
        if method != "split":
            return actions
        rows = np.zeros((prompt_tokens, 8), dtype=np.float16)
        return deliver(cloud, wire.HiddenStates(1, rows))

    over = request(6, 5, context_length=10)
    reason = "the prompt's 6 tokens plus max_new_tokens=5 exceed the target's context of 10 tokens"
    assert refusal(over) == (ErrorCode.LIMIT, reason)
    assert not any(isinstance(a, Compute) for a in over)
    assert [type(a) for a in request(6, 4, context_length=10)] == [Compute]  # just fits
    capped = request(6, 1, max_prompt_tokens=5)
    assert refusal(capped) == (
        ErrorCode.LIMIT,
        "the prompt is 6 tokens, over this server's limit of 5",
    )


SETTINGS_REFUSED = [
    ({"temperature": 10**400}, "invalid setting temperature=1000"),
    ({"uhlm_eta_max": 10**400}, "invalid setting uhlm_eta_max=1000"),
    ({"top_p": 10**300}, "invalid setting top_p=1000"),
    ({"seed": "x" * 100_000}, "invalid setting seed='xxx"),
    ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, f"{MAX_STOP_STRINGS + 1} strings, at most 16"),
    ({"stop": "y" * 100_000}, "invalid setting stop='yyy"),
    ({"z" * 100_000: 1}, "unknown settings: ['zzz"),
    ({"srdv_k": wire.DEFAULT_LIMITS.max_candidates + 1}, "invalid setting srdv_k=1025"),
]


@pytest.mark.parametrize(("settings", "words"), SETTINGS_REFUSED, ids=lambda v: repr(v)[:24])
def test_absurd_settings_are_bad_settings_and_echo_at_most_80_characters_of_a_value(
    shared_world: World, settings: dict[str, Any], words: str
) -> None:
    _, actions = _cloud(shared_world, "naive", **settings)
    code, reason = refusal(actions)
    assert code == ErrorCode.BAD_SETTINGS and words in reason, reason
    assert len(reason) < 200, reason


def test_a_kilobyte_method_name_is_unsupported_and_echoed_short(shared_world: World) -> None:
    hello = dataclasses.replace(_hello(shared_world, "naive"), method="m" * 4000)
    code, reason = refusal(deliver(make_cloud(shared_world.info), hello))
    assert code == ErrorCode.UNSUPPORTED and reason.startswith("unknown method 'mmm")
    assert "m" * 80 not in reason and "…" in reason and "naive" in reason


# ============================================================================ the floor itself


class _State(enum.Enum):
    RUNNING = enum.auto()
    DONE = enum.auto()


class _Faulty(Machine):
    """A machine that finds the peer's fault while handling its own computation's result."""

    side = "cloud"

    def on_start(self) -> list[Any]:
        return [self.compute("check", None)]  # type: ignore[arg-type]

    def on_compute(self, purpose: str, result: Any) -> list[Any]:
        raise ProtocolError("the peer asked for more than it may", ErrorCode.LIMIT)


def test_a_peer_error_found_under_a_compute_done_is_blamed_on_the_peer() -> None:
    machine = _Faulty(_State.RUNNING)
    (compute,) = machine.handle(Start())
    actions = machine.handle(ComputeDone(compute.job_id, None))
    assert refusal(actions) == (ErrorCode.LIMIT, "the peer asked for more than it may")


# ============================================================================ the edge side


def _edge_with_a_draft_up(world: World, method: str, **settings: Any) -> Any:
    edge = world.edge(method, max_new_tokens=20, gamma=GAMMA, seed=4, **settings)
    actions = edge.handle(Start())
    fp = edge.fingerprints
    ack = wire.HelloAck(PROTOCOL_VERSION, fp.target_model, fp.target_tokenizer, {})
    assert deliver(edge, ack) == []
    execute = session_executor(world.draft)
    while not any(isinstance(a, Send) and isinstance(a.msg, wire.Draft) for a in actions):
        compute = next(a for a in actions if isinstance(a, Compute))
        actions = edge.handle(ComputeDone(compute.job_id, execute(compute.job)))
    return edge


def test_the_edge_blames_the_cloud_for_eos_ids_candidates_and_positions_it_cannot_use(
    shared_world: World,
) -> None:
    edge = shared_world.edge("naive", max_new_tokens=4)
    edge.handle(Start())
    fp = edge.fingerprints
    ack = wire.HelloAck(
        PROTOCOL_VERSION, fp.target_model, fp.target_tokenizer, {"eos_token_ids": "x"}
    )
    reason = "the cloud's eos_token_ids='x' are not a list of ids"
    assert refusal(deliver(edge, ack)) == (ErrorCode.PROTOCOL, reason)

    edge = _edge_with_a_draft_up(shared_world, "xcosd-e")
    outside = wire.VerifyResult(0, 0, candidates=((5000, 0.5),))
    reason = "SR-DV needs candidates within the target vocabulary [0, 300)"
    assert refusal(deliver(edge, outside)) == (ErrorCode.PROTOCOL, reason)

    edge = _edge_with_a_draft_up(shared_world, "sd")
    assert [type(a.msg) for a in deliver(edge, wire.VerifyResult(0, 1))] == [
        wire.DraftWithDists
    ]  # "send me p̃ at position 1"
    reason = "a follow-up verdict at position 0, but position 1 was rejected"
    assert refusal(deliver(edge, wire.VerifyResult(0, 0, token=3))) == (ErrorCode.PROTOCOL, reason)


# ============================================================================ over real TCP

LIMITS = ServerLimits(handshake_timeout_s=5.0, idle_timeout_s=5.0, linger_s=0.2)


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@pytest.fixture(scope="module")
def server(pair: wanspec.Pair) -> Iterator[CloudServer]:
    with BackgroundLoop("wanspec-cloud") as loop:
        cloud = CloudServer(pair.target, pair.cloud_info, port=0, limits=LIMITS)
        loop.run(cloud.start())
        try:
            yield cloud
        finally:
            loop.run(cloud.stop(), 30)


def test_a_served_target_knows_its_context_length_and_hidden_size(pair: wanspec.Pair) -> None:
    config = pair.target.config
    info = pair.cloud_info
    assert (info.context_length, info.hidden_size) == (
        config.max_position_embeddings,
        config.hidden_size,
    )
    assert info.max_prompt_tokens is None


def _tcp_cases(pair: wanspec.Pair) -> dict[str, tuple[list[Any], ErrorCode, str]]:
    fp = edge_fingerprints(pair.alignment, pair.target.fingerprint)

    def hello(method: str) -> wire.Hello:
        return wire.Hello(PROTOCOL_VERSION, "edge", method, *dataclasses.astuple(fp))

    start = wire.StartRequest(0, "hello world", {"max_new_tokens": 8, "gamma": GAMMA})
    return {
        "split activations of the wrong width": (
            [hello("split"), wire.StartRequest(0, "", {}), wire.HiddenStates(1, np.zeros((1, 3)))],
            ErrorCode.PROTOCOL,
            "activations must be [n, ",
        ),
        "a queued draft without p(x)": (
            [
                hello("naive"),
                start,
                wire.Draft(0, 0, (), (5, 6), (30000, 30000)),
                wire.Draft(1, 2, (), (7, 8), ()),
            ],
            ErrorCode.PROTOCOL,
            "draft for round 1: every drafted token needs its p(x)",
        ),
        "a prompt past the context": (
            [hello("naive"), wire.StartRequest(0, "hello " * 1100, {"max_new_tokens": 8})],
            ErrorCode.LIMIT,
            "exceed the target's context of 1024 tokens",
        ),
        # what the driver enforces, in mid-session: a header announcing 16 MiB, refused before
        # its payload; and drafts that need no answer (stale ones), sent past max_unanswered
        "a frame over the limit": (
            [hello("naive"), start, bytes([0xA0 | wire.WIRE_VERSION, 37, 0x80, 0x80, 0x80, 8])],
            ErrorCode.LIMIT,
            f"frame refused: frame of {(16 << 20) + 6} bytes exceeds the limit {LIMITS.max_frame}",
        ),
        "a flood of stale drafts": (
            [hello("naive"), start, *(wire.Draft(i, 999, (), (5,), (30000,)) for i in range(70))],
            ErrorCode.LIMIT,
            f"more than {LIMITS.max_unanswered} messages without waiting for one",
        ),
    }


async def _error_for(address: tuple[str, int], messages: list[Any]) -> wire.Error | None:
    """Send `messages` (raw bytes as they are), half-close, and return the Error answered."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(b"".join(m if isinstance(m, bytes) else wire.encode(m) for m in messages))
        writer.write_eof()
        while True:
            msg = await asyncio.wait_for(read_message(reader), 10.0)
            if isinstance(msg, wire.Error):
                return msg
    except ConnectionClosed:
        return None
    finally:
        writer.close()


@pytest.mark.parametrize(
    "case", ["split activations of the wrong width", "a queued draft without p(x)",
             "a prompt past the context", "a frame over the limit", "a flood of stale drafts"]
)  # fmt: skip
def test_over_tcp_a_peer_error_ends_with_its_code_and_no_traceback_in_the_log(
    pair: wanspec.Pair, server: CloudServer, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    messages, code, words = _tcp_cases(pair)[case]
    before = len(server.records)

    def logged() -> bool:
        return len(server.records) > before and any(
            f"session {server.records[-1].id} " in r.getMessage() for r in caplog.records
        )

    with caplog.at_level(logging.INFO, logger="wanspec"):
        error = run(_error_for(server.address, messages), timeout_s=30)
        deadline = time.monotonic() + 10
        while not logged():  # the session is logged once it has lingered
            assert time.monotonic() < deadline, "the session was not logged"
            time.sleep(0.01)
    assert error is not None and (ErrorCode(error.code), words in error.message) == (code, True)
    assert server.records[-1].outcome == f"error: {error.message}"
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_serve_takes_a_max_prompt_tokens_cap(
    tiny_pair_hetero: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from wanspec import cli
    from wanspec.net import service

    seen: list[Any] = []

    async def serve_briefly(server: Any, ready: Any = None) -> None:
        seen.append(server.info)
        async with server:
            pass

    monkeypatch.setattr(service, "serve_until_signalled", serve_briefly)
    target = str(tiny_pair_hetero[1])
    args = ["serve", "--target", target, "--port", "0", "--max-prompt-tokens", "5"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    (info,) = seen
    assert (info.max_prompt_tokens, info.context_length) == (5, 1024)
