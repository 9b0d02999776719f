"""Goal (a) of the link sweep on longer runs: deepspec and deepspec-tree over acespec (γ = 4),
deepspec-tree both as it runs and with every chain carrying its p̃ (`tree always`).

`wanspec bench link-sweep --config moderate` judges the goal on 4 prompts × 64 tokens, where
each run's start (the uplink not yet measured, the pipeline filling) weighs much. This runs the
same simulator, profiles and synthetic pair on more seeds and tokens and prints each method's
tokens/s and its ratio to acespec with a 95 % bootstrap interval over the seeds (paired: one
seed is one synthetic pair and one prompt for every method, and every method draws a seed's
coins and residuals from the same streams, so they give it the same tokens and a ratio
compares time alone).

    WANSPEC_THREADS=1 .venv/bin/python scripts/fork_goal.py --seeds 12 --tokens 256 [--budget 32]

`--budget` sets every method's B_max alike: deepspec-tree gains more from a larger tree than
acespec does (each branch sent as a fork saves a round trip, not only a redraft).
"""

from __future__ import annotations

import argparse

import numpy as np

import wanspec
from wanspec.bench.experiment import synthetic_pair
from wanspec.bench.stats import paired_ratio_text

# (label, method, settings): deepspec-tree as it runs by default (each chain's p̃ only where its
# forks pay), and with every chain carrying it
METHODS = (
    ("acespec", "acespec", {}),
    ("deepspec", "deepspec", {}),
    ("deepspec-tree", "deepspec-tree", {}),
    ("tree always", "deepspec-tree", {"chain_dists": "always"}),
)
POINTS = ((0.15, 1e8), (0.3, 1e8), (0.01, 1e8), (0.05, 5e4))  # (RTT s, rate bps each way)


def rates(
    alpha: float, rtt: float, bps: float, seeds: int, tokens: int, budget: int
) -> dict[str, np.ndarray]:
    """Per method, per seed: (tokens, seconds) of one run, every method at the same B_max."""
    out = {label: np.zeros((seeds, 2)) for label, _, _ in METHODS}
    for seed in range(seeds):
        pair = synthetic_pair(alpha, seed)
        for label, method, settings in METHODS:
            res = wanspec.generate(
                pair, f"Question {seed}:", method,
                link=wanspec.Link(bandwidth_bps=bps, rtt_s=rtt),
                edge_profile="edge-orin", cloud_profile="cloud-a100x4-70b",
                gamma=4, tree_budget=budget, max_new_tokens=tokens, seed=seed,
                temperature=1.0, top_p=1.0, **settings,
            )  # fmt: skip
            out[label][seed] = (len(res.token_ids), res.stats["time_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--budget", type=int, default=16, help="B_max of every method's tree")
    args = parser.parse_args()
    print(
        f"α = {args.alpha}, {args.seeds} seeds × {args.tokens} tokens, γ = 4, B_max {args.budget}\n"
    )
    labels = [label for label, _, _ in METHODS]
    print(
        "| RTT | rate | "
        + " | ".join(f"{m} tok/s" for m in labels)
        + " | "
        + " | ".join(f"{m} / acespec" for m in labels[1:])
        + " |"
    )
    print("|---|---|" + "---|" * (2 * len(labels) - 1))
    for rtt, bps in POINTS:
        runs = rates(args.alpha, rtt, bps, args.seeds, args.tokens, args.budget)
        speed = [runs[m][:, 0].sum() / runs[m][:, 1].sum() for m in labels]
        cells = [f"{s:.2f}" for s in speed]
        for m in labels[1:]:
            run, ref = runs[m], runs["acespec"]
            cells.append(paired_ratio_text(run[:, 0], run[:, 1], ref[:, 0], ref[:, 1]))
        print(f"| {1e3 * rtt:g} ms | {bps:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
