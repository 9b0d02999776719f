"""Every lossless method's law pooled over many positions and seeds, on pairs built to break it.

The enumerated tests (test_protocols_exact_law.py) give the first token's law exactly, and the
sampled tests of test_protocols.py look at the first two tokens; neither reaches what happens
later in a run: a chain taken from the tree, a redraft after a rejection at any offset, a full
acceptance followed by a rejection, an SR-DV fallback. A reused random stream shows only there.

Here both models have one next-token distribution after every context (`FixedLaw`), so the
target's tokens are i.i.d. q: an exact method's tokens, pooled over 50 positions of many seeded
runs, are i.i.d. q too. Two χ² tests per setting: the tokens' frequencies (the law of a position)
and the frequencies of disjoint pairs (2t, 2t + 1) (a token's dependence on the one before). The
pairs are skewed where exactness breaks: the draft puts mass outside q's support and its residual
max(q − p̃, 0) is not proportional to q, so a proposal drawn with a reused uniform, a residual over
the wrong set or a coin with the wrong odds moves the frequencies. A third pair over-proposes a
token q holds, so that a coin is drawn at its rejections: a residual drawn with that coin's
uniform (coins and residuals are keyed by output position) shows there. Each setting also checks
that the paths it is there for really occurred (rejections at every offset, full acceptances,
hits from the alternatives, redrafts, SR-DV fallbacks, both HR regions).

Power, measured against the pipelines' old stream keying (the continuation after a full chain
drawn one position too far, so a rejection's next proposal reused the rejected token's uniform):
`test_the_pooled_law_test_sees_a_reused_draft_stream` plants it and needs p < ALPHA.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from scipy.stats import chi2

from wanspec.protocols import pipeline, registry, speculative
from wanspec.protocols.candidates import CandidatePlanner
from wanspec.protocols.resample_choice import Mechanism, MechanismChooser
from wanspec.sim import Link, load_profile
from worlds import FixedLaw, World

pytestmark = pytest.mark.statistical

ALPHA = 1e-4  # per test and statistic: ~60 of them, fixed seeds, so a false alarm is ~0.6 %
TOKENS = 50  # positions per run

# Shared vocabulary: q = 3:2:1 on a, b, c; the draft 0.45 / 0.1 / 0.15 on a, b, c and 0.15 on
# each of two tokens q lacks (only those are ever rejected). The residual ∝ (0.05, 0.233, 0.017)
# lies mostly on b: a position drawn from it when it should not be moves b's frequency most.
A, B, C, D, E = 65, 66, 67, 68, 69  # 'a' … 'e' in both tiny byte-level vocabularies
SHARED_Q = {A: 3 / 6, B: 2 / 6, C: 1 / 6}
SHARED_P = {A: 0.45, B: 0.1, C: 0.15, D: 0.15, E: 0.15}

# The same q with a draft that over-proposes a (0.8 against 0.5) and puts 0.1 on d, outside q's
# support: a's rejections are decided by a drawn coin (odds 5/8), and their residual
# (0, 0.283, 0.117 on a, b, c) is drawn right after, at the same position. A residual drawn with
# the rejecting coin's uniform (u ≥ 5/8) lands on c seven times in nine, not 0.29.
OVERPROPOSED_P = {A: 0.8, B: 0.05, C: 0.05, D: 0.1}

# Different vocabularies: q = 3:2:1 on 'a', 'b' (in C) and 'ĠĠ' (LLM-only: the draft vocabulary
# spells it otherwise); the draft 0.4 / 0.2 on 'a', 'b', 0.15 on 'c' and 'd' (in C, outside q's
# support) and 0.1 on 'ing' (a draft-only token TLI leaves out). After TLI p̃ = 4/9, 2/9, 1/6,
# 1/6; the residual (1/18, 1/9 on C, θ_o = 1/6) is not ∝ q.
O_TOKEN = 286  # 'ĠĠ' in the target's vocabulary
HETERO_Q = {A: 3 / 6, B: 2 / 6, O_TOKEN: 1 / 6}
ALL_TREE = ("redraft", "alternative")  # tree settings with both misses and alternatives' hits
AHEAD = (*ALL_TREE, "ahead verified", "ahead stale")  # and chains sent before their verdicts
FORKS = (*AHEAD, "fork taken", "fork stale")  # and the tree's branches sent as forks
# and forks whose trees the next chain's passes drafted: taken, also mid-pass, and dropped
FORK_TREES = (*FORKS, "fork tree taken", "fork tree dropped")
TESTBED = {"profile": load_profile("edge-orin"), "cloud_profile": load_profile("cloud-a100x4-70b")}
# The draft proposing from a reshaped p̃ (its top token's mass × 0.3), which it reports: in the
# shared world p̃ = 0.197 / 0.146 / 0.219 on a, b, c and 0.219 on d, e, so c's acceptance odds
# are q/p̃ < 1 where the plain p̃ had them > 1, and the residual (0.303, 0.187, 0) is not ∝ q.
RESHAPE = {"draft_reshape": 0.3, "draft_reshape_top": 1}


def _shared_world(draft_law: dict[int, float]) -> World:
    """One vocabulary: the target's law SHARED_Q, the draft's `draft_law`."""
    world = World(shared=True)
    width = world.alignment.target_width
    return world.with_models(
        FixedLaw(0.0, width, law=tuple(SHARED_Q.items())),
        FixedLaw(0.0, width, law=tuple(draft_law.items())),
    )


def _hetero_world() -> World:
    world = World(shared=False)
    align = world.alignment
    assert align.in_common[[A, B, C, D]].all() and align.llm_only[O_TOKEN]
    draft_only = 154  # 'ing' in the draft's vocabulary, no target token spells it alone
    assert not align.draft_in_common[draft_only]
    to_draft = {t: int(align.target_to_draft[t]) for t in (A, B, C, D)}
    draft_law = {to_draft[A]: 0.4, to_draft[B]: 0.2, to_draft[C]: 0.15, to_draft[D]: 0.15}
    return world.with_models(
        FixedLaw(0.0, align.target_width, law=tuple(HETERO_Q.items())),
        FixedLaw(0.0, align.draft_width, law=(*draft_law.items(), (draft_only, 0.1))),
    )


@pytest.fixture(scope="module")
def worlds() -> dict[str, World]:
    return {
        "shared": _shared_world(SHARED_P),
        "hetero": _hetero_world(),
        "overproposed": _shared_world(OVERPROPOSED_P),
    }


Q_OF = {"shared": SHARED_Q, "hetero": HETERO_Q, "overproposed": SHARED_Q}


def _chi2_p(observed: np.ndarray, expected: np.ndarray) -> float:
    stat = float(((observed - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, len(observed) - 1))


def pooled_p_values(runs: list[list[int]], q: dict[int, float]) -> tuple[float, float]:
    """χ² p-values of the tokens' frequencies and of disjoint pairs' frequencies against q."""
    support = list(q)
    probs = np.array([q[t] for t in support])
    counts = Counter(t for run in runs for t in run)
    outside = set(counts) - set(support)
    assert not outside, f"tokens outside q's support: {outside}"
    single = np.array([counts[t] for t in support], dtype=float)
    pairs = Counter(p for run in runs for p in zip(run[0::2], run[1::2], strict=False))
    joint = np.array([pairs[(a, b)] for a in support for b in support], dtype=float)
    expected_joint = np.outer(probs, probs).ravel() * joint.sum()
    return _chi2_p(single, probs * single.sum()), _chi2_p(joint, expected_joint)


def pooled_runs(world: World, method: str, seeds: int, **settings: Any) -> tuple[list, Counter]:
    """Tokens of `seeds` runs of TOKENS tokens each, and the edges' counters (plus how often each
    number of tokens was accepted in a round, as `accepted=k`) summed over the runs."""
    runs, paths = [], Counter()
    for seed in range(seeds):
        sim, edge, _ = world.run(
            method, seed=seed, max_new_tokens=TOKENS, temperature=1.0, **settings
        )
        assert len(sim.tokens) == TOKENS, sim.finish_reason
        runs.append(sim.tokens)
        paths.update(edge.counters)
        paths.update(f"accepted={k}" for k in edge.accepted_per_round)
    return runs, paths


# (world, method, seeds, settings, paths that must occur besides rejections at every offset and
# full acceptances): every lossless method, several γ, budgets, tree shapes, K / M
SETTINGS = [
    ("shared", "ar", 40, {}, ()),
    ("shared", "sd", 50, {"gamma": 2}, ()),
    ("shared", "cosd", 50, {"gamma": 1}, ()),
    ("shared", "cosd", 50, {"gamma": 3}, ()),
    ("shared", "naive", 50, {"gamma": 2}, ()),
    ("shared", "ul", 50, {"gamma": 2}, ()),
    ("shared", "xcosd", 50, {"gamma": 2}, ()),
    ("shared", "xcosd-e", 50, {"gamma": 2, "srdv_k": 1, "srdv_m": 1}, ("fallback",)),
    ("shared", "picospec", 100, {"gamma": 1}, ("redraft",)),
    ("shared", "picospec", 80, {"gamma": 2}, ("redraft",)),
    ("shared", "picospec", 50, {"gamma": 4}, ("redraft",)),
    ("shared", "acespec", 80, {"gamma": 1, "tree_budget": 2, "tree_fixed": True}, ALL_TREE),
    (
        "shared",
        "acespec",
        40,
        {"gamma": 2, "tree_budget": 8, "tree_allocation": "uniform"},
        ("alternative",),
    ),
    (
        "shared",
        "acespec",
        60,
        {"gamma": 3, "tree_budget": 3, "tree_allocation": "single"},
        ALL_TREE,
    ),
    ("shared", "acespec", 60, {"gamma": 2, "tree_budget": 2}, ALL_TREE),
    ("shared", "acespec", 60, {"gamma": 2, "tree_budget": 2, **RESHAPE}, ALL_TREE),
    ("shared", "sd", 50, {"gamma": 2, **RESHAPE}, ()),
    # a coin drawn at the rejections, then the residual at the same position (on the edge for
    # cosd and acespec, on the cloud for ul, sd and deepspec-tree)
    ("overproposed", "cosd", 30, {"gamma": 2}, ()),
    ("overproposed", "ul", 30, {"gamma": 2}, ()),
    ("overproposed", "sd", 30, {"gamma": 2}, ()),
    ("overproposed", "acespec", 30, {"gamma": 2, "tree_budget": 2}, ("redraft",)),
    ("overproposed", "deepspec-tree", 30, {"gamma": 2, "tree_budget": 4}, FORKS),
    ("shared", "deepspec", 80, {"gamma": 1, "tree_budget": 2, "tree_fixed": True}, AHEAD),
    (
        "shared",
        "deepspec",
        60,
        {"gamma": 2, "tree_budget": 4, "restart_length": 1},
        (*AHEAD, "restart"),
    ),
    ("shared", "deepspec", 60, {"gamma": 1, "tree_budget": 3, "chains_in_flight": 4}, AHEAD),
    (
        "shared",
        "deepspec-tree",
        80,
        {"gamma": 1, "tree_budget": 2, "tree_fixed": True},
        FORK_TREES,
    ),
    (
        "shared",
        "deepspec-tree",
        60,
        {"gamma": 2, "tree_budget": 4},
        FORK_TREES,
    ),
    (  # AceSpec's testbed: a verdict often comes while the pass drafting forks' trees runs
        "shared",
        "deepspec-tree",
        30,
        {"gamma": 3, "tree_budget": 8, "link": Link(1e8, 0.1), **TESTBED},
        (*FORK_TREES, "fork tree mid-pass", "restart"),
    ),
    (
        "shared",
        "deepspec-tree",
        60,
        {"gamma": 3, "tree_budget": 3, "chains_in_flight": 4},
        (*FORK_TREES, "restart"),
    ),
    ("hetero", "naive", 50, {"gamma": 2}, ()),
    ("hetero", "ul", 50, {"gamma": 2}, ()),
    ("hetero", "xcosd", 50, {"gamma": 2}, ()),
    ("hetero", "xcosd", 50, {"gamma": 3, "hr_piggyback": False}, ("o_request",)),
    ("hetero", "xcosd", 50, {"gamma": 2, **RESHAPE}, ()),
    ("hetero", "xcosd-e", 50, {"gamma": 2, "srdv_k": 1, "srdv_m": 1}, ("fallback",)),
    ("hetero", "xcosd-e", 50, {"gamma": 3, "srdv_k": 4, "srdv_m": 2}, ("fallback",)),
    ("hetero", "acespec-x", 80, {"gamma": 1, "tree_budget": 2, "tree_fixed": True}, ALL_TREE),
    (
        "hetero",
        "acespec-x",
        50,
        {"gamma": 2, "tree_budget": 8, "srdv_k": 1, "srdv_m": 1},
        ("alternative", "fallback"),
    ),
    (
        "hetero",
        "acespec-x",
        50,
        {"gamma": 3, "tree_budget": 3, "tree_allocation": "single"},
        ALL_TREE,
    ),
    (
        "hetero",
        "deepspec-x",
        50,
        {"gamma": 2, "tree_budget": 4, "srdv_k": 1, "srdv_m": 1, "restart_length": 1},
        (*AHEAD, "fallback", "restart"),
    ),
    ("hetero", "deepspec-tree", 60, {"gamma": 2, "tree_budget": 4}, FORK_TREES),
]


def _ids(setting: tuple) -> str:
    world, method, _, settings, _ = setting
    shown = {k: v for k, v in settings.items() if isinstance(v, int | float | str)}
    return "-".join([world, method, *(f"{k}={v}" for k, v in shown.items())])


def _check_paths(method: str, settings: dict, paths: Counter, wanted: tuple[str, ...]) -> None:
    """The paths this setting is there for occurred: rejections at every offset and full
    acceptances, and the `wanted` ones."""
    if method == "ar":
        return
    gamma = settings["gamma"]
    missing = [k for k in range(gamma + 1) if not paths[f"accepted={k}"]]
    assert not missing, f"no round accepted {missing} tokens"
    seen = {
        "redraft": paths["redrafts"] > 0,
        # a lookup after a full chain hits the continuation at most once per full chain: more
        # hits than that are chains taken from the alternatives
        "alternative": paths["cache_hits"] > paths[f"accepted={gamma}"],
        "fallback": paths["srdv_fallbacks"] > 0,
        "o_request": paths["hr_o_requests"] > 0,
        "ahead verified": paths["chains_sent_ahead"] > paths["stale_chains_ahead"],
        "ahead stale": paths["stale_chains_ahead"] > 0,
        "fork taken": paths["forks_taken"] > 0,
        "fork stale": paths["forks_sent"] > paths["forks_taken"],
        "fork tree taken": paths["fork_trees_taken"] > 0,
        "fork tree mid-pass": paths["fork_trees_taken_in_flight"] > 0,
        "fork tree dropped": paths["fork_trees_dropped"] > 0,
        "restart": paths["restart_chains"] > 0,
    }
    assert all(seen[name] for name in wanted), (seen, paths)


@pytest.mark.parametrize("setting", SETTINGS, ids=_ids)
def test_pooled_tokens_are_iid_q_on_skewed_pairs(worlds: dict[str, World], setting: tuple) -> None:
    world_name, method, seeds, settings, wanted = setting
    runs, paths = pooled_runs(worlds[world_name], method, seeds, **settings)
    p_single, p_pairs = pooled_p_values(runs, Q_OF[world_name])
    assert p_single > ALPHA and p_pairs > ALPHA, (p_single, p_pairs)
    _check_paths(method, settings, paths, wanted)


class _Alternating(MechanismChooser):
    """xcosd-auto's chooser turning over every round: SR-DV, HR, SR-DV, … (a choice that
    depends on the past only, as the measured one does), so one run mixes both mechanisms."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0

    def choose(self) -> Mechanism:
        self.rounds += 1
        return Mechanism.SRDV if self.rounds % 2 else Mechanism.HR


@pytest.mark.parametrize("gamma", [1, 2])
def test_xcosd_auto_mixing_both_mechanisms_keeps_the_pooled_law(
    worlds: dict[str, World], monkeypatch: pytest.MonkeyPatch, gamma: int
) -> None:
    """Rounds resolved by HR (O-samples asked for: no piggyback) and by SR-DV (one candidate in
    one round, so fallbacks are common) follow each other in every run: a round's acceptance
    decided with the other mechanism's q, or a follow-up answered by the wrong one, moves the
    frequencies or ends the run."""
    monkeypatch.setattr(speculative, "MechanismChooser", _Alternating)
    settings = {"gamma": gamma, "srdv_k": 1, "srdv_m": 1, "hr_piggyback": False}
    runs, paths = pooled_runs(worlds["hetero"], "xcosd-auto", 60, **settings)
    p_single, p_pairs = pooled_p_values(runs, HETERO_Q)
    assert p_single > ALPHA and p_pairs > ALPHA, (p_single, p_pairs)
    _check_paths("xcosd-auto", settings, paths, ("fallback", "o_request"))
    assert paths["rejections_hr"] > 50 and paths["rejections_srdv"] > 50, paths
    assert paths["hr_region_C"] > 0 and paths["srdv_candidate_rounds"] > 0


class _CyclingPlan(CandidatePlanner):
    """SR-DV's (K, M) turning over after every resolved rejection, whatever the link (a plan
    that depends on the past only, as the measured one does): one run has single-candidate
    fallbacks, several sets before a fallback, and a new first-set K sent to the cloud."""

    PLANS = ((1, 1), (2, 3), (16, 1), (1, 2), (3, 1))

    def replan(self) -> tuple[int, int]:
        self.k, self.m = self.PLANS[len(self.history) % len(self.PLANS)]
        self.history.append((self.k, self.m))
        return self.k, self.m


@pytest.mark.parametrize(
    ("method", "settings"),
    [("xcosd-e", {"gamma": 2}), ("deepspec-x", {"gamma": 2, "tree_budget": 4})],
    ids=["xcosd-e", "deepspec-x"],
)
def test_srdv_k_and_m_changing_between_rejections_keep_the_pooled_law(
    worlds: dict[str, World], monkeypatch: pytest.MonkeyPatch, method: str, settings: dict
) -> None:
    """K and M change after every rejection: a first set answered with a stale K, a request
    past the edge's M, or a β estimate that touched the rng moves the frequencies."""
    monkeypatch.setattr(registry, "CandidatePlanner", _CyclingPlan)
    settings = {**settings, "srdv_k": "auto", "srdv_m": "auto"}
    runs, paths = pooled_runs(worlds["hetero"], method, 60, **settings)
    p_single, p_pairs = pooled_p_values(runs, HETERO_Q)
    assert p_single > ALPHA and p_pairs > ALPHA, (p_single, p_pairs)
    _check_paths(method, settings, paths, ("fallback",))
    # every plan was used: new first-set sizes, and more sets than rejected positions
    assert paths["first_candidates_set"] > 50, paths
    assert paths["srdv_candidate_rounds"] > paths["srdv_fallbacks"] + 50, paths


def _every_other_chain_plain(self: Any, rnd: Any, *, alone: bool) -> bool:
    """deepspec-tree's choice of p̃ per chain turning over with the round number (a choice that
    depends on the past only, as the measured one does)."""
    return rnd.index % 2 == 1


@pytest.mark.parametrize(("world_name", "gamma"), [("shared", 1), ("shared", 2), ("hetero", 2)])
def test_deepspec_tree_mixing_chains_with_and_without_dists_keeps_the_pooled_law(
    worlds: dict[str, World], monkeypatch: pytest.MonkeyPatch, world_name: str, gamma: int
) -> None:
    """Chains with p̃ (the cloud draws a rejection's token, from the float q, and may go on with
    a fork) and without (q̂ comes down, the edge draws it) in one run, sent alone and ahead, on
    one vocabulary and across two (TLI): a mechanism that followed the wrong message type, or a
    fork taken after a plain chain, moves the frequencies."""
    monkeypatch.setattr(pipeline.PipelineEdge, "_goes_plain", _every_other_chain_plain)
    settings = {"gamma": gamma, "tree_budget": 4}
    runs, paths = pooled_runs(worlds[world_name], "deepspec-tree", 60, **settings)
    p_single, p_pairs = pooled_p_values(runs, Q_OF[world_name])
    assert p_single > ALPHA and p_pairs > ALPHA, (p_single, p_pairs)
    _check_paths("deepspec-tree", settings, paths, ("fork taken", "ahead verified"))
    assert paths["plain_rejections"] > 50 and paths["dists_rejections"] > 50, paths
    assert paths["chains_plain_ahead"] > 20, paths


def _reuse_the_rejected_tokens_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant the old keying: the continuation after a full chain starts one position too far,
    so its chain's tokens are drawn with the next position's stream."""
    monkeypatch.setattr(
        pipeline.Branch, "continuation", classmethod(lambda cls, g, last: cls(g, last, g + 1))
    )


def test_a_reused_draft_stream_is_caught_on_every_run(
    worlds: dict[str, World], monkeypatch: pytest.MonkeyPatch
) -> None:
    _reuse_the_rejected_tokens_stream(monkeypatch)
    with pytest.raises(RuntimeError, match="draft streams"):
        for seed in range(20):  # a full chain and then a rejection: within a few seeds
            worlds["shared"].run("picospec", seed=seed, max_new_tokens=TOKENS, gamma=1)


def test_the_pooled_law_test_sees_a_reused_draft_stream(
    worlds: dict[str, World], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the per-run check switched off, the pooled χ² itself rejects the old keying on the
    γ = 1 setting above (same seeds): the statistical test has the power to see the defect."""
    _reuse_the_rejected_tokens_stream(monkeypatch)
    monkeypatch.setattr(pipeline.PipelineEdge, "_check_streams", lambda self, rnd, n: None)
    runs, _ = pooled_runs(worlds["shared"], "picospec", 100, gamma=1)
    p_single, p_pairs = pooled_p_values(runs, SHARED_Q)
    assert min(p_single, p_pairs) < ALPHA
