"""The main job: one prompt through every lossless method (and AR) over one emulated WAN."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

METHODS = ("ar", "naive", "ul", "xcosd", "xcosd-e")
SHARED_ONLY = ("sd", "cosd")


def run_demo(
    *,
    target: str,
    draft: str,
    prompt: str,
    max_new_tokens: int,
    link: Any,
    edge_profile: str = "measured",
    cloud_profile: str = "measured",
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Greedy and sampled runs of each method; checks the greedy texts agree with AR."""
    import wanspec

    pair = wanspec.load_pair(target=target, draft=draft)
    stats = pair.alignment.stats()
    echo(
        f"target {pair.target_name} ({stats.target_vocab} tokens), draft {pair.draft_name} "
        f"({stats.draft_vocab} tokens), common vocabulary |C| = {stats.common}"
    )
    echo(f"link: {link}")
    echo(f"compute: edge {edge_profile}, cloud {cloud_profile}")
    methods = METHODS + (SHARED_ONLY if pair.shared_vocab else ())
    rows: list[dict[str, Any]] = []
    greedy_ref: str | None = None
    header = (
        f"{'method':<9} {'T':>4} {'tok':>4} {'tok/s':>7} {'ttft ms':>8} {'acc':>5} "
        f"{'up b/tok':>9} {'down b/tok':>10}  greedy==AR"
    )
    echo(header)
    for temperature in (0.0, 0.8):
        for method in methods:
            res = wanspec.generate(
                pair,
                prompt,
                method,
                link=link,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                seed=0,
                edge_profile=edge_profile,
                cloud_profile=cloud_profile,
            )
            s = res.stats
            if temperature == 0 and method == "ar":
                greedy_ref = res.text
            same = "" if temperature else ("yes" if res.text == greedy_ref else "NO")
            acc = s.get("acceptance_rate")
            echo(
                f"{method:<9} {temperature:>4} {s['new_tokens']:>4} {s['tokens_per_s']:>7.2f} "
                f"{1e3 * (s['ttft_s'] or 0):>8.1f} {'' if acc is None else f'{acc:.2f}':>5} "
                f"{s['uplink_bits_per_token'] or 0:>9.0f} "
                f"{s['downlink_bits_per_token'] or 0:>10.0f}"
                f"  {same}"
            )
            rows.append({"temperature": temperature, **s, "text": res.text})
    echo(f"\ngreedy text: {greedy_ref!r}")
    return rows
