"""deepspec-tree: deepspec whose tree's branches go to the cloud as forks.

The cloud resolves a rejection itself (UL: p̃ travels with the chain) and verifies at once the
fork whose round and token that verdict left last in the output; every other fork of that round
is stale. A chain the edge sent without its p̃ (a plain Draft) is resolved as in deepspec: q̂
comes down and the edge draws the token. Here the cloud is driven with messages (through the
codec) on a pair with one next-token law, so which token the cloud draws is known in advance
where it matters. The law:
tests/test_protocols_pooled_law.py; tokens against the link, depth and budget:
tests/test_pipeline.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from wanspec import wire
from wanspec.protocols.base import ComputeDone, ErrorCode
from worlds import FixedLaw, World, deliver, refusal

A, B, C, D = 65, 66, 67, 68  # 'a' … 'd'; the target: 3:2:1 on a, b, c, never d


@pytest.fixture(scope="module")
def world() -> World:
    world = World(shared=True)
    width = world.alignment.target_width
    law = ((A, 3 / 6), (B, 2 / 6), (C, 1 / 6))
    return world.with_models(FixedLaw(0.0, width, law=law), FixedLaw(0.0, width, law=law))


def _chain(world: World, rnd: int, base: int, tokens: tuple, **fields: Any) -> wire.DraftWithDists:
    """A chain whose p̃ at each position puts 1 − ε on its token and ε on 'c'."""
    width = world.alignment.target_width
    dists = []
    for token in tokens:
        counts = np.zeros(width, dtype=np.int64)
        counts[C] = 1
        counts[token] += 65534
        dists.append(wire.Dist.from_dense(counts))
    positions = tuple(range(len(tokens)))
    return wire.DraftWithDists(rnd, base, (), tokens, (), width, positions, tuple(dists), **fields)


def _sure_chain(world: World) -> wire.DraftWithDists:
    """Round 0: 'a' with p̃('a') tiny, so it is accepted whatever the coin."""
    width = world.alignment.target_width
    counts = np.zeros(width, dtype=np.int64)
    counts[[A, B, C, D]] = (1, 1, 1, 65532)
    return wire.DraftWithDists(0, 0, (), (A,), (), width, (0,), (wire.Dist.from_dense(counts),))


def _done(cloud: Any, run: Any, verify: Any) -> list[Any]:
    return cloud.handle(ComputeDone(verify.job_id, run(verify.job)))


def test_the_fork_a_rejection_drew_is_verified_at_once_and_the_others_are_stale(
    world: World,
) -> None:
    """Chain 0 drafts 'd', which the target never gives: rejected, and the cloud draws one of
    a, b, c. Of the forks queued behind it (one per token, and a continuation that assumed 'd'),
    the one the cloud drew is verified right after the verdict; the rest are dropped."""
    cloud, run = world.ready_cloud("deepspec-tree", max_new_tokens=20, gamma=2)
    (verify,) = deliver(cloud, _chain(world, 0, 0, (D, A)))
    forks = {t: _chain(world, r, 1, (A,), fork=(0, t)) for r, t in ((1, A), (2, B), (3, C))}
    assert deliver(cloud, _chain(world, 4, 2, (A,), fork=(0, A))) == []  # after 'd', 'a'
    for fork in forks.values():
        assert deliver(cloud, fork) == []  # all wait behind chain 0
    verdict, verify = _done(cloud, run, verify)
    assert verdict.msg.round == 0 and verdict.msg.accepted == 0 and verdict.msg.token in forks
    drawn = verdict.msg.token
    (reply, *_) = _done(cloud, run, verify)
    assert reply.msg.round == forks[drawn].round
    assert cloud.inner.counters["stale_drafts"] == 3  # the continuation, two other forks


def test_a_continuation_is_verified_after_a_full_acceptance_and_a_branch_is_not(
    world: World,
) -> None:
    """A chain accepted whole leaves its last token last in the output: the fork naming it (the
    tree's continuation) is verified; one naming another token at the same base is stale."""
    cloud, run = world.ready_cloud("deepspec-tree", max_new_tokens=20, gamma=2)
    (verify,) = deliver(cloud, _sure_chain(world))
    assert deliver(cloud, _chain(world, 1, 1, (B,), fork=(0, B))) == []
    assert deliver(cloud, _chain(world, 2, 1, (B,), fork=(0, A))) == []
    verdict, verify = _done(cloud, run, verify)
    assert (verdict.msg.round, verdict.msg.accepted, verdict.msg.token) == (0, 1, None)
    (reply,) = _done(cloud, run, verify)
    assert reply.msg.round == 2 and cloud.inner.counters["stale_drafts"] == 1


def _plain(rnd: int, base: int, tokens: tuple, **fields: Any) -> wire.Draft:
    """A chain sent without its p̃: p̃(x) = 1/2 for each token."""
    return wire.Draft(rnd, base, tokens=tokens, probs=(32768,) * len(tokens), **fields)


def test_a_chain_without_its_dists_is_resolved_on_the_edge(world: World) -> None:
    """A plain chain's rejection ships q̂ (the residual downlink) and appends nothing: the
    edge draws the token, so every fork at the next position is stale, and the next chain
    brings the edge's token as committed. UL's cloud would have drawn it itself."""
    cloud, run = world.ready_cloud("deepspec-tree", max_new_tokens=20, gamma=2)
    (verify,) = deliver(cloud, _plain(0, 0, (D, A)))
    assert deliver(cloud, _chain(world, 1, 1, (A,), fork=(0, A))) == []
    (verdict,) = _done(cloud, run, verify)  # nothing more to verify: the fork was stale
    msg = verdict.msg
    assert (msg.round, msg.accepted, msg.token) == (0, 0, None)
    assert msg.dist is not None and msg.dist.width == world.alignment.target_width
    assert cloud.inner.output == []
    assert cloud.inner.counters["stale_drafts"] == 1
    nxt = _chain(world, 2, 0, (A,))  # the edge drew 'b': it goes up with the next chain
    nxt = wire.DraftWithDists(2, 0, (B,), nxt.tokens, (), nxt.width, (0,), nxt.dists)
    (verify,) = deliver(cloud, nxt)
    (verdict,) = _done(cloud, run, verify)
    assert cloud.inner.output[:1] == [B] and verdict.msg.round == 2


def test_a_plain_chain_sent_ahead_follows_only_a_chain_accepted_whole(world: World) -> None:
    """Without its p̃ a chain sent ahead names the chain it continues as the round before it
    (`ahead`): verified after that round was accepted whole, stale after a rejection at its
    last position, where UL's cloud appended a token of its own."""
    cloud, run = world.ready_cloud("deepspec-tree", max_new_tokens=20, gamma=2)
    (verify,) = deliver(cloud, _sure_chain(world))
    assert deliver(cloud, _plain(1, 1, (D,), ahead=True)) == []
    verdict, verify = _done(cloud, run, verify)
    assert (verdict.msg.accepted, verdict.msg.token) == (1, None)  # accepted whole
    verdict, *_ = _done(cloud, run, verify)
    assert verdict.msg.round == 1 and verdict.msg.accepted == 0  # 'd' rejected: verified
    assert cloud.inner.counters.get("stale_drafts", 0) == 0
    cloud, run = world.ready_cloud("deepspec-tree", max_new_tokens=20, gamma=2)
    (verify,) = deliver(cloud, _chain(world, 0, 0, (D,)))  # rejected; the cloud draws a token
    assert deliver(cloud, _plain(1, 1, (A,), ahead=True)) == []
    (verdict,) = _done(cloud, run, verify)
    assert verdict.msg.token is not None and len(cloud.inner.output) == 1
    assert cloud.inner.counters["stale_drafts"] == 1


@pytest.mark.parametrize(
    ("method", "fork", "committed", "base", "reason"),
    [
        ("deepspec-tree", (3, A), (), 1, "a fork continues an earlier round and commits nothing"),
        ("deepspec-tree", (0, A), (B,), 1, "a fork continues an earlier round and commits nothing"),
        ("deepspec-tree", (0, A), (), 0, "a fork continues an earlier round and commits nothing"),
        ("ul", (0, A), (), 1, "it is a fork, but this method sends no chain before a verdict"),
    ],
)
def test_a_malformed_fork_is_refused(
    world: World, method: str, fork: tuple, committed: tuple, base: int, reason: str
) -> None:
    """A fork naming its own or a later round, committing tokens or starting the output, or
    sent to a method whose cloud verifies one chain at a time, ends the session by name."""
    cloud, _ = world.ready_cloud(method, max_new_tokens=20, gamma=2)
    msg = _chain(world, 3, base, (A,), fork=fork)
    if committed:
        msg = wire.DraftWithDists(
            3, base, committed, msg.tokens, (), msg.width, msg.dist_positions, msg.dists, fork
        )
    assert refusal(deliver(cloud, msg)) == (ErrorCode.PROTOCOL, f"draft for round 3: {reason}")
