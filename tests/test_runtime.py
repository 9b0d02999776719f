"""`wanspec.runtime.SideRuntime` on its own: what both drivers rely on it to keep."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wanspec.jobs import Forward
from wanspec.protocols.base import Cancel, Compute, Emit, Finish, Purpose, Send
from wanspec.runtime import EmitRecord, SideRuntime, TypeTally, job_label


@dataclass(frozen=True)
class Ping:
    k: int


@dataclass(frozen=True)
class Pong:
    k: int


def _compute(job_id: int, label: str = Purpose.VERIFY) -> Compute:
    return Compute(job_id, Forward(0, (1, 2, 3)), label)


def test_jobs_start_in_the_order_they_were_queued() -> None:
    side = SideRuntime("cloud")
    for job_id in (4, 2, 7):
        side.apply(_compute(job_id), now=float(job_id))
    assert [q.at for q in side.queue] == [4.0, 2.0, 7.0]
    started = []
    while side.queue:
        action = side.start_next()
        started.append(action.job_id)
        assert side.end_job(action.job_id)
    assert started == [4, 2, 7]


def test_cancelling_a_queued_job_drops_it_and_leaves_the_running_one_alone() -> None:
    side = SideRuntime("edge")
    side.apply(_compute(0), 0.0)
    side.apply(_compute(1), 0.0)
    side.apply(_compute(2), 0.0)
    assert side.start_next().job_id == 0
    side.apply(Cancel(1), 0.5)
    assert [q.action.job_id for q in side.queue] == [2]
    assert side.end_job(0)  # the running job was not the one cancelled: its result counts
    assert side.start_next().job_id == 2


def test_the_result_of_a_job_cancelled_while_it_ran_is_dropped_once() -> None:
    side = SideRuntime("edge")
    side.apply(_compute(0), 0.0)
    side.apply(_compute(1), 0.0)
    side.start_next()
    side.apply(Cancel(0), 0.1)
    assert [q.action.job_id for q in side.queue] == [1]  # the queue is untouched
    assert not side.end_job(0)
    assert side.start_next().job_id == 1
    assert side.end_job(1)  # the next job's result is wanted again


def test_cancelling_a_job_that_is_neither_queued_nor_running_changes_nothing() -> None:
    side = SideRuntime("edge")
    side.apply(_compute(0), 0.0)
    side.start_next()
    assert side.end_job(0)
    side.apply(_compute(1), 0.0)
    side.apply(Cancel(0), 0.0)  # already over (its ComputeDone may still be on its way)
    assert [q.action.job_id for q in side.queue] == [1]
    assert side.start_next().job_id == 1
    assert side.end_job(1)


def test_awaiting_results_counts_queued_and_wanted_running_jobs_only() -> None:
    side = SideRuntime("cloud")
    assert not side.awaiting_results
    side.apply(_compute(0), 0.0)
    assert side.awaiting_results
    side.start_next()
    assert side.awaiting_results
    side.apply(Cancel(0), 0.0)
    assert not side.awaiting_results  # running, but nobody waits for its result
    side.end_job(0)
    assert not side.awaiting_results


def test_a_job_cannot_start_while_another_runs_nor_end_under_another_id() -> None:
    side = SideRuntime("edge")
    side.apply(_compute(0), 0.0)
    side.apply(_compute(1), 0.0)
    side.start_next()
    with pytest.raises(RuntimeError, match="while job 0 runs"):
        side.start_next()
    with pytest.raises(RuntimeError, match="ends job 1"):
        side.end_job(1)


def test_send_hands_the_message_back_and_records_nothing_else() -> None:
    side = SideRuntime("edge")
    msg = Ping(1)
    assert side.apply(Send(msg), 0.0) is msg
    assert side.apply(Emit((5,)), 0.0) is None
    assert not side.queue and side.sent.messages == {}


def test_emits_keep_their_time_side_and_int_tokens_and_finish_is_recorded() -> None:
    side = SideRuntime("edge")
    side.apply(Emit((3, 4)), 1.5)
    side.apply(Emit([5]), 2.0)
    assert side.finish is None
    side.apply(Finish("length"), 2.5)
    assert side.emits == [EmitRecord(1.5, "edge", (3, 4)), EmitRecord(2.0, "edge", (5,))]
    assert all(type(t) is int for e in side.emits for t in e.token_ids)
    assert side.finish == "length"


def test_shared_emits_keep_the_order_of_both_sides() -> None:
    emits: list[EmitRecord] = []
    edge, cloud = SideRuntime("edge", emits=emits), SideRuntime("cloud", emits=emits)
    edge.apply(Emit((1,)), 1.0)
    cloud.apply(Emit((2,)), 1.0)
    edge.apply(Emit((3,)), 1.0)
    assert [(e.side, e.token_ids) for e in emits] == [
        ("edge", (1,)),
        ("cloud", (2,)),
        ("edge", (3,)),
    ]


def test_trace_is_told_each_cancel_emit_and_finish() -> None:
    steps: list[tuple[str, dict]] = []
    side = SideRuntime("cloud", trace=lambda what, **info: steps.append((what, info)))
    side.apply(_compute(0), 0.0)
    side.apply(Send(Ping(0)), 0.0)
    side.apply(Cancel(0), 0.0)
    side.apply(Emit((9,)), 0.0)
    side.apply(Finish("eos"), 0.0)
    assert steps == [
        ("cancel", {"job_id": 0}),
        ("emit", {"token_ids": (9,)}),
        ("finish", {"reason": "eos"}),
    ]


def test_an_unknown_action_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="edge returned an unknown action"):
        SideRuntime("edge").apply("draft", 0.0)


def test_tally_counts_messages_and_bits_by_type_in_first_seen_order() -> None:
    tally = TypeTally()
    assert tally.add(Pong(1), 16) == "Pong"
    tally.add(Ping(1), 8)
    tally.add(Pong(2), 24)
    assert tally.messages == {"Pong": 2, "Ping": 1}
    assert tally.bits == {"Pong": 40, "Ping": 8}
    assert list(tally.pairs().items()) == [("Pong", (2, 40)), ("Ping", (1, 8))]


def test_merged_tallies_add_up_by_type_with_the_first_ones_types_first() -> None:
    sent, received = TypeTally(), TypeTally()
    sent.add(Ping(1), 8)
    received.add(Pong(1), 16)
    received.add(Ping(2), 24)
    both = sent.merged(received)
    assert list(both.pairs().items()) == [("Ping", (2, 32)), ("Pong", (1, 16))]
    assert sent.pairs() == {"Ping": (1, 8)}  # the operands are left as they were


def test_charge_tallies_seconds_by_label_and_counts_jobs_not_pieces() -> None:
    side = SideRuntime("cloud")
    side.charge("prefill", 0.25, job=False)  # a long prefill's piece
    side.charge("prefill", 0.5)
    side.charge("verify", 0.125)
    assert side.busy_s == 0.875
    assert side.compute_s == {"prefill": 0.75, "verify": 0.125}
    assert side.computes == {"prefill": 1, "verify": 1}
    assert side.jobs_run == 2


def test_a_job_is_labelled_by_its_purpose_or_else_its_job_type() -> None:
    assert job_label(_compute(0, Purpose.DRAFT)) == "draft"
    assert job_label(Compute(0, Forward(0, (1,)))) == "Forward"
