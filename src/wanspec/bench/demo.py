"""The main job (`wanspec demo`): the bundled pair over REAL TCP, beside the simulator's projection.

A `CloudServer` holds the target and a `WanProxy` in front of it emulates the WAN, both on
loopback on a background thread; the edge (this thread) runs each method through them with
`wanspec.generate(..., server=…)`, greedy, so every lossless method must print AR's text. Then
the simulator replays the same runs with an edge device and a data-centre GPU as compute
profiles, over the same link: on one small CPU both models share the cores, which is not where
edge-cloud speculation is meant to run, and the projection shows where it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

METHODS = ("ar", "naive", "xcosd", "xcosd-e")
SHARED_ONLY = ("sd",)
# A compiled runtime on AceSpec's edge (Jetson AGX Orin) and AceSpec's 70B cloud (4×A100).
PROJECTION = ("edge-orin-opt", "cloud-a100x4-70b")


def run_demo(
    *,
    target: str,
    draft: str,
    prompt: str,
    max_new_tokens: int,
    link: Any,
    edge_profile: str = PROJECTION[0],
    cloud_profile: str = PROJECTION[1],
    methods: tuple[str, ...] | None = None,
    echo: Callable[[str], None] | None = None,
    dtype: Any = None,
    invariant: bool | None = None,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Each method once over the real network and once projected; prints the text and one table.
    `methods` (default: `METHODS`, plus `SHARED_ONLY` for a shared vocabulary) must start with
    "ar", the baseline of the ratios. `dtype` (default float32), `invariant` and `device` load
    both models as `wanspec.load_pair` does. Returns per method {"method", "text", "real": stats,
    "cloud": the server's SessionRecord, "projected": stats, "same_as_ar"}."""
    import torch

    import wanspec
    from wanspec.net.background import cloud_behind_wan
    from wanspec.net.shaping import link_specs

    echo = echo or _say
    if methods and methods[0] != "ar":
        raise ValueError(f"the demo compares every method with 'ar': list it first, not {methods}")
    dtype = torch.float32 if dtype is None else dtype
    pair = wanspec.load_pair(
        target=target, draft=draft, dtype=dtype, invariant=invariant, device=device
    )
    vocab = pair.alignment.stats()
    echo(
        f"target {pair.target_name} ({vocab.target_vocab} tokens) in a `wanspec serve` server; "
        f"draft {pair.draft_name} ({vocab.draft_vocab} tokens) in the edge client; "
        f"common vocabulary |C| = {vocab.common}"
    )
    echo(f"WAN proxy between them: {link}")
    methods = methods or METHODS + (SHARED_ONLY if pair.shared_vocab else ())
    greedy = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    # Warm both models up (first passes allocate and pick kernels) before anything is timed;
    # a second, warm run sizes the estimate of the whole demo.
    wanspec.generate(pair, prompt, "naive", max_new_tokens=2, temperature=0.0)
    began = time.perf_counter()
    wanspec.generate(pair, prompt, "naive", max_new_tokens=4, temperature=0.0)
    echo(_estimate((time.perf_counter() - began) / 4, len(methods), max_new_tokens))
    rows: list[dict[str, Any]] = []
    with cloud_behind_wan(pair.target, pair.cloud_info, *link_specs(link)) as (address, server, _):
        for method in methods:
            res = wanspec.generate(pair, prompt, method, server=address, **greedy)
            session = session_record(server, len(rows))
            rows.append({"method": method, "text": res.text, "real": res.stats, "cloud": session})
            echo(_progress(rows[-1], rows[0], len(rows), len(methods)))
    echo("projecting the same runs on the simulator…")
    for row in rows:
        projected = wanspec.generate(
            pair,
            prompt,
            row["method"],
            link=link,
            edge_profile=edge_profile,
            cloud_profile=cloud_profile,
            **greedy,
        )
        row["projected"], row["projected_sim"] = projected.stats, projected.sim
        row["same_as_ar"] = row["text"] == rows[0]["text"] == projected.text
    _print_table(rows, edge_profile, cloud_profile, echo)
    echo(
        "srv ms/r: the server's CPU outside the forward passes per verified round (its event "
        "loop: sockets, codec, sampling, verification); acc: accepted drafts / drafted"
    )
    echo(f"\ngreedy text (every lossless method, both columns): {rows[0]['text']!r}")
    echo(_why(rows, link, edge_profile, cloud_profile))
    return rows


# Where a real win exists on a 2-core CPU: a same-family pair, the edge idle while the cloud
# verifies (stop-and-wait, so the two models never fight for the cores), a LAN-like RTT and a
# chain long enough to amortise the verification pass. Measured here: `sd` at γ = 3 made 1.24×
# `ar`'s rate over TCP (Qwen2.5-Coder 0.5B → 1.5B, greedy, 24 tokens), γ = 1 0.95×, γ = 2 1.07×;
# the pipelines, which draft while the cloud verifies, 0.9×.
WIN_PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")  # (target, draft)
WIN_METHOD, WIN_GAMMA, WIN_RTT_S = "sd", 3, 0.01


def run_shared_win(
    *,
    target: str = WIN_PAIR[0],
    draft: str = WIN_PAIR[1],
    prompt: str,
    max_new_tokens: int,
    echo: Callable[[str], None] | None = None,
    dtype: Any = None,
    invariant: bool | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """`ar` and `sd` (γ = 3) over real TCP on a shared-vocabulary pair at a LAN-like RTT, greedy:
    the setting where speculation beats the target alone on this CPU. `dtype` (default float32),
    `invariant` and `device` load the pair as `wanspec.load_pair` does. Returns {"ar", "sd":
    stats, "same_text", "speedup"} (`speedup`: sd's tokens/s over ar's)."""
    import torch

    import wanspec
    from wanspec.net.background import cloud_behind_wan
    from wanspec.net.shaping import link_specs
    from wanspec.sim import Link

    echo = echo or _say
    link = Link(bandwidth_bps=100e6, rtt_s=WIN_RTT_S)
    echo(
        f"\nA real win on this CPU: draft {draft} → target {target} (one vocabulary), "
        f"{WIN_METHOD} at γ = {WIN_GAMMA}, {link}"
    )
    dtype = torch.float32 if dtype is None else dtype
    pair = wanspec.load_pair(
        target=target, draft=draft, dtype=dtype, invariant=invariant, device=device
    )
    greedy = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    wanspec.generate(pair, prompt, WIN_METHOD, max_new_tokens=2, temperature=0.0)  # warm up
    stats, texts = {}, {}
    with cloud_behind_wan(pair.target, pair.cloud_info, *link_specs(link)) as (address, _, _):
        for method, gamma in (("ar", 1), (WIN_METHOD, WIN_GAMMA)):
            res = wanspec.generate(pair, prompt, method, server=address, gamma=gamma, **greedy)
            stats[method], texts[method] = res.stats, res.text
            rate = res.stats["tokens_per_s"]
            echo(
                f"  {method:<4} {res.stats['new_tokens']} tokens in {res.stats['time_s']:.1f} s "
                f"over TCP: {rate:.2f} tok/s ({_ratio(rate, stats['ar']['tokens_per_s'])}× ar)"
            )
    same = texts["ar"] == texts[WIN_METHOD]
    speedup = stats[WIN_METHOD]["tokens_per_s"] / stats["ar"]["tokens_per_s"]
    echo(f"  {WIN_METHOD} / ar = {speedup:.2f}×, {'same text' if same else 'TEXT DIFFERS'}")
    return {"ar": stats["ar"], WIN_METHOD: stats[WIN_METHOD], "same_text": same, "speedup": speedup}


def _say(line: str) -> None:
    """Print a line at once, also into a pipe: the demo reports as it goes."""
    print(line, flush=True)


def _estimate(per_token: float, methods: int, tokens: int) -> str:
    """What the user waits for, from a warm run's time per token (a speculative method, so both
    models): each method's real run, then its projection, which runs the models again."""
    total = 2 * methods * tokens * per_token
    return (
        f"warm-up: {per_token:.2f} s per token on this machine; {methods} methods × "
        f"{tokens} tokens over TCP, then projected: roughly {total / 60:.1f} min in all"
    )


def _progress(row: dict[str, Any], ar: dict[str, Any], done: int, total: int) -> str:
    """One line as soon as a method's real run is over."""
    real, base = row["real"], ar["real"]
    agrees = "same text as ar" if row["text"] == ar["text"] else "TEXT DIFFERS FROM ar"
    return (
        f"  [{done}/{total}] {row['method']:<10} {real['new_tokens']} tokens in "
        f"{real['time_s']:.1f} s over TCP ({_ratio(real['tokens_per_s'], base['tokens_per_s'])}× "
        f"ar's rate), {agrees}"
    )


def session_record(server: Any, index: int, timeout_s: float = 10.0) -> Any:
    """The server's record of session `index`, once the server has closed it (it lingers a
    moment after the edge is done)."""
    deadline = time.monotonic() + timeout_s
    while len(server.records) <= index:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not close session {index} in {timeout_s:g} s")
        time.sleep(0.01)
    return server.records[index]


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value and base else "-"


def _print_table(
    rows: list[dict[str, Any]], edge: str, cloud: str, echo: Callable[[str], None]
) -> None:
    base_real = rows[0]["real"]["tokens_per_s"]
    base_proj = rows[0]["projected"]["tokens_per_s"]
    echo(
        f"\n{'':<9}| {'REAL TCP on this machine (wall clock)':<66}| "
        f"SIMULATED: {edge} + {cloud}, same link"
    )
    echo(
        f"{'method':<9}| {'tok/s':>6} {'×ar':>5} {'TTFT ms':>8} {'acc':>5} {'UL b/tok':>9} "
        f"{'DL b/tok':>9} {'srv ms/r':>8} {'=ar':>4}  | {'tok/s':>6} {'×ar':>5} {'TTFT ms':>8}"
    )
    for row in rows:
        real, proj = row["real"], row["projected"]
        acc = real.get("acceptance_rate")
        same = "yes" if row["same_as_ar"] else "NO"
        echo(
            f"{row['method']:<9}| {real['tokens_per_s']:>6.2f} "
            f"{_ratio(real['tokens_per_s'], base_real):>5} {1e3 * (real['ttft_s'] or 0):>8.0f} "
            f"{'-' if acc is None else f'{acc:.2f}':>5} {real['uplink_bits_per_token'] or 0:>9.0f} "
            f"{real['downlink_bits_per_token'] or 0:>9.0f} {_server_ms_per_round(row):>8} {same:>4}"
            f"  | {proj['tokens_per_s']:>6.2f} {_ratio(proj['tokens_per_s'], base_proj):>5} "
            f"{1e3 * (proj['ttft_s'] or 0):>8.0f}"
        )


def _server_ms_per_round(row: dict[str, Any]) -> str:
    """The server's CPU outside the forward passes (its event-loop thread: sockets, codec,
    sampling and verification) per verified round; '-' for methods without rounds."""
    cloud = row["cloud"]
    return f"{1e3 * cloud.loop_cpu_s / cloud.rounds:.1f}" if cloud.rounds else "-"


@dataclass(frozen=True)
class RoundCosts:
    """Milliseconds per round of a speculative method (drafts, verification, tokens yielded)
    and per token of `ar`: what decides who is faster."""

    draft_ms: float  # all drafts of one round
    verify_ms: float  # one verification pass
    tokens: float  # tokens a round yields on average
    ar_step_ms: float  # one target step of `ar`

    def per_token_ms(self, rtt_ms: float) -> float:
        return (self.draft_ms + self.verify_ms + rtt_ms) / self.tokens


def _costs(
    draft_s: float, verify_s: float, ar_s: float, rounds: int, tokens: int, ar_tokens: int
) -> RoundCosts:
    rounds = max(rounds, 1)
    return RoundCosts(
        1e3 * draft_s / rounds,
        1e3 * verify_s / rounds,
        tokens / rounds,
        1e3 * ar_s / max(ar_tokens, 1),
    )


def _real_costs(spec: dict[str, Any], ar: dict[str, Any]) -> RoundCosts:
    """From the edge's own job timings and the server's session records."""
    from wanspec.protocols.base import Purpose

    cloud, ar_cloud = spec["cloud"].compute_s, ar["cloud"].compute_s
    return _costs(
        spec["real"]["edge_compute_s"].get(Purpose.DRAFT, 0.0),
        cloud.get(Purpose.VERIFY, 0.0),
        sum(ar_cloud.values()),
        spec["cloud"].rounds,
        spec["real"]["new_tokens"],
        ar["real"]["new_tokens"],
    )


def _projected_costs(spec: dict[str, Any], ar: dict[str, Any]) -> RoundCosts:
    """From the simulator's priced jobs."""
    from wanspec.protocols.base import Purpose

    tags, ar_tags = spec["projected_sim"].compute_by_tag, ar["projected_sim"].compute_by_tag
    return _costs(
        tags["edge"].get(Purpose.DRAFT, 0.0),
        tags["cloud"].get(Purpose.VERIFY, 0.0),
        sum(ar_tags["cloud"].values()),
        spec["projected"]["rounds"],
        spec["projected"]["new_tokens"],
        ar["projected"]["new_tokens"],
    )


def _why(rows: list[dict[str, Any]], link: Any, edge: str, cloud: str) -> str:
    """One paragraph with this run's own numbers: what a round costs against `ar`, here and in
    the projection, and so when speculation wins."""
    from wanspec.protocols.settings import GenerationSettings

    by_method = {row["method"]: row for row in rows}
    spec = by_method.get("xcosd-e") or rows[-1]
    if spec["method"] == "ar":
        return ""
    rtt = 1e3 * link.rtt_s
    gamma = GenerationSettings().gamma
    here, there = _real_costs(spec, rows[0]), _projected_costs(spec, rows[0])

    def account(c: RoundCosts) -> str:
        per_token = c.per_token_ms(rtt)
        return (
            f"{c.draft_ms:.0f} ms of drafts + {c.verify_ms:.0f} ms of verification + {rtt:.0f} ms "
            f"RTT for {c.tokens:.1f} tokens = {per_token:.0f} ms per token against "
            f"{c.ar_step_ms:.0f} ms per `ar` token ({c.ar_step_ms / per_token:.2f}×)"
        )

    def verify_note(c: RoundCosts) -> str:
        steps = c.verify_ms / c.ar_step_ms
        why = (
            " (compute-bound: a pass costs about in proportion to its tokens)"
            if steps > 1.5
            else ""
        )
        why = " (memory-bound: the weights are read once for all of them)" if steps < 1.2 else why
        return f"verifying {gamma + 1} tokens costs {steps:.1f} target steps{why}"

    return (
        f"\nWhy. Per round, {spec['method']} pays γ={gamma} draft steps, one verification pass "
        "and one RTT for the tokens it yields; `ar` pays one target step per token and streams "
        f"them without waiting on the network. Here: {account(here)}. Draft and target share "
        f"this CPU's cores: a draft step costs {here.draft_ms / gamma / here.ar_step_ms:.0%} of "
        f"a target step, and {verify_note(here)}. Projected on {edge} + {cloud}: "
        f"{account(there)}; a draft step there costs "
        f"{there.draft_ms / gamma / there.ar_step_ms:.0%} of a target step, and "
        f"{verify_note(there)}. Speculation wins where drafting is cheap next to a target step, "
        "verification costs about one step, the RTT is short next to a target step and "
        "acceptance is high."
    )
