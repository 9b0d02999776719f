"""Communication load the way X-CoSD accounts for it, from the events of a run.

wanspec counts what its wire really carries (`res.stats` uplink/downlink bits: the exact encoded
bytes, where a distribution travels sparse whenever that is smaller). The paper instead charges
every distribution at 16 bits per probability over the vocabulary it lives on. To set our numbers
beside the paper's Table 5, this module recomputes each run's load under the paper's accounting,
from the events the run records. Symbols:

    γ = N      draft length (Table 5: N = 2)
    |V|        target (LLM) vocabulary, real tokens
    |V_S|      draft (SLM) vocabulary
    |C|        common vocabulary
    b_p = 16   bits per probability
    b_id       ⌈log2 |V|⌉ bits per token id
    b_n        ⌈log2(γ+1)⌉ bits per accepted length
    R          rounds = len(accepted_per_round)
    J          rejections = rounds whose accepted count is below γ
    O          `hr_region_O`: rejections resolved in the LLM-only region (an O token comes down)
    H          rejections resolved by HR: `hr_region_C` + `hr_region_O` (xcosd-auto's HR rounds)
    Kr, F      `srdv_candidate_rounds`, `srdv_fallbacks` (X-CoSD-E)
    Kc         `srdv_candidates`: candidates that came down (Kr·K while K is fixed; with
               `srdv_k="auto"` each set has the edge's K)
    S          `uhlm_skipped` (U-HLM: draft tokens accepted unverified)
    k, K       `tr_k`, `srdv_k`

Uplink per request
    naive, gr, tr, xcosd, xcosd-e,  R·γ·(b_id + b_p)                draft ids and their p(x)
    xcosd-auto
    ul                              R·γ·(b_id + 16·|V_S|)           ids, every draft distribution
    uhlm                            R·γ·b_id + (R·γ − S)·16·|V_S|   distributions of uncertain
                                                                    tokens only
Downlink per request: R·b_n (accepted length) + (R − J)·b_id (bonus token), plus
    naive          J·16·|V|                    q over the whole LLM vocabulary per rejection
    ul, gr, uhlm   J·b_id                      the token the cloud chose
    tr             J·k·(b_id + b_p)            top-k ids and probabilities
    xcosd          J·(16·|C| + b_p) + O·b_id   q over C and θ_o; an O token after an O choice
    xcosd-e        Kc·(b_id + b_p) + F·(16·|C| + b_p) + O·b_id
                   K candidates with q(y) per candidate round; HR after M failed rounds
    xcosd-auto     H·(16·|C| + b_p) + Kc·(b_id + b_p) + F·(16·|C| + b_p) + O·b_id
                   each rejected round charged by its own mechanism's formula (the edge's
                   choice per round): xcosd's for the H resolved by HR, xcosd-e's for the rest
Per generated token: the sum over a cell's prompts divided by the tokens they generated.
Not charged: the session set-up (prompt, settings), one-bit requests (more candidates, the HR
fallback, the O token), message framing. The O token is charged as one id; the paper sends its
string (a few bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PROB_BITS = 16
ACCOUNTED_METHODS = ("naive", "ul", "gr", "tr", "uhlm", "xcosd", "xcosd-e", "xcosd-auto")


@dataclass(frozen=True)
class Vocab:
    """Vocabulary sizes of a pair: |V| (target), |V_S| (draft), |C| (common)."""

    target: int
    draft: int
    common: int

    @property
    def id_bits(self) -> int:
        return math.ceil(math.log2(self.target))


@dataclass(frozen=True)
class Events:
    """What happened in one request, as the accounting needs it."""

    rounds: int
    rejections: int
    o_tokens: int = 0
    hr_rejections: int = 0
    candidate_rounds: int = 0
    candidates: int | None = None  # None: a record from before the count, Kr·K
    fallbacks: int = 0
    skipped: int = 0

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], gamma: int) -> Events:
        accepted: Sequence[int] = stats["accepted_per_round"]
        return cls(
            rounds=len(accepted),
            rejections=sum(a < gamma for a in accepted),
            o_tokens=int(stats.get("hr_region_O", 0)),
            hr_rejections=int(stats.get("hr_region_C", 0)) + int(stats.get("hr_region_O", 0)),
            candidate_rounds=int(stats.get("srdv_candidate_rounds", 0)),
            candidates=int(stats["srdv_candidates"]) if "srdv_candidates" in stats else None,
            fallbacks=int(stats.get("srdv_fallbacks", 0)),
            skipped=int(stats.get("uhlm_skipped", 0)),
        )


def paper_bits(
    method: str, events: Events, vocab: Vocab, gamma: int, options: Mapping[str, Any]
) -> tuple[int, int]:
    """(uplink, downlink) bits of one request under the paper's accounting (module docstring)."""
    if method not in ACCOUNTED_METHODS:
        raise ValueError(f"no paper accounting for {method!r}; known: {ACCOUNTED_METHODS}")
    e, b_id = events, vocab.id_bits
    drafted = e.rounds * gamma
    dist_up = PROB_BITS * vocab.draft
    if method == "ul":
        up = drafted * (b_id + dist_up)
    elif method == "uhlm":
        up = drafted * b_id + (drafted - e.skipped) * dist_up
    else:
        up = drafted * (b_id + PROB_BITS)
    accept_len = math.ceil(math.log2(gamma + 1))
    down = e.rounds * accept_len + (e.rounds - e.rejections) * b_id
    return up, down + _at_rejections(method, e, vocab, options)


def _at_rejections(method: str, e: Events, vocab: Vocab, options: Mapping[str, Any]) -> int:
    """Downlink bits that resolve the rejections of one request."""
    b_id = vocab.id_bits
    hr = PROB_BITS * vocab.common + PROB_BITS  # q over C and θ_o
    if method == "naive":
        return e.rejections * PROB_BITS * vocab.target
    if method == "tr":
        return e.rejections * options["tr_k"] * (b_id + PROB_BITS)
    if method == "xcosd":
        return e.rejections * hr + e.o_tokens * b_id
    if method in ("xcosd-e", "xcosd-auto"):
        count = e.candidate_rounds * options["srdv_k"] if e.candidates is None else e.candidates
        candidates = count * (b_id + PROB_BITS)
        by_hr = e.hr_rejections * hr if method == "xcosd-auto" else 0
        return by_hr + candidates + e.fallbacks * hr + e.o_tokens * b_id
    return e.rejections * b_id  # ul, gr, uhlm: the cloud's token
