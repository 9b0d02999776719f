"""Every lossless resampling scheme, run end to end at one position, samples exactly q̃.

One step = draft x ~ p, accept with min(1, q(x)/p(x)), else resolve the rejection with the
scheme. The output must be distributed as q (TV bound and chi-square, 10^5 samples, fixed seeds);
the lossy baselines must deviate where they should. At temperature 0 every lossless scheme is
exact argmax agreement.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from wanspec.sampling import (
    PROB_SCALE,
    accept_token,
    greedy_replacement,
    hybrid_cloud_payload,
    hybrid_edge_resolve,
    hybrid_o_sample,
    quantize,
    sample,
    sample_residual,
    srdv_cloud_candidates,
    srdv_edge_verify,
    truncate_top_k,
    truncated_residual_sample,
    uhlm_uncertainty,
)

V = 10
SAMPLES = 100_000
TV_BOUND = 0.012  # E[TV] of 1e5 samples over 10 tokens is ~0.004


def _case(name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q counts, p counts, common mask) for one named situation; p is TLI (zero on O)."""
    common = np.arange(V) < 7
    q = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V))
    if name == "heavy_o":
        q[common] *= 0.15
    elif name == "sparse_target":
        q = np.zeros(V)
        q[[1, 3, 8]] = [0.5, 0.3, 0.2]  # what top-p leaves
    elif name == "near_deterministic":
        q = np.full(V, 1e-3)
        q[2] = 1.0
    elif name == "p_equals_q":
        q[~common] = 0
        p = q.copy()
    elif name == "shared_vocab":
        common = np.ones(V, dtype=bool)
    p = np.where(common, p, 0.0)
    return quantize(q), quantize(p), common


CASES = ["random", "heavy_o", "sparse_target", "near_deterministic", "p_equals_q", "shared_vocab"]

Resolver = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.random.Generator, np.random.Generator], int
]


def _naive(q, p, common, edge, cloud) -> int:
    return sample_residual(q, p, edge)


def _hr(piggyback: bool) -> Resolver:
    def resolve(q, p, common, edge, cloud) -> int:
        payload = hybrid_cloud_payload(q, common, cloud, piggyback=piggyback)
        choice = hybrid_edge_resolve(payload, p, common, edge)
        if choice.token is None:
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


def _gr(q, p, common, edge, cloud) -> int:
    return greedy_replacement(q)


def _tr(q, p, common, edge, cloud) -> int:
    ids, counts = truncate_top_k(q, 2)
    return truncated_residual_sample(ids, counts, p, edge)


LOSSLESS: dict[str, Resolver] = {
    "naive/ul/cosd": _naive,
    "hr-piggyback": _hr(True),
    "hr-request": _hr(False),
    "srdv-k1-m1": _srdv(1, 1),  # falls back to HR often
    "srdv-k4-m2": _srdv(4, 2),
}


def _run_step(q, p, common, resolve: Resolver, seed: int) -> np.ndarray:
    edge, cloud = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    out = np.zeros(V, dtype=np.int64)
    for _ in range(SAMPLES):
        x = sample(p, edge)
        token = (
            x if accept_token(int(q[x]), int(p[x]), cloud) else resolve(q, p, common, edge, cloud)
        )
        out[token] += 1
    return out


def _tv(counts: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - q / PROB_SCALE).sum())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("scheme", list(LOSSLESS))
def test_lossless_scheme_samples_the_target(scheme: str, case: str) -> None:
    q, p, common = _case(case, np.random.default_rng(CASES.index(case)))
    out = _run_step(q, p, common, LOSSLESS[scheme], seed=7)
    assert _tv(out, q) < TV_BOUND
    support = q > 0
    assert out[~support].sum() == 0
    if support.sum() > 1:
        expected = q[support] / PROB_SCALE * SAMPLES
        assert stats.chisquare(out[support], expected).pvalue > 1e-4


@pytest.mark.parametrize("scheme,resolver", [("gr", _gr), ("tr", _tr)])
def test_lossy_schemes_deviate(scheme: str, resolver: Resolver) -> None:
    q, p, common = _case("random", np.random.default_rng(0))
    out = _run_step(q, p, common, resolver, seed=7)
    assert _tv(out, q) > 0.05


def test_uhlm_skipping_confident_tokens_deviates() -> None:
    q, p, _common = _case("random", np.random.default_rng(0))
    logits = np.log(np.maximum(p, 1e-12) / PROB_SCALE) * 4.0  # a confident draft
    edge, cloud = np.random.default_rng(1), np.random.default_rng(2)
    out = np.zeros(V, dtype=np.int64)
    for _ in range(4_000):
        x = sample(p, edge)
        skip = uhlm_uncertainty(logits, x, edge, samples=20, eta_max=2.0) <= 0.5
        ok = skip or accept_token(int(q[x]), int(p[x]), cloud)
        out[x if ok else sample_residual(q, p, edge)] += 1
    assert _tv(out, q) > 0.05


def test_naive_scheme_would_fail_with_a_wrong_residual() -> None:
    """Guard that the harness can fail: sampling q itself at a rejection is biased."""
    q, p, common = _case("random", np.random.default_rng(0))
    out = _run_step(q, p, common, lambda q, p, c, e, cl: sample(q, e), seed=7)
    assert _tv(out, q) > 0.02


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("scheme", list(LOSSLESS))
def test_greedy_reduces_to_argmax_agreement(scheme: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    common = np.arange(V) < 7
    q = np.zeros(V, np.int64)
    q[rng.integers(V)] = PROB_SCALE
    p = np.zeros(V, np.int64)
    p[rng.integers(7)] = PROB_SCALE
    x = int(np.argmax(p))
    edge, cloud = np.random.default_rng(seed), np.random.default_rng(seed + 100)
    if accept_token(int(q[x]), int(p[x]), cloud):
        assert x == int(np.argmax(q))
        return
    assert LOSSLESS[scheme](q, p, common, edge, cloud) == int(np.argmax(q))


def test_srdv_accepts_o_candidates_always_and_rejects_when_p_dominates() -> None:
    rng = np.random.default_rng(0)
    p = np.zeros(4, np.int64)
    p[0] = PROB_SCALE
    assert srdv_edge_verify((3,), (10,), p, rng) == 3  # p(3) = 0: always accepted
    assert srdv_edge_verify((0,), (PROB_SCALE,), p, rng) is None  # q <= p: never accepted
