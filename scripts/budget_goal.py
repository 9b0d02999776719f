"""Goal (b) with the tree budget among the fixed settings: `auto` against the best fixed (γ, B).

`wanspec bench link-sweep` judges `gamma="auto"` against the best fixed γ, each drafting
AceSpec's network-aware budget up to B_max = 16. A person who knew the link could also have
fixed the budget (`tree_fixed`): this runs the same simulator, profiles and synthetic pair at
the sweep's extremes and 150 ms, every fixed γ × {the network-aware budget ≤ 16, fixed 16, 32,
64}, and the edge's own choices: γ alone (`gamma="auto"`), the budget alone at γ = 4
(`tree_budget="auto"`) and both. It prints tokens/s and each auto's ratio to the best fixed
setting and to the default (γ = 4, B_max = 16), with a 95 % bootstrap interval over the seeds
(paired: one seed is one synthetic pair and one prompt, and every setting draws a seed's coins
from the same streams, so they give it the same tokens and a ratio compares time alone).

    WANSPEC_THREADS=1 .venv/bin/python scripts/budget_goal.py --method acespec --seeds 8
"""

from __future__ import annotations

import argparse

import numpy as np

import wanspec
from wanspec.bench.experiment import synthetic_pair
from wanspec.bench.stats import paired_ratio_text

# (RTT s, rate bps each way): the sweeps' extremes, 50 ms at 100 Mbit/s and 150 ms
POINTS = ((0.01, 1e8), (0.05, 1e8), (0.15, 1e8), (0.3, 1e8), (0.05, 5e4))
AUTOS = {
    "auto γ": {"gamma": "auto"},
    "auto B": {"gamma": 4, "tree_budget": "auto"},
    "auto γ, B": {"gamma": "auto", "tree_budget": "auto"},
}


def settings(gammas: list[int]) -> dict[str, dict]:
    """Every fixed setting, the default first, then the autos."""
    fixed = {}
    for gamma in gammas:
        fixed[f"γ {gamma}, B ≤ 16"] = {"gamma": gamma}
        for budget in (16, 32, 64):
            fixed[f"γ {gamma}, B {budget}"] = {
                "gamma": gamma,
                "tree_budget": budget,
                "tree_fixed": True,
            }
    return {"default": {"gamma": 4}, **fixed, **AUTOS}


def runs(args: argparse.Namespace, rtt: float, bps: float, cells: dict[str, dict]) -> dict:
    """Per setting, per seed: (tokens, seconds)."""
    out = {name: np.zeros((args.seeds, 2)) for name in cells}
    for seed in range(args.seeds):
        pair = synthetic_pair(args.alpha, seed, alpha_alt=args.alpha_alt)
        for name, extra in cells.items():
            res = wanspec.generate(
                pair, f"Question {seed}:", args.method,
                link=wanspec.Link(bandwidth_bps=bps, rtt_s=rtt),
                edge_profile="edge-orin", cloud_profile="cloud-a100x4-70b",
                max_new_tokens=args.tokens, seed=seed, temperature=1.0, top_p=1.0, **extra,
            )  # fmt: skip
            out[name][seed] = (len(res.token_ids), res.stats["time_s"])
    return out


def ratio(run: np.ndarray, ref: np.ndarray) -> str:
    return paired_ratio_text(run[:, 0], run[:, 1], ref[:, 0], ref[:, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="acespec")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.8)
    regimes = "the other regime's α: acceptance alternates in stretches of 16 tokens"
    parser.add_argument("--alpha-alt", type=float, default=None, help=regimes)
    parser.add_argument("--gammas", default="2,3,4,5,6,7,8", help="the fixed γ, comma-separated")
    args = parser.parse_args()
    cells = settings([int(g) for g in args.gammas.split(",")])
    regimes = "" if args.alpha_alt is None else f" and {args.alpha_alt} in stretches"
    print(f"{args.method}, α = {args.alpha}{regimes}, {args.seeds} seeds × {args.tokens} tokens\n")
    print("| RTT | rate | best fixed | tok/s | default tok/s | auto | tok/s | / best | / default |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rtt, bps in POINTS:
        out = runs(args, rtt, bps, cells)
        speed = {name: out[name][:, 0].sum() / out[name][:, 1].sum() for name in cells}
        best = max((n for n in cells if n.startswith("γ")), key=speed.__getitem__)
        for name in AUTOS:
            print(
                f"| {1e3 * rtt:g} ms | {bps:g} | {best} | {speed[best]:.2f} | "
                f"{speed['default']:.2f} | {name} | {speed[name]:.2f} | "
                f"{ratio(out[name], out[best])} | {ratio(out[name], out['default'])} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
