"""The lossy baselines against their OWN intended laws, two-sided.

"GR and U-HLM deviate from the target" says nothing about whether they do what their papers
describe: a TR that resamples over the whole vocabulary, or a U-HLM that verifies the confident
tokens instead of the uncertain ones, deviates too. Here the first token's law of each method is
derived from the models' own distributions, and the run must match it (TV) while staying far
from the target's law (so the test can tell the two apart). GR's law is exact and checked per
rejection in test_protocol_accounting.py.

On the shared synthetic world the first position's q has 5 tokens and p has 10. TR's law is also
enumerated exactly (test_protocols_exact_law.py); its sampled test here runs the real draws and
must tell TR's law from the target's, which are more than 0.15 apart: 1,000 runs keep the TV of
a correct run under 0.068 with probability 1 − 10⁻⁴ (simulated draws, k = 1 and 2), so a run
that follows the target's law instead fails TR_TOLERANCE with the same odds. U-HLM's law has
no enumeration: its test keeps 2,500 runs.
"""

from __future__ import annotations

from collections import Counter
from math import comb

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from wanspec.protocols.settings import GenerationSettings
from wanspec.sampling import quantize, target_probs, warp_probs
from worlds import PROMPT_IDS, World

pytestmark = pytest.mark.statistical

RUNS = 2500
TR_RUNS = 1000
TR_TOLERANCE = 0.075  # TV between a TR run's empirical law and the law it must follow


def _first_position(world: World) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, p̃, draft logits) at the first output position, as the target and the edge see them."""
    params = GenerationSettings().sampling  # T = 1, no truncation
    world.target.reset()
    q = target_probs(
        world.target.extend(list(PROMPT_IDS))[-1], params, world.alignment.target_valid
    )
    world.draft.reset()
    logits = world.alignment.project_draft_logits(
        torch.as_tensor(world.draft.extend(list(PROMPT_IDS))[-1]).float()
    )
    counts = quantize(warp_probs(logits.unsqueeze(0), params)[0])
    return q, counts / counts.sum(), logits.numpy().astype(np.float64)


def _law(p: np.ndarray, q: np.ndarray, verified: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """First-token law when the draft x ~ p is checked with probability verified(x) (accepted
    with min(1, q/p) when checked, kept when not) and a rejection draws from `residual`."""
    accept = np.minimum(1.0, np.divide(q, p, out=np.zeros_like(q), where=p > 0))
    kept = p * (1.0 - verified + verified * accept)
    return kept + (1.0 - kept.sum()) * residual / residual.sum()


def _empirical(world: World, method: str, runs: int = RUNS, **settings) -> np.ndarray:
    counts: Counter = Counter()
    for seed in range(runs):
        sim, _, _ = world.run(method, seed=seed, max_new_tokens=1, gamma=1, **settings)
        counts[sim.tokens[0]] += 1
    out = np.zeros(world.alignment.target_width)
    for token, n in counts.items():
        out[token] = n / runs
    return out


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


@pytest.mark.parametrize("k", [1, 2])
def test_tr_draws_the_residual_over_the_top_k_of_q(shared_world: World, k: int) -> None:
    """TR: accept as SD does; at a rejection the residual max(q − p̃, 0) restricted to q's top
    k (catches a residual over the whole vocabulary, over the wrong ids, or q sent instead)."""
    q, p, _ = _first_position(shared_world)
    top = np.argsort(-q, kind="stable")[:k]
    truncated = np.zeros_like(q)
    truncated[top] = np.maximum(q[top] - p[top], 0.0)
    intended = _law(p, q, np.ones_like(p), truncated)
    assert _tv(intended, q) > 0.15  # the test can see TR's loss
    assert _tv(_empirical(shared_world, "tr", TR_RUNS, tr_k=k), intended) < TR_TOLERANCE


def _uhlm_checked(logits: np.ndarray, samples: int, eta_max: float, threshold: float):
    """P(uncertainty(x) > threshold) per token x: each of `samples` draws at a temperature
    η ~ U(0, η_max] disagrees with x with probability d(x) = E_η[1 − softmax(logits/η)(x)]
    (midpoint rule over η), so the disagreements are Binomial(samples, d(x))."""
    finite = np.isfinite(logits)
    etas = (np.arange(4000) + 0.5) / 4000 * eta_max
    scaled = np.where(finite, (logits - logits[finite].max())[None, :] / etas[:, None], -np.inf)
    soft = np.exp(scaled)
    soft /= soft.sum(axis=1, keepdims=True)
    disagree = 1.0 - soft.mean(axis=0)
    need = int(np.floor(threshold * samples)) + 1  # uncertainty = K / samples > threshold
    return np.array(
        [
            sum(
                comb(samples, j) * d**j * (1 - d) ** (samples - j) for j in range(need, samples + 1)
            )
            for d in disagree
        ]
    )


def _collapsed(law: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The law over the tokens `keep` plus one bucket for everything else."""
    return np.append(law[keep], law.sum() - law[keep].sum())


@pytest.mark.parametrize(("threshold", "eta_max"), [(0.9, 0.4), (0.9, 1.0)])
def test_uhlm_verifies_exactly_the_uncertain_tokens(
    hetero_world: World, threshold: float, eta_max: float
) -> None:
    """U-HLM: a draft token is sent for verification with the probability that its perturbed
    uncertainty exceeds the threshold, and kept unchecked otherwise (catches `>=` for `>`, the
    confident tokens verified instead, a temperature law other than U(0, η_max], an unverified
    token still resampled). Across vocabularies the broad draft puts most of p where q is 0:
    such a token can only come out unverified, so the law is compared over q's support plus one
    bucket for all the rest (χ²; the target's own law must be rejected on the same runs)."""
    q, p, logits = _first_position(hetero_world)
    checked = _uhlm_checked(logits, 20, eta_max, threshold)
    intended = _law(p, q, checked, np.maximum(q - p, 0.0))
    settings = dict(uhlm_threshold=threshold, uhlm_eta_max=eta_max, uhlm_samples=20)
    support = np.flatnonzero(q)
    assert _tv(_collapsed(intended, support), _collapsed(q, support)) > 0.08  # U-HLM's loss
    observed = RUNS * _collapsed(_empirical(hetero_world, "uhlm", **settings), support)
    assert chisquare(observed, RUNS * _collapsed(intended, support)).pvalue > 1e-3
    assert chisquare(observed, RUNS * _collapsed(q, support) + 1e-9).pvalue < 1e-6
