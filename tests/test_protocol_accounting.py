"""What a run reports, checked against what the run did: its own messages, tokens and stops.

Each stat (rounds, accepted per round, acceptance rate, bits and messages by type, SR-DV
candidate rounds) is recomputed here from the simulator's trace of sent messages, so a counter
that counts the wrong thing (the bonus token as accepted, one candidate round too many, a message
type billed to the wrong key) fails. EOS gets a world of its own: a synthetic target whose EOS id
is a token it really produces, so "stop at EOS" and `ignore_eos` are both exercised.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import pytest

from wanspec import wire
from wanspec.api import _stats
from wanspec.protocols.registry import METHODS
from worlds import PROMPT_IDS, World

SPECULATIVE = [name for name, m in METHODS.items() if m.family in ("speculative", "pipeline")]
HETERO = [name for name in SPECULATIVE if not METHODS[name].shared_vocab_only]
DRAFTS = (wire.Draft, wire.DraftWithDists)


def _sent(sim) -> list[tuple[str, object]]:
    return [(rec.side, rec.info["msg"]) for rec in sim.trace if rec.what == "send"]


def _run(world: World, method: str, **settings):
    sim, edge, cloud = world.run(method, trace=True, **settings)
    return sim, _stats(method, sim, edge, cloud)


# ----------------------------------------------------------------------------- counters


@pytest.mark.parametrize("method", HETERO)
def test_bits_and_messages_by_type_are_the_encoded_messages(hetero_world: World, method: str):
    sim, stats = _run(hetero_world, method, max_new_tokens=13, seed=11, temperature=1.2)
    bits: Counter = Counter()
    count: Counter = Counter()
    for _, msg in _sent(sim):
        bits[type(msg).__name__] += 8 * len(wire.encode(msg))
        count[type(msg).__name__] += 1
    assert stats["bits_by_type"] == dict(bits)
    assert dict(sim.messages_by_type) == dict(count)
    ups = sum(1 for side, _ in _sent(sim) if side == "edge")
    assert (stats["uplink_messages"], stats["downlink_messages"]) == (ups, len(_sent(sim)) - ups)


@pytest.mark.parametrize("method", [m for m in HETERO if METHODS[m].family == "speculative"])
@pytest.mark.parametrize("seed", [1, 2])
def test_rounds_and_acceptance_are_counted_from_the_verdicts(
    hetero_world: World, method: str, seed: int
) -> None:
    """One draft per round; accepted per round = the cloud's verdict; the bonus is not accepted."""
    gamma = 3
    sim, stats = _run(hetero_world, method, max_new_tokens=17, seed=seed, gamma=gamma)
    drafts = [m for side, m in _sent(sim) if side == "edge" and isinstance(m, DRAFTS)]
    verdicts = {m.round: m.accepted for side, m in _sent(sim) if isinstance(m, wire.VerifyResult)}
    assert stats["rounds"] == len(drafts) == len({d.round for d in drafts})
    assert all(len(d.tokens) == gamma for d in drafts)
    assert stats["accepted_per_round"] == [verdicts[d.round] for d in drafts]
    accepted = sum(stats["accepted_per_round"])
    assert stats["acceptance_rate"] == accepted / (gamma * len(drafts))
    # every round commits its accepted drafts plus exactly one token of the cloud's law; only
    # the last may be cut by max_new_tokens
    committed = accepted + len(drafts)
    assert committed - gamma <= stats["new_tokens"] == 17 <= committed


@pytest.mark.parametrize("method", SPECULATIVE)
def test_rounds_are_numbered_one_after_another(
    hetero_world: World, shared_world: World, method: str
) -> None:
    """Replies name their round, so the edge numbers its rounds 0, 1, 2…: a pipeline's round
    taken from its tree on a cache hit included (the seed gives each pipeline hits)."""
    world = shared_world if METHODS[method].shared_vocab_only else hetero_world
    settings = dict(max_new_tokens=20, seed=2, gamma=1, temperature=1.0, srdv_k=2)
    sim, edge, _ = world.run(method, trace=True, **settings)
    sent = [m.round for side, m in _sent(sim) if side == "edge" and isinstance(m, DRAFTS)]
    rounds = list(dict.fromkeys(sent))  # SD follows a rejection up with the same round's dists
    assert rounds == list(range(len(rounds))) and len(rounds) > 3
    if METHODS[method].family == "pipeline":
        assert edge.counters.get("cache_hits", 0) > 0


@pytest.mark.parametrize("m", [1, 2, 3])
def test_srdv_candidate_rounds_never_exceed_m(m: int) -> None:
    """X-CoSD-E asks for at most M candidate sets per rejection, then falls back once.

    The shared world's draft is α·q plus mass off q's support, so a candidate y ~ q is accepted
    with probability 1 − α = 0.4 only: M rounds are often used up and the bound is exercised."""
    world = World(shared=True)
    most = 0
    fallbacks = rounds_counted = 0
    for seed in range(6):
        sim, stats = _run(
            world, "xcosd-e", max_new_tokens=12, seed=seed, temperature=1.0,
            srdv_k=1, srdv_m=m,
        )  # fmt: skip
        per_round: Counter = Counter()
        for _, msg in _sent(sim):
            if isinstance(msg, wire.Candidates) or (
                isinstance(msg, wire.VerifyResult) and msg.candidates is not None
            ):
                per_round[msg.round] += 1
        assert stats.get("srdv_candidate_rounds", 0) == sum(per_round.values())
        assert max(per_round.values(), default=0) <= m
        most = max(most, *per_round.values())
        fallbacks += stats.get("srdv_fallbacks", 0)
        rounds_counted += sum(1 for n in per_round.values() if n == m)
    assert most == m  # rounds that used up all M happened
    assert 0 < fallbacks <= rounds_counted


# ----------------------------------------------------------------------------- EOS


def _with_eos(world: World, eos: int) -> World:
    """The same world whose target declares `eos` its end-of-sequence id (same weights)."""
    target = dataclasses.replace(world.target.spec, eos_token_ids=(eos,))
    return copy.copy(world).with_models(target, world.draft.spec)


@pytest.mark.parametrize("method", [*HETERO, "ar"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_stops_at_eos_and_ignore_eos_goes_on(
    hetero_world: World, method: str, temperature: float
) -> None:
    free, _, _ = hetero_world.run(method, max_new_tokens=14, seed=4, temperature=temperature)
    eos = free.tokens[4]  # a token this very run produces: EOS is reached
    first = free.tokens.index(eos)
    world = _with_eos(hetero_world, eos)
    stopped, _, _ = world.run(method, max_new_tokens=14, seed=4, temperature=temperature)
    assert stopped.finish_reason == "eos"
    assert stopped.tokens == free.tokens[: first + 1]  # EOS included, nothing after it
    ignoring, _, _ = world.run(
        method, max_new_tokens=14, seed=4, temperature=temperature, ignore_eos=True
    )
    assert ignoring.finish_reason == "length"
    assert ignoring.tokens == free.tokens


# ----------------------------------------------------------------------------- lossy baselines


def _target_argmax(world: World, context: list[int]) -> int:
    world.target.reset()
    return int(world.target.extend([*PROMPT_IDS, *context])[-1].argmax())


@pytest.mark.parametrize("seed", range(4))
def test_greedy_replacement_is_the_targets_argmax_at_every_rejection(seed: int) -> None:
    """GR's own law, two-sided: a rejection's replacement is exactly argmax q, and only there."""
    world = World(shared=True)
    gamma = 3
    sim, stats = _run(world, "gr", max_new_tokens=30, seed=seed, gamma=gamma, temperature=1.0)
    start, replaced = 0, 0
    for accepted in stats["accepted_per_round"]:
        at = start + accepted
        if at >= len(sim.tokens):
            break
        if accepted < gamma:
            assert sim.tokens[at] == _target_argmax(world, sim.tokens[:at])
            replaced += 1
        start = at + 1
    assert replaced >= 3  # rejections happened, so the check above ran


# ----------------------------------------------------------------------------- acceptance law


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["sd", "xcosd", "xcosd-e"])
def test_accepted_per_round_follows_the_geometric_law(method: str) -> None:
    """The shared synthetic draft overlaps q by exactly α at every position, so a round accepts
    k < γ drafts with probability α^k (1 − α) and all γ with α^γ: a χ² test over the machines'
    own verdicts catches a wrong acceptance ratio (p/q for q/p), a test that goes on after a
    rejection, or a bonus counted as accepted."""
    world, gamma, alpha = World(shared=True), 3, 0.6
    hist: Counter = Counter()
    for seed in range(100):
        _, stats = _run(world, method, max_new_tokens=16, seed=seed, gamma=gamma)
        hist.update(stats["accepted_per_round"])
    law = [alpha**k * (1 - alpha) for k in range(gamma)] + [alpha**gamma]
    n = sum(hist.values())
    chi2 = sum((hist[k] - n * p) ** 2 / (n * p) for k, p in enumerate(law))
    assert set(hist) <= set(range(gamma + 1))
    assert chi2 < 16.3  # χ²(3) at p = 0.001


def test_requested_o_sample_path_keeps_the_target_law() -> None:
    """HR without the piggybacked O-sample: the edge asks for it (ResampleRequest) when it picks
    region O; the first token's law must still be the target's. That law is enumerated exactly
    (tests/test_protocols_exact_law.py, `piggyback=False`); here the request path runs on the
    real random streams (about 2 runs in 3 ask) and a gross error shows: 500 runs keep the TV of
    a correct law (5 outcomes) under 0.095 with probability 1 − 10⁻⁴ (simulated draws), so a
    law at TV ≥ 0.2 from the target's fails the bound 0.1 with the same odds."""
    world, samples = World(shared=False), 500
    law = world.exact_joint(1, temperature=1.5)
    emp: Counter = Counter()
    requests = 0
    for seed in range(samples):
        sim, edge, _ = world.run(
            "xcosd", seed=seed, max_new_tokens=1, gamma=2, temperature=1.5, hr_piggyback=False
        )
        emp[tuple(sim.tokens[:1])] += 1
        requests += edge.counters.get("hr_o_requests", 0)
    assert requests >= 15  # the request path really ran
    assert set(emp) <= set(law)
    tv = 0.5 * sum(abs(emp[k] / samples - law.get(k, 0.0)) for k in set(emp) | set(law))
    assert tv < 0.1
