"""Every method's first-token law, enumerated exactly through the real machines on the simulator.

The law tests of tests/test_protocols.py sample hundreds of runs and bound the TV distance,
which sees a gross error but not a residual normalised over the wrong set or a coin with the
wrong odds, and takes minutes. Here one `ScriptedRng` (tests/exact_rng.py) stands in for every
random stream of a run (the edge's, the cloud's, the streams keyed by output position), and the
run is repeated for every outcome of every draw: the first token's law comes out as exact
fractions of the floats the machines used, in well under a second per method.

The draft's 16-bit draw `sample(counts, rng)` is the one draw with 65,536 outcomes; the test
routes it through `pick(counts, rng)`, which has the same law (counts[i] / total, proven on the
sampling floor by test_sampling_quant_exact.py), so the enumeration branches once per token.

The draft here is a synthetic model whose distribution is NOT proportional to the target's on
the target's support (the World's default draft is, and then the residual equals q and a
residual computed wrongly could pass); both models have supports of a few tokens, so a law is a
tree of tens of runs. Each method's law is compared with the law it promises:
q itself (float-q schemes), the rounded q̂ (schemes that ship q), q̂ on C plus θ̂_o spread by q
on O (HR), and the lossy baselines' own laws (GR: argmax replacement; TR: residual over the top
k of q̂).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest

from exact_rng import ScriptedRng, exact_law
from wanspec.models.synthetic import SyntheticSpec
from wanspec.protocols import pipeline, speculative, stream
from wanspec.protocols.resample_choice import Mechanism, MechanismChooser
from wanspec.protocols.settings import GenerationSettings
from wanspec.sampling import hybrid_bins, pick, proposal, round_probs, target_probs
from wanspec.sampling.logits import TorchLogitRows
from worlds import PROMPT_IDS, FixedLaw, World

TOLERANCE = 1e-9  # float64 sums of the floats the machines drew with; any planted bug is > 1e-6
# one token, one draft; SR-DV with one candidate and one round unless a test says otherwise (each
# candidate multiplies the paths by the target's support)
SETTINGS = {
    "max_new_tokens": 1,
    "gamma": 1,
    "temperature": 1.3,
    "q_bits": 16,
    "srdv_k": 1,
    "srdv_m": 1,
}


def _pick_counts(counts: np.ndarray, rng: object) -> int:
    """`sample`'s law (counts[i] / total) drawn as one pick, so the enumeration stays small."""
    return pick(counts, rng)


def _small(world: World, target: SyntheticSpec, draft: SyntheticSpec) -> World:
    """`world` with small-support synthetic models (few outcomes per draw: a small tree)."""
    return world.with_models(target, draft)


@pytest.fixture(scope="module")
def skewed_world() -> World:
    """One vocabulary; the target puts 3:2:1 on three tokens, the draft α·(2:1) on the first two
    and the rest uniformly on three others (the target's third among them): q − p̃ is then not
    proportional to q, so a wrong residual changes the law."""
    world = World(shared=True)
    width = world.alignment.target_width
    return _small(
        world,
        SyntheticSpec(0.6, width, seed=1, target_support=3, draft_extra=2),
        SyntheticSpec(0.6, width, seed=1, target_support=2, draft_extra=3),
    )


@pytest.fixture(scope="module")
def small_hetero_world() -> World:
    """Different tokenizers: the three-token target has two tokens in O and one in C, which the
    four-token draft (seed 65, found by search) also proposes."""
    world = World(shared=False)
    return _small(
        world,
        SyntheticSpec(0.6, world.alignment.target_width, seed=1, target_support=3, draft_extra=2),
        SyntheticSpec(0.6, world.alignment.draft_width, seed=65, target_support=2, draft_extra=2),
    )


@pytest.fixture(scope="module")
def overdrafted_hetero_world() -> World:
    """Different tokenizers, each model one law after every context: the target 1:1:3 on 'a',
    'b' (in C) and 'ĠĠ' (in O); the draft 4:1 on 'a' and 'c' (in C), so it over-proposes 'a'
    and the acceptance odds q(a)/p̃(a) < 1 depend on whether the cloud decides with q or with
    the q̂ it ships (in small_hetero_world the one shared token has p̃ < q: accepted surely)."""
    world = World(shared=False)
    align = world.alignment
    a, b, c, o = 65, 66, 67, 286
    assert align.in_common[[a, b, c]].all() and align.llm_only[o]
    to_draft = {t: int(align.target_to_draft[t]) for t in (a, c)}
    return world.with_models(
        FixedLaw(0.0, align.target_width, law=((a, 0.2), (b, 0.2), (o, 0.6))),
        FixedLaw(0.0, align.draft_width, law=((to_draft[a], 0.8), (to_draft[c], 0.2))),
    )


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict]:
    """law(world, method, **settings): the exact law of the first generated token."""
    holder: dict[str, object] = {"rng": np.random.default_rng(0)}  # for `_first_position`
    for module in (speculative, stream):
        monkeypatch.setattr(module, "request_rng", lambda seed, side: holder["rng"])
    for module in (speculative, pipeline):
        monkeypatch.setattr(module, "position_rng", lambda seed, draw, position: holder["rng"])
    monkeypatch.setattr(proposal, "sample", _pick_counts)  # every drafted token's draw

    def law(world: World, method: str, **settings: object) -> dict:
        def run(rng: ScriptedRng) -> int:
            holder["rng"] = rng
            sim, _, _ = world.run(method, **{**SETTINGS, **settings})
            return sim.tokens[0]

        return exact_law(run, max_runs=20_000)

    return law


def _first_position(world: World, **settings: object) -> tuple[np.ndarray, np.ndarray]:
    """(q, p̃) at the first position: the target's float q and the draft's 16-bit p̃."""
    params = GenerationSettings(**{**SETTINGS, **settings}).sampling
    world.target.reset()
    q = target_probs(world.target.extend(PROMPT_IDS)[-1], params, world.alignment.target_valid)
    edge = world.edge("naive", **{**SETTINGS, **settings})
    world.draft.reset()
    edge.draft_params = params  # repetition_penalty is 1 here, as the edge sets it
    logits = world.draft.extend(PROMPT_IDS)[-1:]
    edge._take(TorchLogitRows(logits))
    return q, edge.round.dists[0].probs()


def _speculative_law(q_accept: np.ndarray, p: np.ndarray, replace: np.ndarray) -> np.ndarray:
    """One drafted token x ~ p̃, kept with min(1, q/p̃), else a token of `replace` (a law)."""
    keep = np.where(p > 0, np.minimum(p, q_accept), 0.0)
    return keep + (1.0 - keep.sum()) * replace


def _as_vector(law: dict, width: int) -> np.ndarray:
    out = np.zeros(width)
    for token, prob in law.items():
        out[token] = float(Fraction(prob))
    return out


def _assert_law(law: dict, expected: np.ndarray) -> None:
    got = _as_vector(law, expected.size)
    assert set(law) == set(np.flatnonzero(expected > 0).tolist())
    assert np.abs(got - expected).max() < TOLERANCE, np.abs(got - expected).max()


@pytest.mark.parametrize("method", ["sd", "ul", "xcosd-e", "ar"])
def test_float_q_methods_draw_q_exactly(skewed_world: World, scripted, method: str) -> None:
    q, _ = _first_position(skewed_world)
    _assert_law(scripted(skewed_world, method), q / q.sum())


@pytest.mark.parametrize("srdv", [{"srdv_k": 1, "srdv_m": 2}, {"srdv_k": 2, "srdv_m": 1}])
def test_srdv_draws_q_exactly_for_any_k_and_m(skewed_world: World, scripted, srdv) -> None:
    q, _ = _first_position(skewed_world)
    _assert_law(scripted(skewed_world, "xcosd-e", **srdv), q / q.sum())


@pytest.mark.parametrize("method", ["cosd", "naive", "picospec"])
def test_methods_that_ship_q_draw_the_rounded_q_exactly(
    skewed_world: World, scripted, method: str
) -> None:
    q, _ = _first_position(skewed_world)
    q_hat = round_probs(q, SETTINGS["q_bits"]).probs
    assert np.abs(q_hat - q).max() > 1e-7  # the rounding is visible at this temperature
    _assert_law(scripted(skewed_world, method), q_hat)


def _hybrid_law(world: World) -> np.ndarray:
    """HR's first-token law: q̂ rounded on C, plus θ̂_o spread by the float q on O."""
    q, p = _first_position(world)
    alignment = world.alignment
    common = alignment.in_common
    rounded = round_probs(hybrid_bins(q, common, alignment.common_target_ids), SETTINGS["q_bits"])
    expected = np.zeros(q.size)
    expected[alignment.common_target_ids] = rounded.probs[:-1]
    o_mass = np.where(common, 0.0, q)
    assert rounded.probs[-1] > 0.05 and o_mass.sum() > 0  # region O is really in play
    expected += rounded.probs[-1] * o_mass / o_mass.sum()
    assert np.any((p > 0) & (q > 0))  # the draft shares a token with q: acceptance in play
    assert np.abs(expected - q).max() > 1e-7  # and the law is not the float q's
    return expected


HETERO_WORLDS = ["small_hetero_world", "overdrafted_hetero_world"]


@pytest.mark.parametrize("world_name", HETERO_WORLDS)
@pytest.mark.parametrize("piggyback", [True, False])
def test_hybrid_resampling_draws_rounded_c_and_theta_o_spread_by_q(
    request: pytest.FixtureRequest, scripted, world_name: str, piggyback: bool
) -> None:
    world = request.getfixturevalue(world_name)
    expected = _hybrid_law(world)  # before the scripted runs: it drafts a token
    _assert_law(scripted(world, "xcosd", hr_piggyback=piggyback), expected)


class _Forced(MechanismChooser):
    """xcosd-auto's chooser pinned to one mechanism, so its law can be enumerated."""

    def __init__(self, mechanism: Mechanism) -> None:
        super().__init__()
        self.mechanism = mechanism

    def choose(self) -> Mechanism:
        return self.mechanism


@pytest.mark.parametrize("world_name", HETERO_WORLDS)
@pytest.mark.parametrize("piggyback", [True, False])
def test_xcosd_auto_forced_to_hr_draws_hybrid_resamplings_law(
    request: pytest.FixtureRequest,
    scripted,
    monkeypatch: pytest.MonkeyPatch,
    world_name: str,
    piggyback: bool,
) -> None:
    """An HR round of xcosd-auto is decided by both sides with q̂ on C, as xcosd's: a cloud that
    accepted with the float q (SR-DV's) while the edge resamples from q̂ would move the law."""
    monkeypatch.setattr(speculative, "MechanismChooser", lambda: _Forced(Mechanism.HR))
    world = request.getfixturevalue(world_name)
    expected = _hybrid_law(world)
    _assert_law(scripted(world, "xcosd-auto", hr_piggyback=piggyback), expected)


@pytest.mark.parametrize("world_name", HETERO_WORLDS)
@pytest.mark.parametrize("srdv", [{}, {"srdv_k": 1, "srdv_m": 2}, {"srdv_k": 2, "srdv_m": 1}])
def test_xcosd_auto_forced_to_srdv_draws_q_exactly(
    request: pytest.FixtureRequest,
    scripted,
    monkeypatch: pytest.MonkeyPatch,
    world_name: str,
    srdv: dict,
) -> None:
    """An SR-DV round is decided with the float q throughout: a cloud that accepted with HR's
    q̂ would move the law off q."""
    monkeypatch.setattr(speculative, "MechanismChooser", lambda: _Forced(Mechanism.SRDV))
    world = request.getfixturevalue(world_name)
    q, _ = _first_position(world)
    _assert_law(scripted(world, "xcosd-auto", **srdv), q / q.sum())


def test_greedy_replacement_replaces_by_the_argmax_exactly(skewed_world: World, scripted) -> None:
    q, p = _first_position(skewed_world)
    argmax = np.zeros(q.size)
    argmax[int(np.argmax(q))] = 1.0
    _assert_law(scripted(skewed_world, "gr"), _speculative_law(q, p, argmax))


@pytest.mark.parametrize("k", [1, 2])
def test_truncated_residual_draws_the_residual_over_the_top_k_of_rounded_q(
    skewed_world: World, scripted, k: int
) -> None:
    q, p = _first_position(skewed_world)
    q_hat = round_probs(q, SETTINGS["q_bits"]).probs
    top = np.argsort(-q_hat, kind="stable")[:k]
    residual = np.zeros(q.size)
    residual[top] = np.maximum(q_hat[top] - p[top], 0.0)
    assert residual.sum() > 0
    law = scripted(skewed_world, "tr", tr_k=k)
    _assert_law(law, _speculative_law(q_hat, p, residual / residual.sum()))


@pytest.mark.parametrize("method", ["sd", "naive"])
def test_the_tv_bound_sums_the_rounding_distance_of_each_decided_position(
    skewed_world: World, method: str
) -> None:
    """`tv_bound` starts at 0 and adds TV(q, q̂) for every position decided with a rounded q̂:
    one position here (γ = 1, one token), none for a method that decides with the float q."""
    q, _ = _first_position(skewed_world)
    _, _, cloud = skewed_world.run(method, **SETTINGS)
    expected = round_probs(q, SETTINGS["q_bits"]).tv if method == "naive" else 0.0
    assert expected == 0.0 or expected > 1e-7
    assert cloud.counters["tv_bound"] == pytest.approx(expected, rel=1e-12, abs=0.0)


# The draft proposing from a reshaped p̃ (its top two tokens' mass × 0.3), which it reports.
RESHAPE = {"draft_reshape": 0.3, "draft_reshape_top": 2}


@pytest.mark.parametrize("method", ["sd", "xcosd-e", "picospec"])
def test_a_reshaped_draft_keeps_the_law_exact(skewed_world: World, scripted, method: str) -> None:
    """The draft may propose from any law it reports exactly: with the reshaped p̃ a token of
    q's support gets p̃ > q (acceptance odds below 1, where the plain p̃ had them above), so
    a reported p̃(x) that is not the law the token was drawn from changes the law."""
    q, plain = _first_position(skewed_world)
    _, p = _first_position(skewed_world, **RESHAPE)
    assert np.any((p > q) & (plain < q) & (q > 0))
    ships = method == "picospec"
    expected = round_probs(q, SETTINGS["q_bits"]).probs if ships else q / q.sum()
    _assert_law(scripted(skewed_world, method, **RESHAPE), expected)


def test_a_reshaped_draft_proposes_from_the_reshaped_law(skewed_world: World, scripted) -> None:
    """GR's law depends on the proposal: the drafted token is drawn from the reshaped p̃."""
    q, plain = _first_position(skewed_world)
    _, p = _first_position(skewed_world, **RESHAPE)
    argmax = np.zeros(q.size)
    argmax[int(np.argmax(q))] = 1.0
    expected = _speculative_law(q, p, argmax)
    assert np.abs(expected - _speculative_law(q, plain, argmax)).max() > 1e-3
    _assert_law(scripted(skewed_world, "gr", **RESHAPE), expected)
