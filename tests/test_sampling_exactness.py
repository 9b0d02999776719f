"""Every resampling scheme at one position, against its law: exactly, then once at full scale.

One step = draft x ~ p, accept with min(1, q(x)/p(x)), else resolve the rejection with the
scheme. A lossless scheme must resolve a rejection with the residual r = max(q − p, 0)/Z, so the
step yields q. The laws are computed exactly by running the real functions once for every
outcome of every rng draw (tests/exact_rng.py) on count vectors with small totals, and compared
as fractions: a residual normalised over the wrong set, an LLM-only sample drawn from C, a wrong
HR region probability or a wrong SR-DV acceptance changes the law by a visible fraction, which
`test_planted_bugs_change_the_law` checks for each of them. The lossy baselines are held to their
own intended law, both ways: GR is the argmax, TR the residual over its truncation, and neither
is q. One statistical test per scheme runs the real numpy generator at PROB_SCALE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from exact_rng import ScriptedRng, exact_law, normalised, total_variation
from wanspec.sampling import (
    PROB_SCALE,
    accept_token,
    greedy_replacement,
    hybrid_cloud_payload,
    hybrid_edge_resolve,
    hybrid_o_sample,
    quantize,
    residual,
    sample,
    sample_residual,
    srdv_cloud_candidates,
    srdv_edge_verify,
    truncate_top_k,
    truncated_residual_sample,
    uhlm_uncertainty,
)

# ----------------------------------------------------------------------------- small exact cases
# V = 6 ids; the common vocabulary C is ids 0-3, the LLM-only region O is ids 4-5 (p is 0 there).
# q and p are counts with the same small total, the stand-in for PROB_SCALE.
COMMON = np.array([True, True, True, True, False, False])
SHARED = np.ones(6, dtype=bool)


@dataclasses.dataclass(frozen=True)
class Case:
    q: tuple[int, ...]
    p: tuple[int, ...]
    common: np.ndarray = dataclasses.field(default_factory=lambda: COMMON)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.array(self.q, np.int64), np.array(self.p, np.int64), self.common


CASES = {
    # r = (1, 0, 1, 0, 2, 1)/5: θ_c = 2, θ_o = 3; q differs on C and O
    "mixed": Case((2, 0, 1, 0, 2, 1), (1, 2, 0, 3, 0, 0)),
    # θ_c = 1, θ_o = 4
    "heavy_o": Case((2, 0, 0, 0, 3, 1), (1, 2, 1, 2, 0, 0)),
    # p ≥ q on C: θ_c = 0, HR must pick O every time
    "p_covers_c": Case((1, 1, 0, 0, 3, 1), (2, 2, 1, 1, 0, 0)),
    # q has no mass on O: θ_o = 0, no O-sample exists
    "no_o_mass": Case((3, 1, 2, 0, 0, 0), (1, 1, 1, 3, 0, 0)),
    # q nearly one-hot
    "near_deterministic": Case((0, 0, 5, 0, 1, 0), (1, 1, 1, 3, 0, 0)),
    # the whole residual is a single count
    "one_count_residual": Case((2, 1, 0, 0, 0, 0), (1, 2, 0, 0, 0, 0)),
    # shared vocabulary: no O at all, p has mass everywhere
    "shared_vocab": Case((2, 0, 1, 0, 2, 1), (1, 2, 0, 1, 1, 1), SHARED),
}

Rng = np.random.Generator | ScriptedRng
Resolver = Callable[[np.ndarray, np.ndarray, np.ndarray, Rng, Rng], int]


def _naive(q, p, common, edge, cloud) -> int:
    return sample_residual(q, p, edge)


def _hr(piggyback: bool) -> Resolver:
    def resolve(q, p, common, edge, cloud) -> int:
        payload = hybrid_cloud_payload(q, common, cloud, piggyback=piggyback)
        choice = hybrid_edge_resolve(payload, p, common, edge)
        if choice.token is None and not piggyback:  # piggybacked: the O-sample is already there
            return hybrid_o_sample(q, common, cloud)
        return choice.token

    return resolve


def _srdv(k: int, m: int) -> Resolver:
    hr = _hr(piggyback=True)

    def resolve(q, p, common, edge, cloud) -> int:
        for _ in range(m):
            ids, counts = srdv_cloud_candidates(q, k, cloud)
            token = srdv_edge_verify(ids, counts, p, edge)
            if token is not None:
                return token
        return hr(q, p, common, edge, cloud)

    return resolve


LOSSLESS: dict[str, Resolver] = {
    "naive/ul/cosd": _naive,
    "hr-piggyback": _hr(True),
    "hr-request": _hr(False),
    "srdv-k1-m2": _srdv(1, 2),  # two single-candidate rounds, then HR
    "srdv-k2-m1": _srdv(2, 1),
}


def resolver_law(resolve: Resolver, case: Case) -> dict:
    """Exact law of the token a rejection is resolved with (edge and cloud draws enumerated)."""
    q, p, common = case.arrays
    return exact_law(lambda rng: resolve(q, p, common, rng, rng))


def step_law(resolve: Resolver, case: Case) -> dict:
    """Exact law of one whole step: draft, accept test, resolution of a rejection."""
    q, p, common = case.arrays

    def step(rng: ScriptedRng) -> int:
        x = sample(p, rng)
        return x if accept_token(int(q[x]), int(p[x]), rng) else resolve(q, p, common, rng, rng)

    return exact_law(step)


def residual_law(case: Case) -> dict:
    q, p, _ = case.arrays
    return normalised(residual(q, p))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("scheme", list(LOSSLESS))
def test_lossless_rejection_law_is_the_residual_exactly(scheme: str, case: str) -> None:
    assert resolver_law(LOSSLESS[scheme], CASES[case]) == residual_law(CASES[case])


@pytest.mark.parametrize("case", ["mixed", "heavy_o", "shared_vocab"])
@pytest.mark.parametrize("scheme", list(LOSSLESS))
def test_lossless_step_law_is_the_target_exactly(scheme: str, case: str) -> None:
    assert step_law(LOSSLESS[scheme], CASES[case]) == normalised(CASES[case].q)


# ----------------------------------------------------------------------------- the pieces alone


def test_hr_payload_splits_q_into_c_and_theta_o() -> None:
    q, _, common = CASES["mixed"].arrays
    rng = ScriptedRng([1])
    payload = hybrid_cloud_payload(q, common, rng)
    assert payload.target_common.tolist() == [2, 0, 1, 0, 0, 0]
    assert payload.theta_o == 3
    assert payload.o_sample == 5 and rng.draws == [2]  # one pick among the two O tokens
    assert rng.branches == [[Fraction(2, 3), Fraction(1, 3)]]  # ∝ q(4) = 2, q(5) = 1


@pytest.mark.parametrize("case", ["mixed", "heavy_o"])
def test_hr_o_sample_is_q_restricted_to_o_exactly(case: str) -> None:
    q, _, common = CASES[case].arrays
    expected = normalised(np.where(common, 0, q))
    assert exact_law(lambda rng: hybrid_cloud_payload(q, common, rng).o_sample) == expected
    assert exact_law(lambda rng: hybrid_o_sample(q, common, rng)) == expected


def test_hr_payload_draws_no_o_sample_when_asked_not_to_or_when_o_has_no_mass() -> None:
    q, _, common = CASES["mixed"].arrays
    rng = ScriptedRng()
    assert hybrid_cloud_payload(q, common, rng, piggyback=False).o_sample is None
    q0, _, _ = CASES["no_o_mass"].arrays
    payload = hybrid_cloud_payload(q0, common, rng)
    assert payload.o_sample is None and payload.theta_o == 0
    assert rng.draws == []
    single = hybrid_cloud_payload(np.array([5, 0, 0, 0, 1, 0]), common, rng)  # θ_o = 1 count
    assert single.o_sample == 4 and single.theta_o == 1


@pytest.mark.parametrize("case", ["mixed", "heavy_o", "p_covers_c", "no_o_mass"])
def test_hr_edge_picks_c_with_probability_theta_c_share_then_the_c_residual(case: str) -> None:
    q, p, common = CASES[case].arrays
    payload = dataclasses.replace(hybrid_cloud_payload(q, common, ScriptedRng()), o_sample=None)
    law = exact_law(lambda rng: hybrid_edge_resolve(payload, p, common, rng))
    r_c = np.where(common, residual(q, p), 0)
    theta_c, theta_o = int(r_c.sum()), int(payload.theta_o)
    expected = {}
    for token, share in normalised(r_c).items() if theta_c else ():
        expected[("C", token)] = Fraction(theta_c, theta_c + theta_o) * share
    if theta_o:
        expected[("O", None)] = Fraction(theta_o, theta_c + theta_o)
    assert {(c.region, c.token): pr for c, pr in law.items()} == expected


def test_hr_edge_refuses_an_empty_residual() -> None:
    q = np.array([2, 1, 0, 0, 0, 0])
    payload = hybrid_cloud_payload(q, COMMON, ScriptedRng())
    with pytest.raises(ValueError, match=r"^empty residual in hybrid resampling$"):
        hybrid_edge_resolve(payload, q, COMMON, ScriptedRng())
    with pytest.raises(ValueError, match=r"^empty residual: q <= p everywhere"):
        sample_residual(q, q, ScriptedRng())


@pytest.mark.parametrize("case", ["mixed", "heavy_o", "near_deterministic"])
def test_srdv_round_accepts_the_first_candidate_with_probability_one_minus_p_over_q(
    case: str,
) -> None:
    """K = 3 candidates y ~ q: P(round returns y at try k) = (1 − Z)^(k−1)·(q(y) − p(y))⁺."""
    q, p, _ = CASES[case].arrays
    total = int(q.sum())

    def round_(rng: ScriptedRng) -> int | None:
        ids, counts = srdv_cloud_candidates(q, 3, rng)
        assert counts == tuple(int(q[y]) for y in ids)
        return srdv_edge_verify(ids, counts, p, rng)

    mass = residual(q, p)
    miss = 1 - Fraction(int(mass.sum()), total)
    hit = sum(miss**k for k in range(3))
    expected = {y: hit * Fraction(int(m), total) for y, m in enumerate(mass) if m}
    expected[None] = miss**3
    assert exact_law(round_) == {k: v for k, v in expected.items() if v}


def test_srdv_candidates_are_independent_draws_of_q() -> None:
    q = np.array([1, 0, 2])
    law = exact_law(lambda rng: srdv_cloud_candidates(q, 2, rng)[0])
    third = Fraction(1, 3)
    expected = {(a, b): (third if a == 0 else 2 * third) * (third if b == 0 else 2 * third)
                for a in (0, 2) for b in (0, 2)}  # fmt: skip
    assert law == expected
    with pytest.raises(ValueError, match=r"^SR-DV needs K >= 1 candidates$"):
        srdv_cloud_candidates(q, 0, ScriptedRng())


def test_srdv_accepts_o_candidates_always_and_rejects_when_p_dominates() -> None:
    p = np.array([4, 0, 0, 0])
    rng = ScriptedRng()
    assert srdv_edge_verify((3,), (1,), p, rng) == 3  # p(3) = 0: always accepted
    assert srdv_edge_verify((0,), (4,), p, rng) is None  # q <= p: never accepted
    assert srdv_edge_verify((0, 0, 3), (4, 4, 2), p, rng) == 3
    assert rng.draws == []  # certain outcomes draw nothing
    with pytest.raises(ValueError, match=r"^a candidate must have positive target probability$"):
        srdv_edge_verify((2,), (0,), p, rng)
    with pytest.raises(ValueError):  # ids and their counts must line up
        srdv_edge_verify((0, 2), (4,), p, rng)


# ----------------------------------------------------------------------------- planted bugs


def _residual_on_c_only(q, p, common, edge, cloud) -> int:
    return sample(np.where(common, residual(q, p), 0), edge)


def _o_sample_from_c(q, p, common, edge, cloud) -> int:
    payload = hybrid_cloud_payload(q, common, cloud)
    wrong = dataclasses.replace(payload, o_sample=sample(payload.target_common, cloud))
    return hybrid_edge_resolve(wrong, p, common, edge).token


def _region_share_over_the_total(q, p, common, edge, cloud) -> int:
    payload = hybrid_cloud_payload(q, common, cloud)
    theta_c = int(np.where(common, residual(q, p), 0).sum())
    wrong = dataclasses.replace(payload, theta_o=int(q.sum()) - theta_c)  # P(C) = θ_c / total
    return hybrid_edge_resolve(wrong, p, common, edge).token


def _srdv_accepting_every_candidate(q, p, common, edge, cloud) -> int:
    ids, counts = srdv_cloud_candidates(q, 1, cloud)
    return srdv_edge_verify(ids, counts, np.zeros_like(p), edge)


def _srdv_accepting_with_q_over_p(q, p, common, edge, cloud) -> int:
    while True:
        (y,), _ = srdv_cloud_candidates(q, 1, cloud)
        if accept_token(int(q[y]), max(int(p[y]), 1), edge):
            return y


PLANTED: dict[str, Resolver] = {
    "residual normalised over C only": _residual_on_c_only,
    "residual normalised over q (sampling q itself)": lambda q, p, c, e, cl: sample(q, e),
    "LLM-only sample drawn from C": _o_sample_from_c,
    "HR region probability θ_c/total": _region_share_over_the_total,
    "SR-DV accepting with α = 1": _srdv_accepting_every_candidate,
    "SR-DV accepting with min(1, q/p)": _srdv_accepting_with_q_over_p,
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bugs_change_the_law(bug: str) -> None:
    """The cases above have the power to see each plausible wrong law (by at least 1/20 TV)."""
    gap = total_variation(resolver_law(PLANTED[bug], CASES["mixed"]), residual_law(CASES["mixed"]))
    assert gap >= Fraction(1, 20)


# ----------------------------------------------------------------------------- lossy baselines


def test_gr_resolves_with_the_first_argmax() -> None:
    assert greedy_replacement(np.array([0, 0, 5, 0, 1, 0])) == 2
    assert greedy_replacement(np.array([1, 4, 4, 0])) == 1  # ties: the first maximum


def _gr(q, p, common, edge, cloud) -> int:
    return greedy_replacement(q)


def _tr2(q, p, common, edge, cloud) -> int:
    ids, counts = truncate_top_k(q, 2)
    return truncated_residual_sample(ids, counts, p, edge)


# Intended rejection laws, by hand. "mixed": q = (2,0,1,0,2,1), p = (1,2,0,3,0,0).
# GR: argmax of q = id 0 (first of the two 2s). TR top-2 = ids {0, 4}: residual (1, 2)/3.
# "tr_empty": q = (2,3,1,0,0,0), p = (2,3,0,1,0,0): top-2 {0, 1} has no residual: its argmax, 1.
LOSSY_CASES = {**CASES, "tr_empty": Case((2, 3, 1, 0, 0, 0), (2, 3, 0, 1, 0, 0))}
INTENDED = {
    ("gr", "mixed"): {0: Fraction(1)},
    ("tr", "mixed"): {0: Fraction(1, 3), 4: Fraction(2, 3)},
    ("tr", "tr_empty"): {1: Fraction(1)},
    ("tr", "heavy_o"): {0: Fraction(1, 4), 4: Fraction(3, 4)},  # top-2 {0, 4}: residual (1, 3)
}


def _intended_step(case: Case, rejection_law: dict) -> dict:
    """Σ_x p(x)·[a(x)·δ_x + (1 − a(x))·R] with a = min(1, q/p): the step a rejection law implies."""
    total = sum(case.p)
    out: dict = {}
    for x, px in enumerate(case.p):
        if not px:
            continue
        accept = min(Fraction(case.q[x], px), Fraction(1))
        out[x] = out.get(x, 0) + Fraction(px, total) * accept
        for y, ry in rejection_law.items():
            out[y] = out.get(y, 0) + Fraction(px, total) * (1 - accept) * ry
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("scheme,case", list(INTENDED), ids=lambda v: str(v))
def test_lossy_schemes_follow_their_own_law_and_not_the_target(scheme: str, case: str) -> None:
    resolve = {"gr": _gr, "tr": _tr2}[scheme]
    c = LOSSY_CASES[case]
    assert resolver_law(resolve, c) == INTENDED[(scheme, case)]
    law = step_law(resolve, c)
    assert law == _intended_step(c, INTENDED[(scheme, case)])
    assert total_variation(law, normalised(c.q)) >= Fraction(1, 20)


def test_tr_truncation_keeps_the_top_k_ids_ascending() -> None:
    ids, counts = truncate_top_k(np.array([1, 5, 0, 3, 2]), 3)
    assert ids.tolist() == [1, 3, 4] and counts.tolist() == [5, 3, 2]
    ids, counts = truncate_top_k(np.array([0, 5, 0, 3]), 10)  # k clipped to the support
    assert ids.tolist() == [1, 3] and counts.tolist() == [5, 3]
    for k, top in [(1, [1]), (2, [1, 3]), (4, [0, 1, 3, 4])]:
        ids, counts = truncate_top_k(np.array([1, 5, 0, 3, 2, 0]), k)
        assert ids.tolist() == top, k
    big = np.random.default_rng(3).permutation(20_000)  # numpy's introselect at vocab scale
    for k in (1, 2, 50, 999):
        assert truncate_top_k(big, k)[0].tolist() == sorted(np.argsort(-big)[:k].tolist()), k
    with pytest.raises(ValueError, match=r"^TR needs k >= 1$"):
        truncate_top_k(np.array([1, 2]), 0)


def test_uint16_counts_are_not_wrapped() -> None:
    """Counts arrive as uint16 from the wire; q − p must not wrap around below zero."""
    q = np.array([1, 5, 0, 3], np.uint16)
    p = np.array([3, 1, 2, 3], np.uint16)
    assert residual(q, p).tolist() == [0, 4, 0, 0]
    ids, counts = truncate_top_k(q, 2)
    assert ids.tolist() == [1, 3] and counts.tolist() == [5, 3]
    law = exact_law(lambda rng: truncated_residual_sample(ids, counts, p, rng))
    assert law == {1: Fraction(1)}
    assert exact_law(lambda rng: sample_residual(q, p, rng)) == {1: Fraction(1)}


class RecordingRng:
    """U-HLM draws temperatures with `uniform` and tokens with `choice`: script and record both."""

    def __init__(self, etas: list[float], tokens: list[int]) -> None:
        self.etas, self.tokens = iter(etas), iter(tokens)
        self.uniform_args: list[tuple[float, float]] = []
        self.choice_probs: list[np.ndarray] = []

    def uniform(self, low: float, high: float) -> float:
        self.uniform_args.append((low, high))
        return next(self.etas)

    def choice(self, n: int, p: np.ndarray) -> int:
        assert n == len(p)
        self.choice_probs.append(p)
        return next(self.tokens)


def test_uhlm_uncertainty_is_the_share_of_perturbed_samples_that_disagree() -> None:
    """Defaults E = 20, η_max = 2 (U-HLM); η = 0 means η_max; −inf logits are never drawn."""
    logits = np.array([2.0, 0.0, -np.inf, 1.0])
    drawn = [0] * 15 + [3] * 5
    rng = RecordingRng([0.0, 0.5] + [1.0] * 18, drawn)
    assert uhlm_uncertainty(logits, 0, rng) == 5 / 20
    assert rng.uniform_args == [(0.0, 2.0)] * 20
    for probs, eta in zip(rng.choice_probs[:2], (2.0, 0.5), strict=True):
        expected = np.exp(np.where(np.isfinite(logits), logits / eta, -np.inf))
        np.testing.assert_allclose(probs, expected / expected.sum(), rtol=1e-12)
    rng = RecordingRng([1.0] * 3, [1, 1, 3])
    assert uhlm_uncertainty(logits, 1, rng, samples=3, eta_max=4.0) == 1 / 3
    assert rng.uniform_args == [(0.0, 4.0)] * 3
    shifted = RecordingRng([0.5], [0])  # large logits: the max is subtracted before exp
    assert uhlm_uncertainty(logits + 1000.0, 0, shifted, samples=1) == 0.0
    np.testing.assert_allclose(shifted.choice_probs[0], softmax_at(logits, 0.5), rtol=1e-12)


def softmax_at(logits: np.ndarray, eta: float) -> np.ndarray:
    weights = np.exp(np.where(np.isfinite(logits), (logits - logits.max()) / eta, -np.inf))
    return weights / weights.sum()


# ----------------------------------------------------------------------------- temperature 0


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("scheme", list(LOSSLESS))
def test_greedy_reduces_to_argmax_agreement(scheme: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q = np.zeros(6, np.int64)
    q[rng.integers(6)] = PROB_SCALE
    p = np.zeros(6, np.int64)
    p[rng.integers(4)] = PROB_SCALE
    x = int(np.argmax(p))
    driven = ScriptedRng()
    accepted = accept_token(int(q[x]), int(p[x]), driven)
    assert driven.draws == []  # one-hot laws: the acceptance test is certain, draws nothing
    if accepted:
        assert x == int(np.argmax(q))
    else:
        assert LOSSLESS[scheme](q, p, COMMON, driven, driven) == int(np.argmax(q))


# ----------------------------------------------------------------------------- full scale, real rng
SAMPLES = 30_000


def _full_scale_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    common = np.arange(10) < 7
    q, p = rng.dirichlet(np.ones(10)), rng.dirichlet(np.ones(10))
    return quantize(q), quantize(np.where(common, p, 0.0)), common


# one per code path (the exact tests above cover the laws; this covers 65535-count arithmetic)
FULL_SCALE = {name: LOSSLESS[name] for name in ("naive/ul/cosd", "hr-piggyback", "hr-request")}
FULL_SCALE["srdv-k4-m2"] = _srdv(4, 2)


@pytest.mark.statistical
@pytest.mark.parametrize("scheme", list(FULL_SCALE))
def test_lossless_scheme_samples_the_target_at_full_scale(scheme: str) -> None:
    """65535-count laws with numpy's generator (separate edge and cloud streams): χ² and TV."""
    q, p, common = _full_scale_case()
    resolve = FULL_SCALE[scheme]
    edge, cloud = np.random.default_rng(7), np.random.default_rng(8)
    out = np.zeros(10, dtype=np.int64)
    for _ in range(SAMPLES):
        x = sample(p, edge)
        ok = accept_token(int(q[x]), int(p[x]), cloud)
        out[x if ok else resolve(q, p, common, edge, cloud)] += 1
    expected = q / PROB_SCALE * SAMPLES
    assert stats.chisquare(out, expected).pvalue > 1e-4
    assert 0.5 * np.abs(out / SAMPLES - q / PROB_SCALE).sum() < 0.02


@pytest.mark.statistical
def test_uhlm_skipping_confident_tokens_deviates() -> None:
    q, p, _ = _full_scale_case()
    logits = np.log(np.maximum(p, 1e-12) / PROB_SCALE) * 4.0  # a confident draft
    edge, cloud = np.random.default_rng(1), np.random.default_rng(2)
    out = np.zeros(10, dtype=np.int64)
    for _ in range(1_000):
        x = sample(p, edge)
        skip = uhlm_uncertainty(logits, x, edge, samples=20, eta_max=2.0) <= 0.5
        ok = skip or accept_token(int(q[x]), int(p[x]), cloud)
        out[x if ok else sample_residual(q, p, edge)] += 1
    assert 0.5 * np.abs(out / out.sum() - q / PROB_SCALE).sum() > 0.1  # measured: 0.21
