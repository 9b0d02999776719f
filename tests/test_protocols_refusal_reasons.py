"""A speculative edge and cloud refuse a malformed peer message with the reason, exactly.

The error policy (wanspec.protocols.base) turns what the peer got wrong into an `Error` message
and a `Finish("error: …")`; the end-to-end tests only check that some error ends the run. Here a
real edge (or cloud) is brought to the state where the message arrives and the exact reason is
checked, so a bound off by one (`>` for `>=` on the accepted count, a token id equal to the
vocabulary width let through) or a check that lost its condition fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from wanspec import wire
from wanspec.models.jobs import session_executor
from wanspec.protocols.base import (
    Compute,
    ComputeDone,
    ErrorCode,
    MessageReceived,
    Send,
    Start,
)
from wanspec.protocols.registry import METHODS, make_cloud
from worlds import PROMPT_IDS, World, refusal

GAMMA = 3


def _edge_with_a_draft_up(world: World, method: str):
    """An edge past the handshake whose first draft (GAMMA tokens) is waiting for its verdict."""
    edge = world.edge(method, max_new_tokens=20, gamma=GAMMA, seed=4)
    actions = edge.handle(Start())
    fp = edge.fingerprints
    ack = wire.HelloAck(wire.WIRE_VERSION, fp.target_model, fp.target_tokenizer, {})
    assert edge.handle(MessageReceived(ack)) == []
    run = session_executor(world.draft)
    while not any(isinstance(a, Send) and isinstance(a.msg, wire.Draft) for a in actions):
        compute = next(a for a in actions if isinstance(a, Compute))
        actions = edge.handle(ComputeDone(compute.job_id, run(compute.job)))
    return edge


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (wire.VerifyResult(1, 0, token=1), "reply for round 1, but round 0 is open"),
        (wire.VerifyResult(0, GAMMA + 1, token=1), f"{GAMMA + 1} accepted of {GAMMA} drafted"),
        (wire.VerifyResult(0, GAMMA), "all tokens accepted but no bonus token"),
        (wire.VerifyResult(0, GAMMA, token=300), "token 300 is outside the target vocabulary"),
    ],
)
def test_the_edge_refuses_a_verdict_it_cannot_apply(
    shared_world: World, reply: wire.VerifyResult, reason: str
) -> None:
    edge = _edge_with_a_draft_up(shared_world, "naive")
    assert shared_world.alignment.target_width == 300
    assert refusal(edge.handle(MessageReceived(reply))) == (int(ErrorCode.PROTOCOL), reason)
    assert edge.done and edge.accepted_per_round == []


def test_the_edge_takes_a_verdict_at_the_last_valid_token_id(shared_world: World) -> None:
    """The bounds above are tight: every draft accepted plus bonus id 299 (the last) is fine."""
    edge = _edge_with_a_draft_up(shared_world, "naive")
    actions = edge.handle(MessageReceived(wire.VerifyResult(0, GAMMA, token=299)))
    emitted = [a.token_ids for a in actions if type(a).__name__ == "Emit"]
    assert len(emitted) == 1 and emitted[0][-1] == 299 and len(emitted[0]) == GAMMA + 1
    assert edge.accepted_per_round == [GAMMA] and not edge.done


def _cloud_ready(world: World, method: str):
    """A cloud past the handshake and the prompt's prefill, waiting for the first draft, and the
    executor of its target session (which holds the prefill)."""
    edge, cloud = world.machines(method, max_new_tokens=20, gamma=GAMMA)
    actions = cloud.handle(Start())
    for action in edge.handle(Start()):
        if isinstance(action, Send):  # Hello and StartRequest (the edge's draft job aside)
            actions += cloud.handle(MessageReceived(action.msg))
    run = session_executor(world.target)
    for action in actions:
        if isinstance(action, Compute):
            assert cloud.handle(ComputeDone(action.job_id, run(action.job))) == []
    return cloud, run


def _dists_draft(width: int, tokens: tuple[int, ...]) -> wire.DraftWithDists:
    counts = [0] * width
    counts[tokens[0]] = 65535
    dist = wire.Dist.from_dense(counts)
    return wire.DraftWithDists(0, 0, tokens=tokens, width=width, dist_positions=(0,), dists=(dist,))


@pytest.mark.parametrize(
    ("method", "draft", "reason"),
    [
        ("naive", wire.Draft(0, 0, (), (5, 300), (9, 9)), "draft for round 0: a token outside "
         "the target vocabulary [0, 300)"),
        ("naive", wire.Draft(0, 0, (300,), (5,), (9,)), "draft for round 0: a token outside the "
         "target vocabulary [0, 300)"),
        ("naive", wire.Draft(0, 0, (), (5, 6), (9,)), "draft for round 0: every drafted token "
         "needs its p(x)"),
        ("naive", wire.Draft(0, 0, (), (), ()), "unexpected Draft for round 0"),
        ("ul", _dists_draft(299, (5,)), "draft for round 0: distributions over 299 ids, target "
         "has 300"),
    ],
)  # fmt: skip
def test_the_cloud_refuses_a_draft_it_cannot_verify(
    shared_world: World, method: str, draft: object, reason: str
) -> None:
    cloud, _ = _cloud_ready(shared_world, method)
    assert refusal(cloud.handle(MessageReceived(draft))) == (int(ErrorCode.PROTOCOL), reason)
    assert cloud.done


def test_the_cloud_verifies_a_draft_at_the_last_valid_token_id(shared_world: World) -> None:
    cloud, _ = _cloud_ready(shared_world, "ul")
    actions = cloud.handle(MessageReceived(_dists_draft(300, (299, 5))))
    assert [type(a).__name__ for a in actions] == ["Compute"]
    assert not cloud.done


def _run_computes(machine, run, actions: list) -> list:
    """Carry out a machine's Compute actions with `run`; the actions that follow."""
    out = []
    for action in actions:
        if isinstance(action, Compute):
            out += machine.handle(ComputeDone(action.job_id, run(action.job)))
        else:
            out.append(action)
    return out


def test_sd_refuses_a_follow_up_that_is_not_the_rejected_positions_distribution(
    shared_world: World,
) -> None:
    """SD's cloud asks for p̃ of the rejected position; anything else for that round is refused
    (a draft the target cannot produce is rejected with certainty, so the round is known)."""
    shared_world.target.reset()
    impossible = int(shared_world.target.extend(PROMPT_IDS)[-1].argmin())
    shared_world.target.reset()
    cloud, run = _cloud_ready(shared_world, "sd")
    draft = wire.Draft(0, 0, (), (impossible,), (65535,))
    verdict = _run_computes(cloud, run, cloud.handle(MessageReceived(draft)))
    assert [a.msg for a in verdict] == [wire.VerifyResult(0, 0)]  # "send me p_j"
    follow_up = cloud.handle(MessageReceived(wire.CandidatesRequest(0, 1)))
    reason = "expected the draft distribution of the rejected position"
    assert refusal(follow_up) == (int(ErrorCode.PROTOCOL), reason)


# ----------------------------------------------------------------------------- the handshake


def test_the_edge_refuses_a_cloud_running_another_target_model(shared_world: World) -> None:
    edge = shared_world.edge("naive", max_new_tokens=4)
    edge.handle(Start())
    fp = edge.fingerprints
    ack = wire.HelloAck(wire.WIRE_VERSION, "another model", fp.target_tokenizer, {})
    reason = "the cloud runs a different target model"
    assert refusal(edge.handle(MessageReceived(ack))) == (int(ErrorCode.MISMATCH), reason)


def _opening(world: World, method: str, **settings) -> list:
    """The Hello and StartRequest an edge of `method` opens with."""
    edge = world.edge("naive", max_new_tokens=4)
    hello, request = [a.msg for a in edge.handle(Start()) if isinstance(a, Send)]
    return [dataclasses.replace(hello, method=method), dataclasses.replace(request, **settings)]


def test_the_cloud_refuses_bad_settings_and_a_shared_only_method_with_their_codes(
    hetero_world: World,
) -> None:
    cloud = make_cloud(hetero_world.info)
    hello, request = _opening(hetero_world, "naive", settings={"gamma": 0})
    assert cloud.handle(MessageReceived(hello))  # the HelloAck
    code, message = refusal(cloud.handle(MessageReceived(request)))
    assert code == int(ErrorCode.BAD_SETTINGS) and message.startswith("bad settings: invalid")
    hello, _ = _opening(hetero_world, "sd")
    reason = "method 'sd' needs a shared vocabulary, but the draft and target tokenizers differ"
    code_reason = refusal(make_cloud(hetero_world.info).handle(MessageReceived(hello)))
    assert code_reason == (int(ErrorCode.UNSUPPORTED), reason)


def test_the_edge_closes_the_session_saying_it_is_done(shared_world: World) -> None:
    sim, _, _ = shared_world.run("naive", trace=True, max_new_tokens=5)
    closes = [
        rec.info["msg"]
        for rec in sim.trace
        if rec.what == "send" and isinstance(rec.info["msg"], wire.Close)
    ]
    assert closes == [wire.Close("done")]


def test_the_cloud_refuses_an_unknown_method_and_another_target_with_their_codes(
    shared_world: World,
) -> None:
    hello, _ = _opening(shared_world, "nope")
    code, message = refusal(make_cloud(shared_world.info).handle(MessageReceived(hello)))
    head = "unknown method 'nope'; known methods: "
    assert code == int(ErrorCode.UNSUPPORTED) and message.startswith(head)
    assert set(METHODS) <= set(message.removeprefix(head).split(", "))
    for field in ("target_tokenizer", "target_model"):
        other = dataclasses.replace(hello, method="naive", **{field: "f" * 64})
        code, message = refusal(make_cloud(shared_world.info).handle(MessageReceived(other)))
        what = field.replace("_", " ")
        assert code == int(ErrorCode.MISMATCH), field
        assert message.startswith(f"the edge expects {what} ffffffffffff, this cloud runs ")


def test_a_reply_of_another_methods_kind_at_a_rejection_is_refused(shared_world: World) -> None:
    """SR-DV's edge, having rejected the cloud's only candidate, asks for more; an O-token (HR's
    answer) is a message its state accepts for some method, not for this one: refused as the
    peer's mistake, never read as if it were a candidate set."""
    edge = _edge_with_a_draft_up(shared_world, "xcosd-e")
    drafted = edge.round.tokens[1]  # p̃ > 0 there, so a candidate with q ≈ 0 is rejected
    first = wire.VerifyResult(0, 1, candidates=((drafted, 1e-12),))
    asked = edge.handle(MessageReceived(first))
    assert any(isinstance(a, Send) and isinstance(a.msg, wire.CandidatesRequest) for a in asked)
    reason = "srdv: unexpected OToken at a rejection"
    refused = refusal(edge.handle(MessageReceived(wire.OToken(0, 5, "x"))))
    assert refused == (int(ErrorCode.PROTOCOL), reason)
