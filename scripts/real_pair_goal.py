"""The link sweep's goals on a real pair, at the points they are judged: the chains-in-flight
pipeline against AceSpec (both γ = 4), and with `--auto` each with the edge's own γ and budget.

`wanspec bench link-sweep` runs the synthetic pair only: on this CPU a real pair costs about a
second per generated token and cell (its docstring). This runs the same simulator and testbed
profiles (`edge-orin`, `cloud-a100x4-70b`) with real models at four points (RTT 150 and 300 ms
at 100 Mbit/s, where goal (a) is judged; 10 ms, where the pipelines' chains go alone; 50 kbit/s
at 50 ms) on a few prompts of `../shared/data` (HumanEval for the code pair, GSM8K for the
hetero one), T = 1 and top-p 0.9 (AceSpec's setting, as `acespec-bandwidth`; with no nucleus
a rejection's q̂ over Qwen's 151,936 tokens is what a slow downlink carries). Every method
draws a prompt's coins and residuals from the same streams, so every run of a prompt gives
the same tokens (the script counts where they do not) and a ratio compares time alone; its
95 % interval resamples the prompts, paired. On the hetero pair `deepspec-tree` resolves a
rejection as `ul` does, not by SR-DV: its tokens part from the others' (same law), so its ratio
also carries the paths' difference and its interval is wider.

    WANSPEC_THREADS=2 .venv/bin/python scripts/real_pair_goal.py --pair shared --prompts 4 \
        --tokens 48 [--auto]

`--pair shared`: Qwen2.5-Coder 0.5B → 1.5B (`acespec`, `deepspec-tree`); `--pair hetero`:
SmolLM2-135M → Qwen2.5-Coder-0.5B (`acespec-x`, `deepspec-x`, `deepspec-tree`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import wanspec
from wanspec.bench.config import REAL_HETERO, REAL_SHARED
from wanspec.bench.pipelines import ideal_bound, per_token_acceptance
from wanspec.bench.stats import paired_ratio_text

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PAIRS = {  # (target, draft), the prompts, (AceSpec's method, the chains-in-flight ones)
    "shared": (REAL_SHARED, DATA / "humaneval" / "HumanEval.jsonl", ("acespec", "deepspec-tree")),
    "hetero": (
        REAL_HETERO,
        DATA / "gsm8k" / "test.jsonl",
        ("acespec-x", "deepspec-x", "deepspec-tree"),
    ),
}
POINTS = ((0.15, 1e8), (0.3, 1e8), (0.01, 1e8), (0.05, 5e4))  # (RTT s, rate bps each way)
EDGE, CLOUD = "edge-orin", "cloud-a100x4-70b"
AUTO = {"gamma": "auto", "tree_budget": "auto"}


def prompts(path: Path, count: int) -> list[str]:
    if not path.exists():
        raise SystemExit(f"{path} not found: the benchmarks' prompt sets live in ../shared/data")
    rows = [json.loads(line) for line in path.read_text().splitlines()[:count]]
    return [row.get("prompt") or row["question"] for row in rows]


def cells(methods: tuple[str, ...], auto: bool) -> dict[str, tuple[str, dict]]:
    """label → (method, settings): each at γ = 4, and with `auto` also with auto γ and budget
    (and D), whose trees of up to 64 tips, and forks' trees beside them, cost far more CPU."""
    fixed = {m: (m, {"gamma": 4}) for m in methods}
    if not auto:
        return fixed
    ace, *ahead = methods
    return {**fixed, f"{ace} auto": (ace, AUTO),
            **{f"{m} auto": (m, {**AUTO, "chains_in_flight": "auto"}) for m in ahead}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="shared")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--auto", action="store_true", help="also each with auto γ and budget")
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument(
        "--points", type=int, nargs="+", default=list(range(len(POINTS))),
        help="which points, by index: 0 150 ms, 1 300 ms, 2 10 ms, 3 50 kbit/s",
    )  # fmt: skip
    args = parser.parse_args()
    (target, draft), path, methods = PAIRS[args.pair]
    ace = methods[0]
    texts = prompts(path, args.prompts)
    pair = wanspec.load_pair(target=target, draft=draft, dtype=torch.float32)
    table = cells(methods, args.auto)
    print(f"{draft} → {target}, {len(texts)} prompts of {path.parent.name} × {args.tokens} "
          f"tokens, T = 1, top-p {args.top_p}, {EDGE} → {CLOUD}\n")  # fmt: skip
    pairs = [(m, ace) for m in methods[1:]] + [
        (f"{m} auto", m) for m in methods if f"{m} auto" in table
    ]
    head = [*table, "ideal bound"] + [f"{num} / {den}" for num, den in pairs]
    print("| RTT | rate | " + " | ".join(head) + " | same tokens |")
    print("|---|---|" + "---|" * (len(head) + 1))
    for rtt, bps in (POINTS[i] for i in args.points):
        runs = {label: np.zeros((len(texts), 2)) for label in table}
        tokens: dict[str, list[list[int]]] = {label: [] for label in table}
        accepted: list[int] = []  # AceSpec's at γ = 4, for the ideal bound's α
        for i, text in enumerate(texts):
            for label, (method, settings) in table.items():
                res = wanspec.generate(
                    pair, text, method, link=wanspec.Link(bandwidth_bps=bps, rtt_s=rtt),
                    edge_profile=EDGE, cloud_profile=CLOUD,
                    max_new_tokens=args.tokens, seed=i, temperature=1.0, top_p=args.top_p,
                    **settings,
                )  # fmt: skip
                runs[label][i] = (len(res.token_ids), res.stats["time_s"])
                tokens[label].append(list(res.token_ids))
                if label == ace:
                    accepted += res.stats["accepted_per_round"]
        speed = [f"{r[:, 0].sum() / r[:, 1].sum():.2f}" for r in runs.values()]
        # AceSpec's one chain in flight never missing, at its best γ (bandwidth not counted)
        alpha = per_token_acceptance(accepted, 4)
        speed.append(f"{max(ideal_bound(alpha, g, 1, rtt, EDGE, CLOUD) for g in range(1, 9)):.2f}")
        ratios = [
            paired_ratio_text(runs[num][:, 0], runs[num][:, 1], runs[den][:, 0], runs[den][:, 1])
            for num, den in pairs
        ]
        same = sum(len({tuple(tokens[label][i]) for label in table}) == 1
                   for i in range(len(texts)))  # fmt: skip
        print(f"| {1e3 * rtt:g} ms | {bps:g} | " + " | ".join(speed + ratios)
              + f" | {same}/{len(texts)} |", flush=True)  # fmt: skip
        print(time.strftime("%H:%M:%S"), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
