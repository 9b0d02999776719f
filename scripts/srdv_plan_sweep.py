"""SR-DV's K and M chosen online (`srdv_k="auto"`, `srdv_m="auto"`) against fixed plans, on the
simulator: the table in docs/METHODS.md ("Choosing SR-DV's K and M").

The pair has two vocabularies (tiny byte-level and metaspace tokenizers) and context-free laws:
q on 100 common tokens (0.9 of its mass) and 5 LLM-only ones, the draft 0.8·q on the common
tokens and the rest on 10 common tokens q lacks, so a rejection's residual mass β is about 0.24
and a set of four candidates often fails. `xcosd-e`, γ = 4, T = 1, a flat compute profile (1 ms
a pass), the same link each way; tokens/s as mean ± standard error over the seeds.

    .venv/bin/python scripts/srdv_plan_sweep.py [--seeds 5] [--tokens 200]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import wanspec
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec
from wanspec.models.tiny import build_tokenizer
from wanspec.sim import Link, load_profile
from wanspec.vocab import VocabAlignment

LINKS = [(1e5, 0.02), (1e7, 0.2), (5e4, 0.3), (1e8, 0.05), (1e7, 0.01)]  # (bit/s, RTT s)
PLANS = [(4, 2), (16, 1), (8, 1), (8, 2), (2, 4), (1, 8), (16, 8)]  # fixed (K, M)
FLAT = load_profile({"name": "flat", "forward_ms": {"1": 1.0, "64": 2.0}})


@dataclass(frozen=True)
class FixedLaw(SyntheticSpec):
    """One next-token law after every context (token id, mass)."""

    law: tuple[tuple[int, float], ...] = ()

    def probs(self, context: Sequence[int], role: str) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.float64)
        for token, mass in self.law:
            out[token] = mass
        return out


def small_residual_pair(alpha: float = 0.8) -> wanspec.Pair:
    target_tok = build_tokenizer("bytelevel", 300)
    draft_tok = build_tokenizer("metaspace", 160)
    align = VocabAlignment.build(draft_tok, target_tok)
    common = [int(t) for t in align.common_target_ids]
    llm_only = [int(t) for t in np.flatnonzero(align.llm_only)][:5]
    weights = np.arange(100, 0, -1) / np.arange(100, 0, -1).sum()
    q = {t: 0.9 * float(w) for t, w in zip(common[:100], weights, strict=True)}
    q.update({t: 0.1 / len(llm_only) for t in llm_only})
    to_draft = {t: int(align.target_to_draft[t]) for t in common}
    p = {to_draft[t]: alpha * float(w) for t, w in zip(common[:100], weights, strict=True)}
    p.update({to_draft[t]: (1 - alpha) / 10 for t in common[100:110]})
    target = SyntheticLM(FixedLaw(0.0, align.target_width, law=tuple(q.items())), "target")
    draft = SyntheticLM(FixedLaw(0.0, align.draft_width, law=tuple(p.items())), "draft")
    target.tokenizer, draft.tokenizer = target_tok, draft_tok
    return wanspec.Pair(target, draft, align, target.name, draft.name)


def rate(pair: wanspec.Pair, link: Link, seeds: int, tokens: int, **plan: object) -> np.ndarray:
    out = []
    for seed in range(seeds):
        res = wanspec.generate(
            pair, "synthetic", "xcosd-e", link=link, profile=FLAT, seed=seed,
            max_new_tokens=tokens, temperature=1.0, gamma=4, **plan,
        )  # fmt: skip
        out.append(res.stats["tokens_per_s"])
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    pair = small_residual_pair()
    print("| link | default K = 4, M = 2 | best fixed | auto | auto / default | auto / best |")
    print("|---|---|---|---|---|---|")
    for bps, rtt in LINKS:
        link = Link(bandwidth_bps=bps, rtt_s=rtt)
        fixed = {
            plan: rate(pair, link, args.seeds, args.tokens, srdv_k=plan[0], srdv_m=plan[1])
            for plan in PLANS
        }
        auto = rate(pair, link, args.seeds, args.tokens, srdv_k="auto", srdv_m="auto")
        best = max(PLANS, key=lambda plan: fixed[plan].mean())

        def shown(r: np.ndarray) -> str:
            return f"{r.mean():.1f} ± {r.std(ddof=1) / np.sqrt(len(r)):.1f}"

        default = fixed[(4, 2)]
        print(
            f"| {bps:g} bit/s, RTT {rtt * 1e3:g} ms | {shown(default)} | {shown(fixed[best])} "
            f"{best} | {shown(auto)} | {auto.mean() / default.mean():.2f} | "
            f"{auto.mean() / fixed[best].mean():.2f} |"
        )


if __name__ == "__main__":
    main()
