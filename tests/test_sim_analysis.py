"""The simulator agrees with the analysis of stop-and-wait speculative decoding (synthetic pair).

With i.i.d. acceptance α and γ drafts per round, the accepted count A is a truncated geometric:
E[min(A+1, γ)] = (1−α^γ)/(1−α) (AceSpec's E[L]) and tokens per round E[A+1] = (1−α^{γ+1})/(1−α).
With flat compute profiles the stop-and-wait cycle is exactly T_draft(γ) + RTT + T_verify.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from wanspec.jobs import ComputeCost
from wanspec.models.jobs import session_executor
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec
from wanspec.models.tiny import build_tokenizer
from wanspec.protocols.registry import build_machines
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import Link, load_profile, simulate
from wanspec.vocab import VocabAlignment

EDGE = load_profile({"name": "edge", "forward_ms": {"1": 20.0, "64": 20.0}})
CLOUD = load_profile({"name": "cloud", "forward_ms": {"1": 35.0, "64": 35.0}})
RTT = 0.1


@pytest.fixture(scope="module")
def alignment() -> VocabAlignment:
    return VocabAlignment.identity(build_tokenizer("bytelevel", 300))


def _run(alignment: VocabAlignment, alpha: float, gamma: int, seed: int):
    spec = SyntheticSpec(alpha, vocab_size=alignment.target_width, seed=seed)
    draft, target = SyntheticLM(spec, "draft"), SyntheticLM(spec, "target")
    edge, cloud = build_machines(
        "xcosd",
        draft_lm=draft,
        target_lm=target,
        alignment=alignment,
        draft_encode=lambda _: [1, 2, 3],
        target_encode=lambda _: [1, 2, 3],
        target_decode=lambda ids: "",
        prompt="",
        settings=GenerationSettings(gamma=gamma, max_new_tokens=400, seed=seed, temperature=1.0),
    )
    link = Link(bandwidth_bps=math.inf, rtt_s=RTT)
    executors = dict(edge_executor=session_executor(draft), cloud_executor=session_executor(target))
    return simulate(edge, cloud, link, EDGE, CLOUD, **executors), edge


@pytest.mark.parametrize(("alpha", "gamma"), [(0.5, 4), (0.8, 6), (0.3, 2)])
def test_accepted_length_and_cycle_time_match_analysis(alignment, alpha: float, gamma: int) -> None:
    accepted: list[int] = []
    cycles: list[float] = []
    for seed in range(12):
        sim, edge = _run(alignment, alpha, gamma, seed)
        rounds = edge.accepted_per_round[:-1]  # the last round may be cut by max_new_tokens
        accepted += rounds
        cycles.append(sim.duration_s / len(edge.accepted_per_round))
    a = np.asarray(accepted)
    e_l = (1 - alpha**gamma) / (1 - alpha)
    per_round = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert np.minimum(a + 1, gamma).mean() == pytest.approx(e_l, rel=0.02)
    assert (a + 1).mean() == pytest.approx(per_round, rel=0.02)
    t_draft = EDGE.seconds(ComputeCost("forward", n=1, passes=gamma))
    t_verify = CLOUD.seconds(ComputeCost("forward", n=gamma + 1))
    assert np.mean(cycles) == pytest.approx(t_draft + RTT + t_verify, rel=0.02)
