"""deepspec-x: acespec-x with chains in flight, and the `ahead` rule that keeps it exact.

SR-DV's fallback is drawn on the cloud, which appends that token: after a chain rejected at its
last position and resolved so, the cloud's output is exactly as long as the base of the chain
sent ahead of it, which assumed the drafted token there. The cloud must drop that chain all the
same: a chain marked `ahead` is verified only after the round before it was accepted whole.
Here the cloud is driven with messages (through the codec), and on the simulator deepspec-x
gives acespec-x's very tokens. Its pooled law: tests/test_protocols_pooled_law.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from wanspec import wire
from wanspec.protocols.base import ComputeDone, ErrorCode
from wanspec.sim import Link
from worlds import PROMPT_IDS, AheadTally, FixedLaw, World, deliver, refusal

GAMMA = 2
UNLIKELY = 1  # p̃(x) as a count of 2^16 − 1: any token the target can produce is accepted


@pytest.fixture(scope="module")
def skewed_world() -> World:
    """The pooled-law tests' different-vocabulary pair (tests/test_protocols_pooled_law.py):
    i.i.d. q = 3:2:1 on 'a', 'b' and the LLM-only 'ĠĠ'; the draft 0.4 / 0.2 on 'a', 'b', 0.15 on
    'c' and 'd', 0.1 on a draft-only token. Chains are often accepted whole, and SR-DV with
    K = M = 1 often falls back on the cloud (a candidate 'a' passes the edge with odds 1/9)."""
    world = World(shared=False)
    align = world.alignment
    a, b, c, d, o_token, draft_only = 65, 66, 67, 68, 286, 154
    draft = {
        int(align.target_to_draft[t]): p for t, p in ((a, 0.4), (b, 0.2), (c, 0.15), (d, 0.15))
    }
    return world.with_models(
        FixedLaw(0.0, align.target_width, law=((a, 3 / 6), (b, 2 / 6), (o_token, 1 / 6))),
        FixedLaw(0.0, align.draft_width, law=(*draft.items(), (draft_only, 0.1))),
    )


def _cloud_ready(world: World, **settings: Any) -> tuple:
    """A deepspec-x cloud waiting for the first draft (`World.ready_cloud`)."""
    return world.ready_cloud("deepspec-x", max_new_tokens=20, gamma=GAMMA, **settings)


def _target_q(world: World, context: list[int]) -> np.ndarray:
    world.target.reset()
    logits = world.target.extend([*PROMPT_IDS, *context])[-1].numpy()
    world.target.reset()
    return logits


def _likely(world: World, context: list[int]) -> int:
    """The common token the target likes best after `context`: drafted as unlikely, accepted."""
    logits, common = _target_q(world, context), world.alignment.common_target_ids
    return int(common[np.argmax(logits[common])])


def _impossible(world: World, context: list[int]) -> int:
    """A common token the target cannot produce after `context`: a draft of it is rejected."""
    logits, common = _target_q(world, context), world.alignment.common_target_ids
    return int(common[np.argmin(logits[common])])


def _verify(cloud: Any, run: Any, msg: wire.Draft) -> wire.VerifyResult:
    """Deliver a draft the cloud verifies at once; its verdict."""
    (verify,) = deliver(cloud, msg)
    (reply,) = cloud.handle(ComputeDone(verify.job_id, run(verify.job)))
    return reply.msg


def _fallback(world: World, rnd: int, token: int) -> wire.DraftWithDists:
    """SR-DV's fallback request: p̃ of the rejected position (all on the rejected token)."""
    width = world.alignment.target_width
    counts = np.zeros(width, dtype=np.int64)
    counts[token] = 65535
    dist = wire.Dist.from_dense(counts)
    return wire.DraftWithDists(rnd, 0, (), (token,), (), width, (0,), (dist,))


def test_a_chain_sent_ahead_is_stale_after_a_fallback_at_the_last_position(
    hetero_world: World,
) -> None:
    """Chain 0 (base 0, γ = 2) is rejected at its last position and the cloud draws SR-DV's
    fallback there: its output is 2 tokens long, the base of chain 1 sent ahead, which assumed
    chain 0's last token. It is dropped; the chain the edge sends after the verdict is verified."""
    cloud, run = _cloud_ready(hetero_world, srdv_k=1, srdv_m=1)
    first = _likely(hetero_world, [])
    rejected = _impossible(hetero_world, [first])
    verdict = _verify(cloud, run, wire.Draft(0, 0, (), (first, rejected), (UNLIKELY, 65535)))
    assert verdict.accepted == 1 and verdict.candidates is not None
    (fallback,) = deliver(cloud, _fallback(hetero_world, 0, rejected))
    assert fallback.msg.token is not None
    assert len(cloud.inner.output) == GAMMA  # the stale chain's base
    stale = wire.Draft(1, GAMMA, (), (first,), (65535,), ahead=True)
    assert deliver(cloud, stale) == []  # dropped, not verified
    assert cloud.inner.counters["stale_drafts"] == 1
    after = _likely(hetero_world, [first, fallback.msg.token])
    verdict = _verify(cloud, run, wire.Draft(2, GAMMA, (), (after,), (UNLIKELY,)))
    assert verdict.round == 2 and verdict.accepted == 1


@pytest.mark.parametrize("queued", [False, True])
def test_a_chain_sent_ahead_is_verified_after_a_full_acceptance(
    hetero_world: World, queued: bool
) -> None:
    """Chain 1 sent ahead is verified once chain 0 is accepted whole, whether it arrived after
    the verdict or waited at the cloud behind chain 0."""
    cloud, run = _cloud_ready(hetero_world)
    chain = [_likely(hetero_world, [])]
    chain.append(_likely(hetero_world, chain))
    ahead = wire.Draft(1, GAMMA, (), (_likely(hetero_world, chain),), (UNLIKELY,), ahead=True)
    (verify,) = deliver(cloud, wire.Draft(0, 0, (), tuple(chain), (UNLIKELY, UNLIKELY)))
    if queued:
        assert deliver(cloud, ahead) == []  # waits behind chain 0
    actions = cloud.handle(ComputeDone(verify.job_id, run(verify.job)))
    assert actions[0].msg == wire.VerifyResult(0, GAMMA)  # whole, no bonus token
    if not queued:
        assert actions[1:] == []
        actions = [None, *deliver(cloud, ahead)]
    (_, verify) = actions
    (reply,) = cloud.handle(ComputeDone(verify.job_id, run(verify.job)))
    assert reply.msg.round == 1 and reply.msg.accepted == 1
    assert cloud.inner.counters.get("stale_drafts", 0) == 0


def test_a_chain_sent_ahead_of_a_round_not_verified_last_is_stale(hetero_world: World) -> None:
    """The base matches, but the round named before it is not the last verified: stale, and
    so is one naming no round the cloud ever saw (a hostile edge's)."""
    cloud, run = _cloud_ready(hetero_world)
    chain = (_likely(hetero_world, []),)
    assert _verify(cloud, run, wire.Draft(0, 0, (), chain, (UNLIKELY,))).accepted == 1
    nxt = (_likely(hetero_world, list(chain)),)
    for rnd in (5, 2**63 - 1):
        assert deliver(cloud, wire.Draft(rnd, 1, (), nxt, (UNLIKELY,), ahead=True)) == []
    assert cloud.inner.counters["stale_drafts"] == 2
    assert _verify(cloud, run, wire.Draft(1, 1, (), nxt, (UNLIKELY,), ahead=True)).accepted == 1


@pytest.mark.parametrize(
    ("draft", "reason"),
    [
        (
            wire.Draft(0, 0, (), (5,), (9,), ahead=True),
            "it is sent ahead but has no round before it",
        ),
        (
            wire.Draft(1, 0, (7,), (5,), (9,), ahead=True),
            "it is sent ahead but has committed tokens",
        ),
    ],
)
def test_a_malformed_chain_sent_ahead_is_refused(
    hetero_world: World, draft: wire.Draft, reason: str
) -> None:
    cloud, _ = _cloud_ready(hetero_world)
    assert refusal(deliver(cloud, draft)) == (
        ErrorCode.PROTOCOL,
        f"draft for round {draft.round}: {reason}",
    )


def _fallbacks_at_the_last_position(edge: Any) -> list[int]:
    """Count, in the list returned, the rejections the cloud resolved (SR-DV's fallback) at the
    last position of a chain while chains sent ahead of it were in flight."""
    seen, finish_round = [0], edge.finish_round

    def spy(rnd: Any, accepted: int, token: int, *, decided_by_edge: bool) -> Any:
        if not decided_by_edge and accepted == len(rnd.tokens) - 1 and edge.ahead:
            seen[0] += 1
        return finish_round(rnd, accepted, token, decided_by_edge=decided_by_edge)

    edge.finish_round = spy
    return seen


@pytest.mark.parametrize(
    ("rtt_s", "gamma", "chains"), [(0.02, 2, 2), (0.15, 3, 2), (0.3, 2, 3), (0.15, 1, 3)]
)
def test_deepspec_x_gives_acespec_xs_tokens_with_chains_sent_ahead(
    skewed_world: World, rtt_s: float, gamma: int, chains: int
) -> None:
    """A chain sent before the verdict is the chain acespec-x sends after it, so a seed gives
    the same tokens; edge and cloud agree on which chains went stale, both outcomes of a chain
    sent ahead occur, and SR-DV's fallback was drawn on the cloud at the last position of a
    chain with chains in flight behind it (the case the `ahead` rule is there for)."""
    link = Link(bandwidth_bps=1e7, rtt_s=rtt_s)
    tally, at_last = AheadTally(), 0
    for seed in range(3):
        settings = dict(
            seed=seed, max_new_tokens=40, temperature=1.0, gamma=gamma, srdv_k=1, srdv_m=1
        )
        ace, _, _ = skewed_world.run("acespec-x", link=link, **settings)
        edge, cloud = skewed_world.machines("deepspec-x", chains_in_flight=chains, **settings)
        fallbacks = _fallbacks_at_the_last_position(edge)
        deep = skewed_world.simulate(edge, cloud, link)
        assert deep.tokens == ace.tokens
        at_last += fallbacks[0]
        tally.add(edge, cloud)
    tally.check(chains)
    assert at_last > 0  # a fallback on the cloud at a chain's last position, chains ahead
