"""Protocols end to end on the simulator: exactness, bit accounting, determinism, bad input.

Statistical tests use the synthetic models (cheap forwards, small supports) with real tiny
tokenizers for the vocabulary alignment, so every method runs hundreds of times in seconds.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import wanspec
from wanspec import wire
from wanspec.models.jobs import session_executor
from wanspec.net.client import RemotePair, edge_machine
from wanspec.protocols.registry import METHODS, edge_model_for, get_method, make_cloud
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import Link
from worlds import FLAT_PROFILE, World, greedy

LOSSLESS = [name for name, m in METHODS.items() if m.lossless]
SPLIT = [name for name, m in METHODS.items() if m.family == "split"]
LOSSLESS_HETERO = [name for name in LOSSLESS if not METHODS[name].shared_vocab_only]
LOSSY = [name for name, m in METHODS.items() if not m.lossless and m.family != "split"]


# ----------------------------------------------------------------------------- greedy exactness


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("method", LOSSLESS)
def test_greedy_equals_target_greedy_shared(shared_world: World, method: str, gamma: int) -> None:
    sim, _, _ = shared_world.run(method, temperature=0, gamma=gamma, max_new_tokens=25)
    assert sim.tokens == greedy(shared_world, 25)
    assert sim.finish_reason == "length"


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("method", LOSSLESS_HETERO)
def test_greedy_equals_target_greedy_hetero(hetero_world: World, method: str, gamma: int) -> None:
    sim, _, _ = hetero_world.run(method, temperature=0, gamma=gamma, max_new_tokens=20)
    assert sim.tokens == greedy(hetero_world, 20)


# ----------------------------------------------------------------------------- sampling exactness
# Seeded runs of each method against the enumerated law of the first two target tokens (25
# outcomes), through the real random streams. The first token's law is proven exactly by
# tests/test_protocols_exact_law.py and later positions by the pooled χ² tests of
# tests/test_protocols_pooled_law.py (on models with one law after every context); what is left
# here is a gross error at the second position of context-dependent models, such as q taken
# after the wrong context (TV = 1 from the target's law on both worlds). Sized for that: the
# TV of SAMPLES draws from the exact law stays under 0.127 with probability 1 − 10⁻⁴ (simulated
# multinomial draws, both worlds; mean 0.074), so a correct method passes TV_BOUND with that
# margin, and a law at TV ≥ 0.3 from the target's fails with the same odds.

SAMPLES = 600
TV_BOUND = 0.14


def _empirical(world: World, method: str, n: int, **settings) -> Counter:
    if METHODS[method].family == "pipeline":
        # the tree never changes a pipeline's tokens (tests/test_pipeline.py), only its cost:
        # two tips keep hits and misses both in play at a fraction of 16 tips' time
        settings = {"tree_budget": 2, **settings}
    out: Counter = Counter()
    for seed in range(SAMPLES):
        sim, _, _ = world.run(method, seed=seed, max_new_tokens=n, **settings)
        out[tuple(sim.tokens[:n])] += 1
    return out


def _tv(empirical: Counter, law: dict) -> float:
    keys = set(empirical) | set(law)
    return 0.5 * sum(abs(empirical[k] / SAMPLES - law.get(k, 0.0)) for k in keys)


@pytest.mark.statistical
@pytest.mark.parametrize("method", LOSSLESS_HETERO)
def test_sampling_matches_enumerated_target_law_hetero(hetero_world: World, method: str) -> None:
    law = hetero_world.exact_joint(2)
    emp = _empirical(hetero_world, method, 2, gamma=2, srdv_k=1, srdv_m=1)
    assert set(emp) <= set(law)
    assert _tv(emp, law) < TV_BOUND


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["sd", "cosd", "xcosd", "xcosd-e", "acespec"])
def test_sampling_matches_enumerated_target_law_shared(shared_world: World, method: str) -> None:
    law = shared_world.exact_joint(2)
    emp = _empirical(shared_world, method, 2, gamma=3)
    assert set(emp) <= set(law)
    assert _tv(emp, law) < TV_BOUND


# ----------------------------------------------------------------------------- bits

UPLINK = {"Hello", "StartRequest", "Draft", "DraftWithDists", "CandidatesRequest",
          "ResampleRequest", "Close", "HiddenStates"}  # fmt: skip


def _sent(sim) -> list[tuple[str, object]]:
    return [(rec.side, rec.info["msg"]) for rec in sim.trace if rec.what == "send"]


@pytest.mark.parametrize("method", LOSSLESS_HETERO + LOSSY)
def test_reported_bits_are_the_encoded_bytes(hetero_world: World, method: str) -> None:
    sim, _, _ = hetero_world.run(method, max_new_tokens=12, seed=3, trace=True)
    sent = _sent(sim)
    total_up = sum(8 * len(wire.encode(m)) for side, m in sent if side == "edge")
    total_down = sum(8 * len(wire.encode(m)) for side, m in sent if side == "cloud")
    assert {type(m).__name__ for side, m in sent if side == "edge"} <= UPLINK
    assert (sim.bits["up"], sim.bits["down"]) == (total_up, total_down)
    assert sum(sim.bits_by_type.values()) == total_up + total_down


@pytest.mark.parametrize("method", [*LOSSLESS_HETERO, *LOSSY])
def test_every_message_arrives_as_the_codec_decodes_it(hetero_world: World, method: str) -> None:
    """The simulator hands each machine the decoded bytes, never the sender's object."""
    sim, _, _ = hetero_world.run(method, max_new_tokens=10, seed=5, temperature=1.5, trace=True)
    for sender, receiver in (("edge", "cloud"), ("cloud", "edge")):  # each link keeps order
        sent = [r.info["msg"] for r in sim.trace if r.what == "send" and r.side == sender]
        received = [r.info["msg"] for r in sim.trace if r.what == "recv" and r.side == receiver]
        assert received == sent[: len(received)] and len(received) >= len(sent) - 1
        assert all(r is not s for r, s in zip(received, sent, strict=False))


# ----------------------------------------------------------------------------- determinism & errors


def test_identical_seeds_give_identical_runs(hetero_world: World) -> None:
    link = Link(bandwidth_bps=2e5, rtt_s=0.05, jitter_s=0.01, loss=0.1, seed=4)
    a, _, _ = hetero_world.run("xcosd-e", link=link, seed=11, max_new_tokens=15)
    b, _, _ = hetero_world.run("xcosd-e", link=link, seed=11, max_new_tokens=15)
    c, _, _ = hetero_world.run("xcosd-e", link=link, seed=12, max_new_tokens=15)
    assert a.tokens == b.tokens and a.duration_s == b.duration_s and a.bits == b.bits
    assert a.tokens != c.tokens


@pytest.mark.parametrize(("edge_draws", "cloud_draws"), [("cosd", "ul"), ("cosd", "sd")])
def test_a_seed_gives_the_same_tokens_whichever_side_draws_the_residual(
    shared_world: World, edge_draws: str, cloud_draws: str
) -> None:
    """Coins and residual draws are keyed by output position: cosd draws a rejection's residual
    on the edge from the q̂ it receives, ul and sd on the cloud from q, yet a seed gives both the
    same tokens (16-bit q̂ moves a draw only where u falls within its rounding of a boundary)."""
    for seed in range(3):
        settings = dict(seed=seed, max_new_tokens=32, temperature=1.2, gamma=3, q_bits=16)
        edge_run, _, cloud = shared_world.run(edge_draws, **settings)
        cloud_run, _, _ = shared_world.run(cloud_draws, **settings)
        assert cloud.counters["rejections"] >= 3  # residuals were drawn
        assert cloud_run.tokens == edge_run.tokens


class JitteredProfile:
    """Scales every computation's price by U(0.3, 3): same work, random timing."""

    def __init__(self, seed: int) -> None:
        self.name, self.rng = "jittered", np.random.default_rng(seed)

    def seconds(self, cost, wall_s=None) -> float:
        return FLAT_PROFILE.seconds(cost) * float(self.rng.uniform(0.3, 3.0))


SHARED_ONLY = [m for m in METHODS if METHODS[m].shared_vocab_only]
# xcosd-auto chooses each round's mechanism by the clock, so its tokens follow the timing;
# tests/test_xcosd_auto.py shows them timing-blind with the choice pinned (deepspec-tree's p̃ per
# chain likewise: tests/test_pipeline.py, with every chain's p̃)
TIMING_CASES = [
    (m, False) for m in LOSSLESS_HETERO + LOSSY if not METHODS[m].tokens_follow_timing
] + [(m, True) for m in SHARED_ONLY if not METHODS[m].tokens_follow_timing]


@pytest.mark.parametrize(("method", "shared"), TIMING_CASES)
def test_tokens_do_not_depend_on_timing(
    shared_world: World, hetero_world: World, method: str, shared: bool
) -> None:
    world = shared_world if shared else hetero_world
    settings = dict(seed=21, max_new_tokens=16, temperature=1.3, gamma=3)
    base, _, _ = world.run(method, **settings)
    for k in range(3):
        link = Link(bandwidth_bps=10 ** (4 + k), rtt_s=0.01 * (k + 1), jitter_s=0.02, seed=k)
        other, _, _ = world.run(method, link=link, profile=JitteredProfile(k), **settings)
        assert other.tokens == base.tokens
        assert other.duration_s != base.duration_s


def test_a_stale_draft_is_dropped_and_counted(hetero_world: World) -> None:
    from wanspec.protocols.base import Compute, ComputeDone, MessageReceived, Send, Start

    edge, cloud = hetero_world.machines("xcosd", max_new_tokens=8, seed=1)
    opening = [a.msg for a in edge.handle(Start()) if isinstance(a, Send)]
    actions = cloud.handle(Start())
    for msg in opening:
        actions += cloud.handle(MessageReceived(msg))
    run = session_executor(hetero_world.target)
    for action in actions:  # the prefill
        if isinstance(action, Compute):
            cloud.handle(ComputeDone(action.job_id, run(action.job)))
    stale = wire.Draft(0, base=3, tokens=(5, 6), probs=(100, 100))
    assert cloud.handle(MessageReceived(stale)) == []
    assert cloud.counters["stale_drafts"] == 1
    fresh = cloud.handle(MessageReceived(wire.Draft(1, base=0, tokens=(5, 6), probs=(100, 100))))
    assert [type(a).__name__ for a in fresh] == ["Compute"]
    assert cloud.counters["stale_drafts"] == 1


def _handshake_failure(world: World, edge) -> tuple:
    sim = world.simulate(edge, make_cloud(world.info), trace=True)
    errors = [rec.info["msg"] for rec in sim.trace if rec.what == "send" and rec.side == "cloud"]
    return sim, errors


def test_a_different_tokenizer_is_refused_in_the_handshake(hetero_world: World) -> None:
    import dataclasses

    edge = hetero_world.edge("xcosd", max_new_tokens=4)
    edge.fingerprints = dataclasses.replace(edge.fingerprints, target_tokenizer="0" * 16)
    sim, sent = _handshake_failure(hetero_world, edge)
    assert [type(m).__name__ for m in sent] == ["Error"]
    assert "target tokenizer" in sim.finish_reason and sim.finish_reason.startswith("error")
    assert sim.cloud_finish.startswith("error") and sim.computes["cloud"] == 0
    assert sim.tokens == []


def test_an_unknown_draft_tokenizer_is_refused(hetero_world: World) -> None:
    import dataclasses

    edge = hetero_world.edge("xcosd-e", max_new_tokens=4)
    edge.fingerprints = dataclasses.replace(edge.fingerprints, draft_tokenizer="f" * 16)
    sim, _ = _handshake_failure(hetero_world, edge)
    assert "no alignment for draft tokenizer" in sim.finish_reason
    ar, _, _ = hetero_world.run("ar", max_new_tokens=3)  # AR needs no draft at all
    assert ar.finish_reason == "length"


def test_a_wrong_protocol_version_is_refused(hetero_world: World) -> None:
    from wanspec.protocols.base import PROTOCOL_VERSION, Finish, MessageReceived, Send, Start

    cloud = make_cloud(hetero_world.info)
    cloud.handle(Start())
    hello = wire.Hello(PROTOCOL_VERSION + 1, "edge", "xcosd", "", "a", "b")
    actions = cloud.handle(MessageReceived(hello))
    error = next(a.msg for a in actions if isinstance(a, Send))
    assert isinstance(error, wire.Error) and "protocol" in error.message
    assert any(isinstance(a, Finish) and a.reason.startswith("error") for a in actions)
    edge = hetero_world.edge("xcosd", max_new_tokens=4)
    edge.handle(Start())
    ack = wire.HelloAck(PROTOCOL_VERSION + 1, "", edge.fingerprints.target_tokenizer)
    finished = edge.handle(MessageReceived(ack))
    assert any(isinstance(a, Send) and isinstance(a.msg, wire.Error) for a in finished)
    assert any(isinstance(a, Finish) and "protocol" in a.reason for a in finished)


def test_shared_only_method_on_heterogeneous_pair_is_a_clear_error(hetero_world: World) -> None:
    with pytest.raises(ValueError, match="shared vocabulary"):
        hetero_world.machines("cosd")


def test_unknown_method_and_bad_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        get_method("nope")
    with pytest.raises(ValueError):
        GenerationSettings(gamma=0)
    with pytest.raises(ValueError):
        GenerationSettings(top_p=0)
    with pytest.raises(ValueError, match="unknown settings"):
        GenerationSettings.from_dict({"gamma": 2, "bogus": 1})


@pytest.mark.parametrize(
    "msg",
    [
        wire.CandidatesRequest(3, 2),
        wire.Draft(0, 0, (), (1, 2), (5, 5)),
        wire.VerifyResult(0, 1, token=4),
        wire.StartRequest(0, "again", {}),
    ],
)
def test_the_cloud_answers_a_message_out_of_place_with_an_error(
    shared_world: World, msg: object
) -> None:
    from wanspec.protocols.base import Finish, MessageReceived, Send

    _, cloud = shared_world.machines("xcosd")
    actions = cloud.handle(MessageReceived(msg))  # before any Hello
    assert [type(a).__name__ for a in actions][-2:] == ["Send", "Finish"]
    assert isinstance(actions[-2], Send) and isinstance(actions[-2].msg, wire.Error)
    assert isinstance(actions[-1], Finish) and actions[-1].reason.startswith("error")
    assert cloud.handle(MessageReceived(msg)) == []  # a finished machine stays finished


def test_stop_strings_and_eos_end_generation(shared_world: World) -> None:
    reference = greedy(shared_world, 12)
    stop = " ".join(map(str, reference[:5]))
    sim, _, _ = shared_world.run("xcosd", temperature=0, max_new_tokens=12, stop=(stop,))
    assert sim.tokens == reference[:5] and sim.finish_reason == "stop"


@pytest.mark.parametrize("method", [m for m in METHODS if m not in SPLIT])
def test_every_method_runs_to_its_length_limit(shared_world: World, method: str) -> None:
    sim, edge, _ = shared_world.run(method, max_new_tokens=9, seed=2)
    assert len(sim.tokens) == 9 and sim.finish_reason == "length"
    if METHODS[method].family == "speculative":
        assert sum(a + 1 for a in edge.accepted_per_round) >= 9


def test_split_inference_sends_activations_and_matchesgreedy(tiny_pair_shared) -> None:
    draft, target = tiny_pair_shared
    pair = wanspec.load_pair(target=target, draft=draft)
    split = wanspec.generate(pair, "hello world", "split", max_new_tokens=10, temperature=0)
    ar = wanspec.generate(pair, "hello world", "ar", max_new_tokens=10, temperature=0)
    assert split.token_ids == ar.token_ids
    # the edge's busy time is its embedding passes, the cloud's the rest of the target
    assert set(split.sim.compute_by_tag["edge"]) == {"embed"}
    assert set(split.sim.compute_by_tag["cloud"]) == {"forward"}
    hidden = pair.target.config.hidden_size
    prompt_rows = len(pair.target_encode("hello world"))
    activations = split.stats["bits_by_type"]["HiddenStates"]
    rows = prompt_rows + 9  # the prompt, then every generated token but the last
    assert 16 * hidden * rows <= activations <= 16 * hidden * rows + 8 * 8 * 10


def test_the_edge_runs_the_draft_except_split_which_runs_the_target(shared_world: World) -> None:
    """One rule for every driver (simulator, benchmarks, network client): split's edge embeds
    with the target's layers, every other edge runs the draft; an edge with no target model
    cannot run split."""
    draft, target = shared_world.draft, shared_world.target
    names = [*METHODS, *(alias for m in METHODS.values() for alias in m.aliases)]
    assert {m for m in names if edge_model_for(m, draft=draft, target=target) is target} == {
        "split"
    }
    pair = wanspec.Pair(target, draft, shared_world.alignment)
    assert pair.edge_model("split") is target and pair.edge_model("naive") is draft
    remote = RemotePair(draft, shared_world.alignment, target_tokenizer=None)
    settings = GenerationSettings(max_new_tokens=4)
    assert edge_machine(remote, "p", "ar", settings)[1] is draft
    with pytest.raises(ValueError, match="split runs the target's embedding layer on the edge"):
        edge_machine(remote, "p", "split", settings)


def test_api_generate_returns_stats_on_tiny_pair(tiny_pair_shared) -> None:
    draft, target = tiny_pair_shared
    pair = wanspec.load_pair(target=target, draft=draft)
    res = wanspec.generate(
        pair,
        "hello world",
        "xcosd-e",
        max_new_tokens=8,
        temperature=0,
        link=wanspec.Link(bandwidth_bps=1e6, rtt_s=0.1),
    )
    rounds = res.stats["rounds"]
    assert res.stats["new_tokens"] == len(res.token_ids) == 8
    assert rounds == len(res.stats["accepted_per_round"]) >= 1
    assert res.stats["acceptance_rate"] == sum(res.stats["accepted_per_round"]) / (4 * rounds)
    assert res.stats["uplink_bits"] == sum(
        v for k, v in res.stats["bits_by_type"].items() if k in UPLINK
    )
    assert res.stats["time_s"] >= rounds * 0.1  # at least one RTT per round
    assert res.text == pair.decode(res.token_ids)


def test_edge_ends_cleanly_on_a_reply_for_the_wrong_round(shared_world: World) -> None:
    from wanspec.protocols.base import Compute, ComputeDone, Finish, MessageReceived, Send, Start

    edge, _ = shared_world.machines("xcosd", max_new_tokens=4)
    actions = edge.handle(Start())
    fp = edge.fingerprints
    info = {"eos_token_ids": []}
    ack = wire.HelloAck(wire.WIRE_VERSION, fp.target_model, fp.target_tokenizer, info)
    edge.handle(MessageReceived(ack))
    run = session_executor(shared_world.draft)
    while not any(isinstance(a, Send) and isinstance(a.msg, wire.Draft) for a in actions):
        compute = next(a for a in actions if isinstance(a, Compute))
        actions = edge.handle(ComputeDone(compute.job_id, run(compute.job)))
    actions = edge.handle(MessageReceived(wire.VerifyResult(99, 0, token=1)))
    assert any(isinstance(a, Finish) and a.reason.startswith("error") for a in actions)
    assert any(isinstance(a, Send) and isinstance(a.msg, wire.Error) for a in actions)


@pytest.mark.parametrize("method", ["ar", "xcosd", "naive", "xcosd-e"])
def test_repetition_penalty_is_the_targets_own(tiny_pair_hetero, method: str) -> None:
    """The penalty needs every earlier target id (prompt included) at every verified row."""
    import torch

    draft, target = tiny_pair_hetero
    pair = wanspec.load_pair(target=target, draft=draft)
    ids = torch.tensor([pair.target_encode("hello hello world")])
    ref = pair.target.model.generate(
        ids, max_new_tokens=16, do_sample=False, repetition_penalty=1.8,
        attention_mask=torch.ones_like(ids),
    )[0, ids.shape[1]:].tolist()  # fmt: skip
    plain = wanspec.generate(pair, "hello hello world", method, max_new_tokens=16, temperature=0)
    res = wanspec.generate(
        pair, "hello hello world", method, max_new_tokens=16, temperature=0,
        repetition_penalty=1.8, gamma=3,
    )  # fmt: skip
    assert res.token_ids == ref
    assert plain.token_ids != ref  # the penalty changes this text, so the check has teeth
