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

import numpy as np

import wanspec
from wanspec.models.synthetic import SyntheticLM, small_residual_laws
from wanspec.models.tiny import build_tokenizer
from wanspec.sim import Link, load_profile
from wanspec.vocab import VocabAlignment

LINKS = [(1e5, 0.02), (1e7, 0.2), (5e4, 0.3), (1e8, 0.05), (1e7, 0.01)]  # (bit/s, RTT s)
PLANS = [(4, 2), (16, 1), (8, 1), (8, 2), (2, 4), (1, 8), (16, 8)]  # fixed (K, M)
FLAT = load_profile({"name": "flat", "forward_ms": {"1": 1.0, "64": 2.0}})


def small_residual_pair(alpha: float = 0.8) -> wanspec.Pair:
    """The tests' `small_residual_world` as a `wanspec.Pair` (with its tokenizers)."""
    target_tok = build_tokenizer("bytelevel", 300)
    draft_tok = build_tokenizer("metaspace", 160)
    alignment = VocabAlignment.build(draft_tok, target_tok)
    target_law, draft_law = small_residual_laws(alignment, alpha)
    target, draft = SyntheticLM(target_law, "target"), SyntheticLM(draft_law, "draft")
    target.tokenizer, draft.tokenizer = target_tok, draft_tok
    return wanspec.Pair(target, draft, alignment, target.name, draft.name)


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
