"""The asynchronous pipelines (picospec, acespec, acespec-x) on the simulator.

The tree cache only saves draft work: with draft tokens keyed by output position, every pipeline
run of a seed gives the very same tokens whatever the tree's shape, budget or timing, which makes
"the cache is exact" a deterministic check. The statistical law and greedy checks of every
lossless method (these included) live in test_protocols.py.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import wanspec
from wanspec import wire
from wanspec.bench.experiment import synthetic_pair
from wanspec.jobs import ComputeCost
from wanspec.models.jobs import session_executor
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec
from wanspec.models.tiny import build_tokenizer
from wanspec.protocols.control import cycle, verdict_gap
from wanspec.protocols.pipeline import FORKS_UNMEASURED
from wanspec.protocols.registry import make_cloud, make_edge, target_info
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import Link, load_profile, simulate
from wanspec.vocab import VocabAlignment
from worlds import (
    FLAT_PROFILE,
    PROMPT_IDS,
    AheadTally,
    World,
    check_the_tree_never_changes_the_tokens,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tree_never_changes_the_tokens(shared_world: World, seed: int) -> None:
    settings = dict(seed=seed, max_new_tokens=24, temperature=1.2, gamma=3)
    check_the_tree_never_changes_the_tokens(shared_world, **settings)


@pytest.mark.parametrize("method", ["picospec", "acespec"])
def test_a_verdict_arriving_mid_tree_does_not_shift_the_draft_streams(
    shared_world: World, method: str
) -> None:
    """A slow edge gets the verdict while its tree is still being drafted (a pipeline stall);
    the branch it then waits for must draw from the streams of the positions it was drafted
    for, not of positions counted after the verdict's commit: same tokens as a fast edge."""
    slow_edge = load_profile({"name": "slow-edge", "forward_ms": {"1": 1.0, "64": 2.0},
                              "tree_ms": {"1": 40.0, "64": 40.0}})  # fmt: skip
    stalls = 0
    for seed in (3, 4):
        settings = dict(seed=seed, max_new_tokens=24, temperature=1.2, gamma=3)
        fast, _, _ = shared_world.run(method, **settings)
        link = Link(bandwidth_bps=1e8, rtt_s=0.002)
        slow, edge, _ = shared_world.run(
            method, link=link, profile=slow_edge, cloud_profile=FLAT_PROFILE, **settings
        )
        stalls += edge.counters.get("pipeline_stalls", 0)
        assert slow.tokens == fast.tokens
    assert stalls >= 2  # verdicts did arrive mid-tree


@pytest.mark.parametrize(
    ("rtt_s", "temperature", "gamma", "chains"),
    [(0.02, 1.0, 4, 2), (0.15, 1.2, 3, 2), (0.3, 0.7, 2, 2), (0.15, 0.7, 2, 3), (0.3, 0.5, 1, 5)],
)
def test_deepspec_gives_acespecs_tokens_with_chains_sent_ahead(
    shared_world: World, rtt_s: float, temperature: float, gamma: int, chains: int
) -> None:
    """A chain sent before the verdict is the chain AceSpec sends after it, so a seed gives the
    same tokens; edge and cloud agree on which chains went stale, and some chains sent ahead were
    verified (a chain accepted whole was followed by the one already sent, its tree kept)."""
    link = Link(bandwidth_bps=1e7, rtt_s=rtt_s)
    tally = AheadTally()
    for seed in range(3):
        settings = dict(seed=seed, max_new_tokens=40, temperature=temperature, gamma=gamma)
        ace, _, _ = shared_world.run("acespec", link=link, **settings)
        deep, edge, cloud = shared_world.run(
            "deepspec", link=link, chains_in_flight=chains, **settings
        )
        assert deep.tokens == ace.tokens
        tally.add(edge, cloud)
    tally.check(chains)


def test_an_edge_without_a_latency_profile_sizes_its_trees_by_the_passes_it_times(
    shared_world: World,
) -> None:
    """AceSpec's budget (the most tips whose tree fits the window) needs a pass's cost per
    tips: an edge with no profile (every live edge) fits it to its own timed passes. Its first
    tree, before any pass is timed, is drafted at B_max; then a window shorter than the chain's
    passes (2 ms against 4 passes of 1 ms or more) leaves no alternative, and a long one
    (300 ms) keeps B_max. The tokens are a fixed budget's."""
    budgets = {}
    for rtt in (0.002, 0.3):
        link, settings = Link(bandwidth_bps=1e7, rtt_s=rtt), dict(seed=0, max_new_tokens=40)
        fixed, _, _ = shared_world.run("acespec", link=link, tree_fixed=True, **settings)
        aware, edge, _ = shared_world.run("acespec", link=link, **settings)
        assert aware.tokens == fixed.tokens
        assert edge.pass_cost is edge.planner.tree_seconds
        budgets[rtt] = [sum(entry["fanout"]) + 1 for entry in edge.rounds_log]
    default = GenerationSettings().tree_budget
    assert budgets[0.002][0] == default and set(budgets[0.002][1:]) == {1}
    assert set(budgets[0.3]) == {default}


@pytest.mark.parametrize(
    ("method", "chains", "restart", "short"),
    [("deepspec", 2, 2, True), ("deepspec-tree", 3, 1, True), ("deepspec", 1, 2, False),
     ("deepspec", 2, 0, False), ("acespec", 1, 2, False), ("deepspec", 2, 4, False)],
)  # fmt: skip
def test_a_miss_restarts_with_a_short_chain_only_while_chains_go_ahead(
    shared_world: World, method: str, chains: int, restart: int, short: bool
) -> None:
    """After a miss the cloud has nothing of the edge's: with chains going ahead the chain
    drafted then is `restart_length` long, and the chains after it (sent ahead behind it, or
    after its verdict) are γ long again; with one chain in flight, or 0, or a length of γ, every
    chain is γ long. A seed gives acespec's tokens either way."""
    gamma, link = 4, Link(bandwidth_bps=1e7, rtt_s=0.15)
    lengths, misses, restarts = Counter(), 0, 0
    for seed in range(3):
        settings = dict(seed=seed, max_new_tokens=48, temperature=1.2, gamma=gamma)
        ace, _, _ = shared_world.run("acespec", link=link, **settings)
        run, edge, _ = shared_world.run(
            method, link=link, chains_in_flight=chains, restart_length=restart, **settings
        )
        assert run.tokens == ace.tokens
        lengths.update(len(entry["fanout"]) for entry in edge.rounds_log)
        misses += edge.counters.get("cache_misses", 0)
        restarts += edge.counters.get("restart_chains", 0)
    assert misses > 3
    if short:  # one short chain per miss (a run may end before the last one is sent)
        assert misses - 3 <= restarts <= misses
        assert lengths == Counter({gamma: lengths[gamma], restart: restarts})
    else:
        assert restarts == 0 and set(lengths) == {gamma}


@pytest.mark.parametrize("chain_dists", ["always", "auto"])
def test_deepspec_tree_gives_acespecs_tokens_whichever_side_draws_the_residual(
    shared_world: World, chain_dists: str
) -> None:
    """acespec's edge draws a rejection's residual from the q̂ it receives; deepspec-tree's cloud
    draws it from q where the chain carried its p̃ (every chain with "always"; with "auto" on this
    slow uplink, some chains and not others). Both draw from the position's own stream, so a
    seed gives the same tokens, forks taken and plain chains included, and a paired comparison
    of the two methods compares their time alone."""
    link = Link(bandwidth_bps=5e4, rtt_s=0.1)
    plain = with_dists = taken = 0
    for seed in range(3):
        settings = dict(seed=seed, max_new_tokens=48, temperature=1.2, gamma=3, q_bits=16)
        ace, _, ace_cloud = shared_world.run("acespec", link=link, **settings)
        tree, edge, _ = shared_world.run(
            "deepspec-tree", link=link, chain_dists=chain_dists, **settings
        )
        assert ace_cloud.counters["rejections"] >= 3
        assert tree.tokens == ace.tokens
        plain += edge.counters.get("plain_rejections", 0)
        with_dists += edge.counters.get("dists_rejections", 0)
        taken += edge.counters.get("forks_taken", 0)
    assert with_dists > 0 and taken > 0  # the cloud drew residuals, and forks went on from them
    assert (plain > 0) == (chain_dists == "auto")  # auto: the edge drew some too


def test_deepspec_tree_tokens_do_not_depend_on_the_link_the_depth_or_the_tree(
    shared_world: World,
) -> None:
    """Forks change only when a chain is verified: the cloud draws each rejected position's
    token in output order and every draft from its position's stream, so a seed gives the same
    tokens on any link, at any depth, budget, number of forks and of forks' trees (at most
    `forks_per_tree` forks a tree, fewer where the measured uplink cannot carry them: at 50
    kbit/s about 2 a tree).
    Edge and cloud agree on the rounds verified; every chain the cloud dropped is one the edge
    counts stale (a chain sent ahead it cancelled, a fork it did not take; the last ones may
    still be on their way at the end), and forks were taken, among them forks whose trees the
    next chain's passes drafted: drafted whole, and still drafting (the fork tree's rows then
    come from a pass of a tree gone stale). Every chain carries its p̃ here: where the edge
    chooses (`chain_dists="auto"`) it chooses by the clock, and a chain without its p̃ has
    its rejection resolved on the edge, from its own stream."""
    cases = [  # link, chains in flight, budget, forks per tree, fork trees
        (Link(1e7, 0.02), 2, 4, 1024, 3),
        (Link(1e6, 0.3), 3, 16, 1, 3),
        (Link(1e8, 0.15), 1, 1, 1024, 3),
        (Link(1e7, 0.15), 2, 8, 0, 3),
        (Link(5e4, 0.05), 2, 16, 1024, 3),
        (Link(1e7, 0.1), 2, 8, 1024, 0),
        (Link(1e7, 0.1), 2, 8, 1024, 8),
    ]
    taken = held = slow_forks = slow_trees = trees_taken = trees_in_flight = 0
    for seed in range(3):
        runs = []
        for link, chains, budget, forks, fork_trees in cases:
            sim, edge, cloud = shared_world.run(
                "deepspec-tree", link=link, chains_in_flight=chains, tree_budget=budget,
                forks_per_tree=forks, fork_trees=fork_trees, seed=seed, max_new_tokens=40,
                gamma=3, temperature=1.2, chain_dists="always",
            )  # fmt: skip
            assert sim.finish_reason == "length" and sim.cloud_finish is None
            c = edge.counters
            assert c.get("forks_sent", 0) <= forks * c["tree_rounds"]
            stale = (
                c.get("stale_chains_ahead", 0) + c.get("forks_sent", 0) - c.get("forks_taken", 0)
            )
            assert cloud.counters.get("stale_drafts", 0) <= stale
            assert len(edge.accepted_per_round) == cloud.counters["rounds"]
            taken += c.get("forks_taken", 0)
            held += c.get("forks_held", 0)
            trees_taken += c.get("fork_trees_taken", 0)
            trees_in_flight += c.get("fork_trees_taken_in_flight", 0)
            if link.bandwidth_bps < 1e5:
                slow_forks, slow_trees = (
                    slow_forks + c.get("forks_sent", 0),
                    slow_trees + c["tree_rounds"],
                )
            runs.append(sim.tokens)
        assert all(run == runs[0] for run in runs)
    assert taken > 0 and held > 0
    assert trees_taken > trees_in_flight > 0
    # every fork of a tree would be 11 to 13 of them here, on any link
    assert slow_forks < 4 * slow_trees


def test_every_chain_verified_was_drafted_from_its_own_context(shared_world: World) -> None:
    """A tree drafts chains from contexts that exist only in the edge's pending tree: chains
    sent ahead, forks, the forks' trees drafted in the next chain's passes, and rows taken from
    a pass whose tree went stale. Each chain the cloud verified must carry, at every position,
    the draft's distribution after the committed output before it and the chain's own tokens
    up to it (the synthetic draft's support moves with the context): a row taken from the
    wrong place shows here, where the law and the tokens may not tell."""
    edge_profile, cloud_profile = load_profile("edge-orin"), load_profile("cloud-a100x4-70b")
    checked = in_flight = 0
    for seed in range(4):
        sim, edge, _ = shared_world.run(
            "deepspec-tree", link=Link(1e8, 0.1), profile=edge_profile,
            cloud_profile=cloud_profile, trace=True, gamma=3, tree_budget=8, seed=seed,
            max_new_tokens=60, temperature=1.0, chain_dists="always",
        )  # fmt: skip
        in_flight += edge.counters.get("fork_trees_taken_in_flight", 0)
        cloud_msgs = [
            (r.what, r.info["msg"]) for r in sim.trace if r.side == "cloud" and "msg" in r.info
        ]
        drafts = {m.round: m for what, m in cloud_msgs if isinstance(m, wire.DraftWithDists)}
        verdicts = [
            m for what, m in cloud_msgs if what == "send" and isinstance(m, wire.VerifyResult)
        ]
        for verdict in verdicts:
            chain = drafts[verdict.round]
            context = [*PROMPT_IDS, *sim.tokens[: chain.base]]
            for i, dist in zip(chain.dist_positions, chain.dists, strict=True):
                law = shared_world.draft.spec.probs([*context, *chain.tokens[:i]], "draft")
                assert dist.ids.tolist() == np.flatnonzero(law).tolist(), (chain, i)
                checked += 1
    assert in_flight > 0 and checked > 300


def test_fork_trees_are_drafted_only_where_a_pass_affords_them() -> None:
    """The next chain's passes draft forks' trees where a pass costs little more for more tips
    (AceSpec's Orin: 41 ms for 16 tips, 45 for 64), and none where a pass's cost grows with
    its tips, however many `fork_trees` allows."""
    steep = {"name": "steep", "forward_ms": {"1": 10.0, "16": 40.0, "64": 160.0}}
    trees = {}
    for name, profile in (("orin", "edge-orin"), ("steep", steep)):
        res = wanspec.generate(
            synthetic_pair(0.8, 0), "Question 0:", "deepspec-tree",
            link=Link(bandwidth_bps=1e8, rtt_s=0.15), edge_profile=profile,
            cloud_profile="cloud-a100x4-70b", gamma=4, max_new_tokens=64, seed=0,
            fork_trees=8,
        )  # fmt: skip
        trees[name] = res.stats.get("fork_trees", 0)
    assert trees["orin"] > 0 and trees["steep"] == 0


def test_a_miss_while_a_kept_path_waits_behind_a_long_pass_leaves_it_kept() -> None:
    """A full acceptance keeps the continuation's path with a job queued behind the tree pass
    in flight. Where that pass is long (eight forks' trees drafted along, 64 tips costing 4×
    16 here: `tree_fixed` turns the cost check off) the next verdict can come first; a miss
    then must cancel the tree passes only, for the cache already counts the path kept, and
    the redraft would plan on a cache 4 tokens longer than the draft model's."""
    steep = {"name": "steep", "forward_ms": {"1": 10.0, "16": 40.0, "64": 160.0}}
    for seed in (0, 3):
        res = wanspec.generate(
            synthetic_pair(0.8, seed), f"Question {seed}:", "deepspec-tree",
            link=Link(bandwidth_bps=1e8, rtt_s=0.15), edge_profile=steep,
            cloud_profile="cloud-a100x4-70b", gamma=4, max_new_tokens=64, seed=seed,
            tree_fixed=True, tree_budget=16, fork_trees=8, chain_dists="always",
        )  # fmt: skip
        assert res.stats["new_tokens"] == 64 and res.stats["redrafts"] > 0


def test_forks_on_a_slow_uplink_follow_its_measured_rate(shared_world: World) -> None:
    """On AceSpec's testbed profiles at 50 kbit/s the edge fits the uplink's rate within a step
    of its grid above it and two below, and a tree sends a few forks, not all: a fit that
    trusted the first window (the handshake just before it) took 100 Gbit/s and sent every
    fork of every tree. Below: where forks are seldom taken few go up, so few windows carry
    enough bits to tell the rate from the next slower ones, and the slowest of those wins."""
    edge_profile, cloud_profile = load_profile("edge-orin"), load_profile("cloud-a100x4-70b")
    for seed in range(2):
        sim, edge, _ = shared_world.run(
            "deepspec-tree", link=Link(5e4, 0.05), profile=edge_profile,
            cloud_profile=cloud_profile, gamma=4, tree_budget=32, seed=seed,
            max_new_tokens=48, temperature=1.0,
        )  # fmt: skip
        assert sim.finish_reason == "length"
        assert 5e4 / 1.27**2 < edge.uplink.rate_bps() < 5e4 * 1.27
        assert edge.counters.get("forks_sent", 0) < 4 * edge.counters["tree_rounds"]


def test_a_chain_sent_at_a_verdict_seldom_waits_behind_forks_on_a_slow_uplink(
    shared_world: World,
) -> None:
    """At 50 kbit/s a fork takes some 50 ms to go up: the forks of the chain awaiting its
    verdict go up only while they would be through before that verdict is due (a window after
    it left, if sent alone; else the usual gap after the verdict before), so the chain that
    verdict asks for (a branch no fork covered) leaves at once. Sent until the next chain was
    due instead, they held such chains up by 52 ms on average here; with the due time of chains
    sent alone only, by 17; now by 6."""
    edge_profile, cloud_profile = load_profile("edge-orin"), load_profile("cloud-a100x4-70b")
    rtt, rate, waits = 0.05, 5e4, []
    for seed in range(3):
        sim, _, _ = shared_world.run(
            "deepspec-tree", link=Link(rate, rtt), profile=edge_profile,
            cloud_profile=cloud_profile, trace=True, gamma=4, tree_budget=16, seed=seed,
            max_new_tokens=64, temperature=1.0, chain_dists="always",
        )  # fmt: skip
        edge = [r for r in sim.trace if r.side == "edge"]
        verdicts = {r.t for r in edge if r.what == "recv" and r.info["type"] == "VerifyResult"}
        for r in edge:
            msg = r.info.get("msg")
            chain = isinstance(msg, wire.DraftWithDists) and msg.fork is None
            if r.what == "send" and chain and r.t in verdicts:
                waits.append(r.info["arrival"] - r.t - rtt / 2 - r.info["bits"] / rate)
    assert len(waits) > 20 and np.mean(waits) < 0.011


def test_a_fork_taken_counts_as_a_hit_for_the_controller(shared_world: World) -> None:
    """γ chosen online prices each γ's misses from the lookups: a rejection whose fork the cloud
    took found its branch in the tree, so only the edge's cache misses count as misses."""
    taken = 0
    for seed in range(3):
        _, edge, _ = shared_world.run(
            "deepspec-tree", link=Link(1e7, 0.15), gamma="auto", seed=seed,
            max_new_tokens=40, temperature=1.2,
        )  # fmt: skip
        assert edge.controller is not None
        assert edge.controller.misses == edge.counters.get("cache_misses", 0)
        taken += edge.counters.get("forks_taken", 0)
    assert taken > 0


def test_deepspec_sends_nothing_ahead_past_the_tokens_asked_for(shared_world: World) -> None:
    """A chain whose base would reach max_new_tokens is never sent (the cloud would refuse it)."""
    for seed in range(6):
        for method in ("deepspec", "deepspec-tree"):
            sim, _, _ = shared_world.run(method, seed=seed, max_new_tokens=5, gamma=4)
            assert sim.finish_reason == "length" and len(sim.tokens) == 5
            assert sim.cloud_finish is None or not sim.cloud_finish.startswith("error")


def test_acespec_x_tokens_do_not_depend_on_the_tree(hetero_world: World) -> None:
    settings = dict(seed=7, max_new_tokens=20, temperature=1.0, gamma=2, srdv_k=2)
    runs = [hetero_world.run("acespec-x", tree_budget=b, **settings)[0] for b in (1, 8, 32)]
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens


def test_chains_from_the_tree_branch_beyond_the_drafts_sampling_support(
    shared_world: World,
) -> None:
    """Alternatives rank the draft's logits, not its warped distribution: the rejected token's
    residual lies exactly where the warped draft gives nothing. A chain taken from the tree must
    branch as widely as a freshly drafted one (a ranking by the branch's top-k counts gave it
    one alternative at most here, so every tree after a hit lost its other tips)."""
    settings = dict(seed=0, max_new_tokens=40, top_k=2, gamma=3)
    tree = dict(tree_budget=4, tree_allocation="single", tree_fixed=True)
    _, edge, _ = shared_world.run("acespec", **settings, **tree)
    assert edge.counters["cache_hits"] >= 5  # most chains came from the tree
    assert edge.counters["tree_branches"] == 3 * edge.counters["tree_rounds"]


def test_every_pipeline_message_is_small_and_has_no_bonus(shared_world: World) -> None:
    sim, edge, cloud = shared_world.run("acespec", max_new_tokens=30, seed=3, gamma=3, trace=True)
    replies = [r.info["msg"] for r in sim.trace if r.what == "send" and r.side == "cloud"]
    verdicts = [m for m in replies if type(m).__name__ == "VerifyResult"]
    full = [m for m in verdicts if m.accepted == 3]
    assert full and all(m.token is None and m.dist is None for m in full)
    rejected = [m for m in verdicts if m.accepted < 3]
    assert rejected and all(m.dist is not None and m.token is None for m in rejected)
    assert len(edge.accepted_per_round) == cloud.counters["rounds"]


# ----------------------------------------------------------------------------- analysis

EDGE_MS, TREE_MS, CLOUD_MS, RTT = 20.0, 20.0, 35.0, 0.1


def _iid_run(
    method: str, alpha: float, gamma: int, seed: int, tree_ms: float = TREE_MS, **settings
):
    """The synthetic i.i.d. pair: each draft is accepted independently with probability α."""
    alignment = VocabAlignment.identity(build_tokenizer("bytelevel", 300))
    spec = SyntheticSpec(alpha, vocab_size=alignment.target_width, seed=seed)
    draft, target = SyntheticLM(spec, "draft"), SyntheticLM(spec, "target")
    edge_profile = load_profile({"name": "edge", "forward_ms": {"1": EDGE_MS, "64": EDGE_MS},
                                 "tree_ms": {"1": tree_ms, "64": tree_ms}})  # fmt: skip
    cloud_profile = load_profile({"name": "cloud", "forward_ms": {"1": CLOUD_MS, "64": CLOUD_MS}})
    gen = GenerationSettings(gamma=gamma, max_new_tokens=300, seed=seed, **settings)
    edge = make_edge(
        method,
        alignment=alignment,
        prompt="",
        settings=gen,
        draft_encode=lambda _: [1, 2, 3],
        target_decode=lambda ids: "",
        tree_seconds=lambda n: edge_profile.seconds(ComputeCost("tree", n=n)),
    )
    cloud = make_cloud(target_info(target, lambda _: [1, 2, 3], (alignment,)))
    sim = simulate(
        edge,
        cloud,
        Link(bandwidth_bps=math.inf, rtt_s=RTT),
        edge_profile,
        cloud_profile,
        edge_executor=session_executor(draft),
        cloud_executor=session_executor(target),
        trace=True,
    )
    sends = [r.t for r in sim.trace if r.what == "send" and type(r.info["msg"]).__name__ == "Draft"]
    return sim, edge, np.diff(sends)


@pytest.mark.parametrize(("alpha", "gamma"), [(0.6, 3), (0.8, 4)])
def test_picospec_hits_exactly_when_the_whole_chain_survives(alpha: float, gamma: int) -> None:
    hits = misses = 0
    for seed in range(8):
        _, edge, _ = _iid_run("picospec", alpha, gamma, seed)
        hits += edge.counters.get("cache_hits", 0)
        misses += edge.counters.get("cache_misses", 0)
    rate, n = hits / (hits + misses), hits + misses
    assert rate == pytest.approx(alpha**gamma, abs=4 * math.sqrt(alpha**gamma / n))


@pytest.mark.parametrize(("method", "alpha", "gamma"), [("picospec", 0.6, 3), ("acespec", 0.6, 3),
                                                        ("acespec", 0.8, 4)])  # fmt: skip
def test_cycle_time_is_ideal_plus_the_miss_penalty(method: str, alpha: float, gamma: int) -> None:
    """E[T] = T_ideal + (1 − P_hit)·T_bubble with, for one chain in flight (Algorithm 1),
    T_ideal = max(γ·T_tree, RTT + T_verify) and T_bubble = T_redraft(γ) = γ·T_draft: the RTT is
    paid in every cycle, hit or miss, so a miss adds only the redraft (SPEC.md's RTT + T_redraft
    counts the RTT twice for this pipeline)."""
    cycles, hits, rounds = [], 0, 0
    for seed in range(6):
        _, edge, gaps = _iid_run(method, alpha, gamma, seed, tree_budget=8)
        cycles += list(gaps[1:-1])
        hits += edge.counters.get("cache_hits", 0)
        rounds += edge.counters.get("cache_hits", 0) + edge.counters.get("cache_misses", 0)
    p_hit = hits / rounds
    t_ideal = max(gamma * TREE_MS, RTT * 1e3 + CLOUD_MS) / 1e3
    expected = t_ideal + (1 - p_hit) * gamma * EDGE_MS / 1e3
    assert np.mean(cycles) == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize(
    ("chains", "alpha", "gamma", "tree_ms", "ahead_pays"),
    [(2, 0.6, 3, TREE_MS, True), (2, 0.8, 3, 10.0, True), (3, 0.9, 2, TREE_MS, True),
     (4, 0.9, 2, 10.0, True), (2, 0.8, 2, 40.0, True), (2, 0.9, 2, 40.0, True),
     (2, 0.5, 3, 40.0, False)],
)  # fmt: skip
def test_deepspec_cycle_time_follows_the_chains_in_flight_analysis(
    chains: int, alpha: float, gamma: int, tree_ms: float, ahead_pays: bool
) -> None:
    """D chains in flight (`control.verdict_gap`): after a rejection the next chain leaves at
    the verdict (plus γ·T_draft on a miss); in a run of full acceptances chain k leaves once the
    tree of chain k − 1 is drafted and chain k − D has its verdict, which comes W = RTT +
    T_verify after it left or T_verify after the verdict before. A rejection that finds the
    edge drafting the tree of the chain sent after it (now stale) waits for that pass to end:
    a miss redrafts after it, a hit's tree starts after it (T_tree = 40 ms), unless the edge
    held that pass for the verdict (at α = 0.9, γ = 2, T_tree = 40 ms it must not: a chain
    accepted whole would find its tree late). Measured as the gaps between verdicts at the
    edge, with the measured share of full acceptances and misses. One chain in flight (AceSpec's
    max(τ, W) + misses) is 9–80% slower at these points except at α = 0.5, where little is accepted
    whole: there the held passes keep a chain sent ahead from costing more than 3 %, and some
    are held, some resumed after a full acceptance. The analysis has every chain γ long, so
    the chain after a miss is too here (`restart_length` 0); a shorter one leaves sooner and
    is not in it."""
    gaps, full, misses, verdicts, held, resumed = [], 0, 0, 0, 0, 0
    for seed in range(3):
        sim, edge, _ = _iid_run("deepspec", alpha, gamma, seed, tree_ms=tree_ms, tree_budget=8,
                                chains_in_flight=chains, restart_length=0)  # fmt: skip
        arrivals = [r.t for r in sim.trace if r.side == "edge" and r.what == "recv"
                    and r.info["type"] == "VerifyResult"]  # fmt: skip
        gaps += list(np.diff(arrivals)[1:-1])
        full += edge.accepted_per_round.count(gamma)
        misses += edge.counters.get("cache_misses", 0)
        verdicts += len(edge.accepted_per_round)
        held += edge.counters.get("passes_held", 0)
        resumed += edge.counters.get("passes_resumed", 0)
    a = full / verdicts
    assert a == pytest.approx(alpha**gamma, abs=4 * math.sqrt(a * (1 - a) / verdicts))
    timing = dict(window_s=RTT + CLOUD_MS / 1e3, tree_s=gamma * tree_ms / 1e3,
                  redraft_s=gamma * EDGE_MS / 1e3,
                  miss_share=misses / (verdicts - full), pass_s=tree_ms / 1e3)  # fmt: skip
    expected = verdict_gap(a, chains_in_flight=chains, verify_s=CLOUD_MS / 1e3, **timing)
    assert np.mean(gaps) == pytest.approx(expected, rel=0.03)
    one_chain = verdict_gap(a, **timing)
    if ahead_pays:
        assert one_chain > 1.05 * expected
    else:
        assert one_chain == pytest.approx(expected, rel=0.03)
        assert held > 0 and resumed > 0


@pytest.mark.parametrize(
    ("chains", "alpha", "gamma", "restart", "tree_ms"),
    [(2, 0.6, 3, 1, TREE_MS), (2, 0.6, 4, 2, 40.0), (3, 0.8, 4, 2, TREE_MS)],
)
def test_deepspec_cycle_time_with_short_restarts_follows_the_analysis(
    chains: int, alpha: float, gamma: int, restart: int, tree_ms: float
) -> None:
    """The same analysis with a chain of `restart_length` after each miss (`control.cycle`):
    the run it starts goes on with P = α^k, and a miss is k draft steps, not γ. Measured from
    the messages: which chains were restart chains, and which of them were accepted whole.
    Without the restart in the model the gap would be off by more than the tolerance."""
    gaps, verdicts, misses = [], [], 0
    for seed in range(3):
        sim, edge, _ = _iid_run("deepspec", alpha, gamma, seed, tree_ms=tree_ms, tree_budget=8,
                                chains_in_flight=chains, restart_length=restart)  # fmt: skip
        sent = {r.info["msg"].round: len(r.info["msg"].tokens) for r in sim.trace
                if r.side == "edge" and r.what == "send" and r.info["type"] == "Draft"}  # fmt: skip
        got = [r for r in sim.trace if r.side == "edge" and r.what == "recv"
               and r.info["type"] == "VerifyResult"]  # fmt: skip
        gaps += list(np.diff([r.t for r in got])[1:-1])
        verdicts += [(sent[r.info["msg"].round], r.info["msg"].accepted) for r in got]
        misses += edge.counters.get("cache_misses", 0)
    short = [accepted for length, accepted in verdicts if length == restart]
    whole = [accepted for length, accepted in verdicts if length == gamma]
    assert len(short) + len(whole) == len(verdicts) and len(short) > 20
    a, a_restart = whole.count(gamma) / len(whole), short.count(restart) / len(short)
    rejections = len(verdicts) - whole.count(gamma) - short.count(restart)
    timing = dict(window_s=RTT + CLOUD_MS / 1e3, tree_s=gamma * tree_ms / 1e3,
                  redraft_s=gamma * EDGE_MS / 1e3, miss_share=misses / rejections,
                  pass_s=tree_ms / 1e3, chains_in_flight=chains,
                  verify_s=CLOUD_MS / 1e3)  # fmt: skip
    found = cycle(a, restart_full=a_restart, restart_redraft_s=restart * EDGE_MS / 1e3, **timing)
    assert np.mean(gaps) == pytest.approx(found.gap_s, rel=0.03)
    assert len(short) / len(verdicts) == pytest.approx(found.restart_share, abs=0.03)
    assert verdict_gap(a, **timing) > 1.03 * found.gap_s


@pytest.mark.parametrize(
    ("alpha", "gamma", "restart", "ahead_pays"),
    [(0.8, 2, 0, True), (0.5, 3, 0, False), (0.5, 3, 2, True)],
)
def test_chains_in_flight_auto_sends_ahead_where_the_analysis_says_it_pays(
    alpha: float, gamma: int, restart: int, ahead_pays: bool
) -> None:
    """`chains_in_flight="auto"` at the two T_tree = 40 ms points of the analysis above: two
    chains in flight where they are faster, one where the stale passes make them slower; with
    a restart chain after each miss (only with two in flight) two pay there too (1.8 % faster
    than one on these seeds: the redraft overlaps the window)."""
    _, edge, _ = _iid_run("deepspec", alpha, gamma, 0, tree_ms=40.0, tree_budget=8,
                          chains_in_flight=2, adaptive_depth=True,
                          restart_length=restart)  # fmt: skip
    settled = edge.controller.depth_history[len(edge.controller.depth_history) // 2 :]
    assert set(settled) == ({2} if ahead_pays else {1})


def test_the_budget_follows_the_round_trip_and_stays_under_b_max() -> None:
    budgets = {}
    for rtt in (0.02, 0.08, 2.0):
        world_link = Link(bandwidth_bps=math.inf, rtt_s=rtt)
        alignment = VocabAlignment.identity(build_tokenizer("bytelevel", 300))
        spec = SyntheticSpec(0.6, vocab_size=alignment.target_width, seed=1)
        draft, target = SyntheticLM(spec, "draft"), SyntheticLM(spec, "target")
        per_tip = load_profile({"name": "e", "forward_ms": {"1": 5.0, "64": 5.0},
                                "tree_ms": {"1": 5.0, "64": 69.0}})  # fmt: skip
        edge = make_edge(
            "acespec",
            alignment=alignment,
            prompt="",
            settings=GenerationSettings(gamma=3, max_new_tokens=60, tree_budget=40),
            draft_encode=lambda _: [1, 2, 3],
            target_decode=lambda ids: "",
            tree_seconds=lambda n, p=per_tip: p.seconds(ComputeCost("tree", n=n)),
        )
        cloud = make_cloud(target_info(target, lambda _: [1, 2, 3], (alignment,)))
        executors = dict(
            edge_executor=session_executor(draft), cloud_executor=session_executor(target)
        )
        simulate(edge, cloud, world_link, per_tip, per_tip, **executors)
        budgets[rtt] = [sum(r["fanout"]) + 1 for r in edge.rounds_log][1:]
    assert max(budgets[0.02]) < min(budgets[0.08]) <= max(budgets[0.08]) < 40
    assert set(budgets[2.0]) == {40}  # B_max caps a long round trip


@pytest.mark.parametrize(("words", "seeds"), [(0, (0, 1)), (50, (0,))])
def test_deepspec_tree_auto_is_deepspec_where_no_chain_is_sent_ahead(
    words: int, seeds: tuple[int, ...]
) -> None:
    """At RTT 10 ms on AceSpec's testbed a tree takes longer to draft than the window: no chain
    goes ahead, so no fork would go up either, and every chain leaves its p̃ behind. The run is
    then deepspec's, token for token (the edge draws every residual, as acespec's does). A long
    prompt's prefill holds up the first verdict, so one chain goes ahead then: that one alone
    must not make the chains after it carry their p̃."""
    link = Link(bandwidth_bps=1e8, rtt_s=0.01)
    for seed in seeds:
        runs = {}
        for method in ("deepspec", "deepspec-tree"):
            runs[method] = wanspec.generate(
                synthetic_pair(0.8, seed), f"Question {seed}:" + " a number" * words, method,
                link=link, edge_profile="edge-orin", cloud_profile="cloud-a100x4-70b", gamma=4,
                max_new_tokens=64, seed=seed,
            )  # fmt: skip
        stats = runs["deepspec-tree"].stats
        assert runs["deepspec-tree"].token_ids == runs["deepspec"].token_ids
        assert stats.get("chains_sent_ahead", 0) == (1 if words else 0)
        # every chain verified went plain, and so did the one sent ahead that went stale
        plain = stats["rounds"] + stats.get("stale_chains_ahead", 0)
        assert stats["chains_plain"] == plain and stats["plain_rejections"] > 0
        assert "dists_rejections" not in stats


def test_deepspec_tree_auto_sends_the_dists_where_forks_pay_for_them() -> None:
    """At RTT 150 ms and 100 Mbit/s forks save a round trip for next to no bits: after the
    first chains every chain carries its p̃. At 50 kbit/s a chain's p̃ takes longer on the
    uplink than the forks it makes possible save (a round trip each, not the window: the cloud
    still verifies a fork), at the share they are taken in there: chains go without it."""
    plain = {}
    for rate, rtt in ((1e8, 0.15), (5e4, 0.05)):
        chains = plain[rate] = 0
        for seed in range(3):
            stats = wanspec.generate(
                synthetic_pair(0.8, seed), f"Question {seed}:", "deepspec-tree",
                link=Link(bandwidth_bps=rate, rtt_s=rtt), edge_profile="edge-orin",
                cloud_profile="cloud-a100x4-70b", gamma=4, max_new_tokens=256, seed=seed,
            ).stats  # fmt: skip
            plain[rate] += stats.get("chains_plain", 0)
            chains += stats["rounds"] + stats.get("forks_sent", 0) - stats.get("forks_taken", 0)
            assert rate < 1e8 or stats.get("forks_taken", 0) > 0
        plain[rate] /= chains
    assert plain[1e8] < 0.05 and plain[5e4] > 0.9, plain


@pytest.mark.parametrize("seed", [1, 11])
def test_forks_leave_a_slow_uplink_mostly_to_the_chains(seed: int) -> None:
    """At 50 kbit/s (α = 0.6) a chain's p̃ pays only where forks are taken often, and the
    forks go up only as the uplink, at the rate the edge fits, carries them in time. On these
    seeds the fit once took a rate 25 times too fast from three windows whose verdicts differed
    in size, and forks kept the uplink busy for most of the run; the handshake's round trip,
    its own messages' sending included, made p̃ look worth a slow uplink's time."""
    rate = 5e4
    stats = wanspec.generate(
        synthetic_pair(0.6, seed), f"Question {seed}:", "deepspec-tree",
        link=Link(bandwidth_bps=rate, rtt_s=0.05), edge_profile="edge-orin",
        cloud_profile="cloud-a100x4-70b", gamma="auto", chains_in_flight="auto",
        max_new_tokens=64, seed=seed,
    ).stats  # fmt: skip
    assert stats["uplink_bits"] / (rate * stats["time_s"]) < 0.2, stats
    assert stats.get("forks_sent", 0) < 20, stats


def test_small_chains_on_a_fast_link_do_not_keep_their_dists_behind() -> None:
    """150 ms at 100 Mbit/s (α = 0.6), a chain of one token after each miss: the chains sent
    alone were so small that their windows fitted every rate down to 25 kbit/s alike, and priced
    there a chain's p̃ never paid, so no chain carried the bits that would have corrected the
    fit, and no fork went on (1 taken in 29 rounds). A rate the windows do not pin down prices
    nothing: the p̃ goes, and forks are taken."""
    seed = 4
    stats = wanspec.generate(
        synthetic_pair(0.6, seed), f"Question {seed}:", "deepspec-tree",
        link=Link(bandwidth_bps=1e8, rtt_s=0.15), edge_profile="edge-orin",
        cloud_profile="cloud-a100x4-70b", gamma=4, restart_length=1, max_new_tokens=48,
        seed=seed, top_p=1.0,
    ).stats  # fmt: skip
    assert stats.get("chains_plain", 0) < 0.2 * stats["rounds"], stats
    assert stats.get("forks_taken", 0) > 0.2 * stats["rounds"], stats


def test_a_fork_taken_with_its_tree_drafted_sends_its_forks_as_the_uplink_allows(
    shared_world: World,
) -> None:
    """The next chain's passes draft the likeliest forks' trees along; a fork taken whose tree
    is drafted sends its own alternatives as forks, as many as the measured uplink carries in
    time (all of them, on a fast link). A tree drafted along must keep its start time, or its
    room reads as unmeasured and only `FORKS_UNMEASURED` go up: its other rejections would
    cost a window."""
    edge_profile, cloud_profile = load_profile("edge-orin"), load_profile("cloud-a100x4-70b")
    per_fork, taken = [], 0
    for seed in range(2):
        sim, edge, _ = shared_world.run(
            "deepspec-tree", link=Link(1e8, 0.15), profile=edge_profile,
            cloud_profile=cloud_profile, trace=True, gamma=4, seed=seed, max_new_tokens=64,
            temperature=1.0,
        )  # fmt: skip
        sent = [r.info["msg"] for r in sim.trace if r.side == "edge" and r.what == "send"]
        forks = [m for m in sent if isinstance(m, wire.DraftWithDists) and m.fork is not None]
        fork_rounds = {m.round for m in forks}
        per_fork += Counter(m.fork[0] for m in forks if m.fork[0] in fork_rounds).values()
        taken += edge.counters.get("fork_trees_taken", 0)
    assert taken >= 4 and len(per_fork) >= 4
    # what goes up naming a fork: its alternatives and its continuation
    assert np.median(per_fork) > FORKS_UNMEASURED + 1
