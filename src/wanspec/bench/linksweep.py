"""`wanspec bench link-sweep`: tokens/s against the RTT and the link rate, every fixed γ beside
the edge's own choice (`gamma="auto"`).

Two sweeps on the simulator with AceSpec's testbed profiles (edge `edge-orin`, cloud
`cloud-a100x4-70b`) and the pipelines' cells and measures (`bench.pipelines`, as `bench.acespec`):
the RTT (10, 50, 150, 300 ms at 100 Mbit/s each way) and the link rate (50 kbit/s, 1, 10,
100 Mbit/s at 50 ms). At each point: `ar`, `sd`, `picospec` and the pipelines `acespec`,
`deepspec` and `deepspec-tree` at γ = 4, each pipeline at every other fixed γ in 1..8 (the best
fixed setting a person could have picked knowing the link), and each with `gamma="auto"`; the
auto cells also leave each tree's budget to the edge (`tree_budget="auto"`, up to 64 tips; the
fixed cells draft AceSpec's network-aware budget up to the configuration's B_max) and the two
deepspecs' the chains in flight
(`chains_in_flight="auto"`, D ≤ 8), while their fixed cells keep D = 2. A pipeline's tokens do
not depend on γ, B or D, so these cells differ only in time. Each point also gets AceSpec's
ideal-pipeline bound (`pipelines.ideal_bound` at the best γ, B = 1, the point's measured α): one
chain in flight, bandwidth not counted, so the deepspecs, which keep more chains in flight, may
pass it.

Pairs: every configuration runs the synthetic pair with i.i.d. per-token acceptance α = 0.8 and
α = 0.6 (`synthetic_pair`, as `capacity`; plain sampling at T = 1, where its α is exact), prompt i
with seed i: a cell costs about a second. tiny: 2 prompts × 16 tokens, γ ∈ {2, 4, 6}, each
sweep's two ends, B_max 8; quick: 4 × 96, B_max 32; moderate: the four mini-math prompts × 64
tokens, B_max 16; full: 16 GSM8K prompts × 256, B_max 64. Qwen2.5-Coder 0.5B → 1.5B is in none:
at the 1.7 s of CPU per generated token and cell `acespec-bandwidth` took here, its 147 cells
would take three days at 16 prompts × 64 tokens, five weeks at the full configuration's scale.

The summary judges two goals, each from the cells' tokens/s with a paired bootstrap interval
over the prompts (`wanspec.bench.stats`): (a) deepspec-tree ≥ 1.3× acespec at RTT ≥ 150 ms
and never below it (both γ = 4); (b) auto within 5 % of the best fixed γ of its method at every
point, and ≥ 1.15× its γ = 4 at the sweeps' extremes. The best fixed γ is picked on the same
runs, so it is biased upward (the largest of eight noisy rates): (b)'s first goal is judged
conservatively.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from wanspec.bench.config import CONFIGS, Config
from wanspec.bench.context import Context
from wanspec.bench.experiment import (
    Experiment,
    Line,
    Row,
    run_generation_cell,
    speedup_interval,
    synthetic_pair,
)
from wanspec.bench.pipelines import (
    PipelineSetup,
    ideal_bound,
    measures,
    per_token_acceptance,
    rate_text,
    sweep_cells,
    sweep_plot,
)
from wanspec.bench.runner import Cell
from wanspec.bench.tables import markdown_table
from wanspec.protocols.settings import AUTO_GAMMA_MAX, DEFAULT_GAMMA

NAME = "link-sweep"
BASELINES = ("ar", "sd", "picospec")  # at the default γ only
PIPELINES = ("acespec", "deepspec", "deepspec-tree")  # at every fixed γ and at "auto"
AHEAD = "deepspec-tree"  # the method goal (a) is judged on: chains in flight and forks
AUTO = "auto"
# what else a pipeline's auto cell leaves to the edge besides γ: each tree's budget
# (`tree_budget="auto"`, up to 64), and for the deepspecs the chains in flight
BUDGET_AUTO = {"tree": {"tree_budget": AUTO}}
AUTO_ALSO: dict[str, dict[str, Any]] = {
    "acespec": BUDGET_AUTO,
    "deepspec": {"depth": AUTO, **BUDGET_AUTO},
    "deepspec-tree": {"depth": AUTO, **BUDGET_AUTO},
}
SWEEP_RATE_BPS = 100e6  # the RTT sweep's link rate, each way
SWEEP_RTT_S = 0.05  # the rate sweep's RTT
# the goals
DEEP_OVER_ACE = 1.3  # the new method over acespec …
DEEP_FROM_RTT_MS = 150.0  # … at RTT at least this
AUTO_OF_BEST = 0.95  # auto within 5 % of the best fixed γ
AUTO_OVER_DEFAULT = 1.15  # auto over γ = 4 at the sweeps' extremes


@dataclass(frozen=True)
class LinkSetup:
    """What one configuration size fixes (see the module docstring)."""

    alphas: tuple[float, ...]  # one synthetic pair per α
    prompts: int
    max_new_tokens: int
    tree_budget: int  # B_max of the network-aware budget
    dataset: str = "mini-math"
    rtts_s: tuple[float, ...] = (0.01, 0.05, 0.15, 0.3)
    rates_bps: tuple[float, ...] = (5e4, 1e6, 1e7, 1e8)
    gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)

    def points(self) -> list[tuple[float, float]]:
        """(RTT s, rate bps): the RTT sweep, then the rate sweep's points not already in it."""
        points = [(rtt, SWEEP_RATE_BPS) for rtt in self.rtts_s]
        points += [(SWEEP_RTT_S, rate) for rate in self.rates_bps]
        return list(dict.fromkeys(points))


SETUPS: dict[str, LinkSetup] = {
    "tiny": LinkSetup(
        alphas=(0.8, 0.6),
        prompts=2,
        max_new_tokens=16,
        tree_budget=8,
        rtts_s=(0.01, 0.3),
        rates_bps=(5e4, 1e8),
        gammas=(2, 4, 6),
    ),
    "quick": LinkSetup(alphas=(0.8, 0.6), prompts=4, max_new_tokens=96, tree_budget=32),
    # the product's default B_max: trees are most of a cell's CPU, and on the synthetic pair
    # tokens/s barely moves past 16 tips
    "moderate": LinkSetup(alphas=(0.8, 0.6), prompts=4, max_new_tokens=64, tree_budget=16),
    "full": LinkSetup(
        alphas=(0.8, 0.6), prompts=16, max_new_tokens=256, tree_budget=64, dataset="gsm8k"
    ),
}


def setup_of(config: Config) -> LinkSetup:
    """The setup of a configuration; `--datasets`, `--prompts` and `--max-new-tokens` replace
    its prompt set, its prompt count and its token budget."""
    if config.name not in SETUPS:
        raise ValueError(f"{NAME} has no setup {config.name!r}; known: {', '.join(SETUPS)}")
    setup, default = SETUPS[config.name], CONFIGS[config.name]
    if config.datasets != default.datasets:
        setup = replace(setup, dataset=config.datasets[0])
    if config.prompts != default.prompts:
        setup = replace(setup, prompts=config.prompts)
    if config.tokens_given is not None:
        setup = replace(setup, max_new_tokens=config.tokens_given)
    return setup


# ============================================================================ cells


def _pair_names(alpha: float, seed: int) -> tuple[str, str]:
    return f"synthetic-target-a{alpha:g}-s{seed}", f"synthetic-draft-a{alpha:g}-s{seed}"


def _cells(config: Config, ctx: Context) -> list[Cell]:
    """Per pair and point: the baselines, then each pipeline at every fixed γ and at auto."""
    setup = setup_of(config)
    per_prompt = replace(config, prompts=setup.prompts)
    cells = []
    for alpha in setup.alphas:
        names = _pair_names(alpha, config.seed)
        pipeline = PipelineSetup(
            shared_pair=names,
            datasets=(setup.dataset,),
            max_new_tokens=setup.max_new_tokens,
            gamma=DEFAULT_GAMMA,
            top_p=1.0,  # plain sampling at T = 1: where the synthetic pair's α is exact
            tree_budget=setup.tree_budget,
        )
        for rtt, rate in setup.points():
            link = {"rtt_s": rtt, "bandwidth_bps": rate}
            runs = [(method, link) for method in BASELINES]
            runs += [
                (method, {**link, "gamma": gamma}) for method in PIPELINES for gamma in setup.gammas
            ]
            runs += [(method, {**link, "gamma": AUTO, **AUTO_ALSO[method]}) for method in PIPELINES]
            synthetic = {"alpha": alpha, "seed": config.seed}
            cells += [
                Cell(c.key, {**c.settings, "synthetic": synthetic})
                for c in sweep_cells(NAME, per_prompt, ctx, runs, pipeline)
            ]
    return cells


def _run_cell(cell: Cell, ctx: Context) -> dict[str, Any]:
    """`run_generation_cell`, with the cell's synthetic pair put where `ctx.pair` finds it."""
    s = cell.settings
    key = (s["target"], s["draft"])
    if "synthetic" in s and key not in ctx.pairs:
        _set_threads(ctx)
        ctx.pairs[key] = synthetic_pair(s["synthetic"]["alpha"], s["synthetic"]["seed"])
    return run_generation_cell(cell, ctx)


def _set_threads(ctx: Context) -> None:
    """Torch's threads as `wanspec.load_pair` sets them: the synthetic pair loads no weights, so
    nothing else would, and on a shared CPU a second thread makes its tiny tensors ~1000× slower."""
    import torch

    from wanspec.models.lm import default_threads

    torch.set_num_threads(ctx.threads or default_threads())


# ============================================================================ table

Point = tuple[str, float, float]  # (pair, RTT ms, rate bps)


def _pair_label(settings: dict[str, Any]) -> str:
    synthetic = settings.get("synthetic")
    if synthetic is not None:
        return f"synthetic α={synthetic['alpha']:g}"
    return f"{settings['draft']} → {settings['target']}"


def _point(line: Line) -> Point:
    s = line["settings"]
    return _pair_label(s), _ms(s["link"]["rtt_s"]), s["link"]["downlink_bps"]


def _ms(seconds: float) -> float:
    """Milliseconds, rounded so that a point's RTT compares equal however it was computed."""
    return round(1e3 * seconds, 6)


def _setting(line: Line) -> tuple[str, int | str | None]:
    """(method, γ): γ None for `ar`, "auto" where the edge chooses."""
    return line["settings"]["method"], line["settings"]["generation"].get("gamma")


def _rate(line: Line) -> float:
    stats = [p["stats"] for p in line["result"]["prompts"]]
    return sum(s["new_tokens"] for s in stats) / sum(s["time_s"] for s in stats)


def best_fixed(cells: dict[tuple[str, Any], Line], method: str) -> tuple[int, Line] | None:
    """The fixed γ of `method` with the most tokens/s at one point (the smallest on a tie)."""
    fixed = [(g, x) for (m, g), x in cells.items() if m == method and g != AUTO]
    fixed.sort(key=lambda found: found[0])
    return max(fixed, key=lambda found: _rate(found[1]), default=None)


def _ratio(name: str, line: Line, reference: Line | None) -> Row:
    """Column `name`: tokens/s over `reference`'s, and its paired interval over the prompts."""
    from wanspec.bench.stats import ci_column

    if reference is None:
        return {name: None, ci_column(name): None}
    return {
        name: _rate(line) / _rate(reference),
        ci_column(name): speedup_interval(line, reference),
    }


def _mean_gamma(line: Line) -> float | None:
    """The chains' mean length: a pipeline drafts one fan-out entry per depth of its chain."""
    lengths = [
        len(f) for p in line["result"]["prompts"] for f in p["stats"].get("fanout_per_round") or []
    ]
    return sum(lengths) / len(lengths) if lengths else None


def _bound(cells: dict[tuple[str, Any], Line], gammas: Sequence[int]) -> float | None:
    """`ideal_bound` at the point's best γ with B = 1 (never a miss, so no tree), from acespec's
    per-token acceptance at the default γ."""
    line = cells.get(("acespec", DEFAULT_GAMMA))
    if line is None:
        return None
    accepted = [a for p in line["result"]["prompts"] for a in p["stats"]["accepted_per_round"]]
    alpha = per_token_acceptance(accepted, DEFAULT_GAMMA)
    if alpha is None:
        return None
    s = line["settings"]
    rtt, edge, cloud = s["link"]["rtt_s"], s["edge_profile"], s["cloud_profile"]
    return max(ideal_bound(alpha, g, 1, rtt, edge, cloud) for g in gammas)


def _table(lines: list[Line]) -> list[Row]:
    """One row per cell; auto rows add their method's best fixed γ at the point, and every row
    its tokens/s over acespec's at γ = 4."""
    from wanspec.bench.stats import ci_column

    points: dict[Point, dict[tuple[str, Any], Line]] = {}
    for line in lines:
        points.setdefault(_point(line), {})[_setting(line)] = line
    gammas = range(1, AUTO_GAMMA_MAX + 1)  # every γ a pipeline may run
    bounds = {point: _bound(cells, gammas) for point, cells in points.items()}
    rows = []
    for line in lines:
        point, (method, gamma) = _point(line), _setting(line)
        cells, m = points[point], measures(line)
        row: Row = {
            "pair": point[0],
            "RTT ms": point[1],
            "rate bps": point[2],
            "method": method,
            "γ": gamma,
            "tokens/s": m["tokens/s"],
            ci_column("tokens/s"): m[ci_column("tokens/s")],
            "alpha": m["alpha"],
            "hit rate": m["hit rate"],
            "mean B": m["mean B"],
            "mean γ": _mean_gamma(line),
            "ideal bound tokens/s": bounds[point],
            **_ratio(f"vs acespec γ={DEFAULT_GAMMA}", line, cells.get(("acespec", DEFAULT_GAMMA))),
        }
        if gamma == AUTO:
            best = best_fixed(cells, method)
            row["best fixed γ"] = best[0] if best else None
            row.update(_ratio("vs best fixed", line, best[1] if best else None))
            row.update(_ratio(f"vs γ={DEFAULT_GAMMA}", line, cells.get((method, DEFAULT_GAMMA))))
        rows.append(row)
    return rows


# ============================================================================ summary


def _series(row: Row) -> str | None:
    """The row's line in the summary and the plots: baselines and pipelines at γ = 4 by method
    name, auto as "METHOD auto"; other fixed γ have none (they enter as the best fixed)."""
    if row["method"] in BASELINES:
        return row["method"]
    if row["γ"] == AUTO:
        return f"{row['method']} auto"
    return row["method"] if row["γ"] == DEFAULT_GAMMA else None


SERIES = (*BASELINES, *PIPELINES, *(f"{m} auto" for m in PIPELINES))


def _find(rows: Sequence[Row], method: str, gamma: Any) -> Row | None:
    return next((r for r in rows if r["method"] == method and r["γ"] == gamma), None)


def _estimate(value: float | None, ci: Any, ratio: bool = False) -> str:
    """A rate (3 significant digits) or a ratio ("1.234×"), with its interval when it has one."""
    from wanspec.bench.stats import interval_text

    if value is None:
        return "no data"
    shown = f"{value:.3f}×" if ratio else f"{value:.3g}"
    return f"{shown} {interval_text(ci)}" if ci is not None else shown


def _where(row: Row) -> str:
    return f"RTT {row['RTT ms']:g} ms, {rate_text(row['rate bps'])}"


def _sweep_table(rows: Sequence[Row], x: str, header: str, shown: Any) -> str:
    """tokens/s of each series per point of one sweep, with the best fixed γ and the bound."""
    from wanspec.bench.stats import ci_column

    table = []
    for value in sorted({r[x] for r in rows}):
        here = [r for r in rows if r[x] == value]
        entry: Row = {header: shown(value)}
        for name in SERIES:
            row = next((r for r in here if _series(r) == name), None)
            entry[name] = _estimate(row["tokens/s"], row[ci_column("tokens/s")]) if row else ""
        for method in PIPELINES:
            auto = _find(here, method, AUTO)
            best = _find(here, method, auto.get("best fixed γ")) if auto else None
            entry[f"{method} best fixed"] = (
                f"{best['tokens/s']:.3g} (γ={best['γ']})" if best else ""
            )
        entry["ideal bound"] = here[0]["ideal bound tokens/s"]
        table.append(entry)
    return markdown_table(table)


class Goal(NamedTuple):
    """One goal judged on one pair's rows: `letter` is (a) or (b) of the module docstring."""

    letter: str
    text: str
    met: bool
    evidence: str

    def __str__(self) -> str:
        return f"- ({self.letter}) {self.text}: **{_met(self.met)}** — {self.evidence}"


def _met(met: bool) -> str:
    return "met" if met else "not met"


def _ratios(rows: Sequence[Row], column: str) -> str:
    """Each row's ratio in `column` with its interval, where it was measured."""
    from wanspec.bench.stats import ci_column

    def text(r: Row) -> str:
        against = f" (best fixed γ = {r['best fixed γ']})" if column == "vs best fixed" else ""
        return f"{_where(r)}: {_estimate(r[column], r[ci_column(column)], ratio=True)}{against}"

    return "; ".join(map(text, rows))


def _check(
    letter: str, text: str, rows: Sequence[Row], column: str, least: float, *, each: bool
) -> Goal:
    """Met when there are rows and each one's `column` is at least `least`; the evidence lists
    every row (`each`) or the lowest. A row without the ratio fails the goal."""
    judged = [r for r in rows if r.get(column) is not None]
    met = bool(rows) and len(judged) == len(rows) and all(r[column] >= least for r in judged)
    if not judged:
        evidence = "no point to judge by"
    elif each:
        evidence = _ratios(judged, column)
    else:
        evidence = "lowest at " + _ratios([min(judged, key=lambda r: r[column])], column)
    if len(judged) < len(rows):
        evidence += f"; {len(rows) - len(judged)} point(s) without the ratio"
    return Goal(letter, text, met, evidence)


def goals(rows: Sequence[Row]) -> list[Goal]:
    """Goals (a) and (b) of the module docstring, judged on one pair's rows."""
    vs_ace, vs_default = f"vs acespec γ={DEFAULT_GAMMA}", f"vs γ={DEFAULT_GAMMA}"
    deep = [r for r in rows if r["method"] == AHEAD and r["γ"] == DEFAULT_GAMMA]
    far = [r for r in deep if r["rate bps"] == SWEEP_RATE_BPS and r["RTT ms"] >= DEEP_FROM_RTT_MS]
    at = f"(γ = {DEFAULT_GAMMA})"
    found = [
        _check(
            "a",
            f"{AHEAD} ≥ {DEEP_OVER_ACE:g}× acespec at RTT ≥ {DEEP_FROM_RTT_MS:g} ms {at}",
            far,
            vs_ace,
            DEEP_OVER_ACE,
            each=True,
        ),
        _check("a", f"{AHEAD} never below acespec {at}", deep, vs_ace, 1.0, each=False),
    ]
    ends = _extremes([r for r in rows if r["rate bps"] == SWEEP_RATE_BPS], "RTT ms")
    ends += _extremes([r for r in rows if r["RTT ms"] == _ms(SWEEP_RTT_S)], "rate bps")
    for method in PIPELINES:
        autos = [r for r in rows if r["method"] == method and r["γ"] == AUTO]
        within = f"{100 * (1 - AUTO_OF_BEST):g} %"
        found += [
            _check(
                "b",
                f"{method} auto within {within} of the best fixed γ at every point",
                autos,
                "vs best fixed",
                AUTO_OF_BEST,
                each=False,
            ),
            _check(
                "b",
                f"{method} auto ≥ {AUTO_OVER_DEFAULT:g}× γ = {DEFAULT_GAMMA} at the sweeps' "
                "extremes",
                [r for r in autos if (r["RTT ms"], r["rate bps"]) in ends],
                vs_default,
                AUTO_OVER_DEFAULT,
                each=True,
            ),
        ]
    return found


def _extremes(rows: Sequence[Row], x: str) -> list[tuple[float, float]]:
    """The (RTT ms, rate bps) of a sweep's lowest and highest `x`."""
    values = sorted({r[x] for r in rows})
    ends = {values[0], values[-1]} if values else set()
    return sorted({(r["RTT ms"], r["rate bps"]) for r in rows if r[x] in ends})


def verdict(found: Sequence[Goal]) -> dict[str, bool]:
    """Each goal letter: met when every goal of that letter is."""
    return {
        letter: all(g.met for g in found if g.letter == letter)
        for letter in dict.fromkeys(g.letter for g in found)
    }


def _summary(rows: list[Row]) -> str:
    """Per pair: both sweeps' tables, each goal with its numbers, and the verdict line."""
    parts = [
        "Each cell: tokens/s over the prompts [95 % interval]; "
        f"{', '.join((*BASELINES, *PIPELINES))} at γ = {DEFAULT_GAMMA}; "
        "*best fixed*: the fixed γ of the sweep with the most tokens/s there; "
        "*ideal bound*: AceSpec's pipeline with one chain in flight that never misses, at its "
        "best γ (bandwidth not counted). The goals' ratios are tokens/s over tokens/s with a "
        "paired interval over the prompts; met or not compares the point estimate with the "
        "goal, the interval says how sure that is.",
        "",
    ]
    for pair in dict.fromkeys(r["pair"] for r in rows):
        mine = [r for r in rows if r["pair"] == pair]
        by_rtt = [r for r in mine if r["rate bps"] == SWEEP_RATE_BPS]
        by_rate = [r for r in mine if r["RTT ms"] == _ms(SWEEP_RTT_S)]
        found = goals(mine)
        judged = ", ".join(f"({k}) {_met(v)}" for k, v in verdict(found).items())
        parts += [
            f"### tokens/s against the RTT at {rate_text(SWEEP_RATE_BPS)} ({pair})",
            "",
            _sweep_table(by_rtt, "RTT ms", "RTT ms", lambda v: f"{v:g}"),
            "",
            f"### tokens/s against the link rate at RTT {_ms(SWEEP_RTT_S):g} ms ({pair})",
            "",
            _sweep_table(by_rate, "rate bps", "rate", rate_text),
            "",
            f"### Goals ({pair})",
            "",
            *map(str, found),
            "",
            f"Verdict ({pair}): {judged}.",
            "",
        ]
    return "\n".join(parts).rstrip()


# ============================================================================ plots


def _plot_rows(rows: Sequence[Row], x: str) -> list[Row]:
    """The series' tokens/s (and intervals) against `x`, and the ideal bound per point."""
    from wanspec.bench.stats import ci_column

    picked = [
        {
            "pair": r["pair"],
            x: r[x],
            "method": _series(r),
            "tokens/s": r["tokens/s"],
            ci_column("tokens/s"): r[ci_column("tokens/s")],
        }
        for r in rows
        if _series(r) is not None
    ]
    points = {(r["pair"], r[x]): r["ideal bound tokens/s"] for r in rows}
    picked += [
        {"pair": pair, x: value, "method": "ideal bound (1 chain)", "tokens/s": bound}
        for (pair, value), bound in points.items()
        if bound is not None
    ]
    return picked


def _plot(rows: list[Row], folder: Path) -> list[Path]:
    by_rtt = [r for r in rows if r["rate bps"] == SWEEP_RATE_BPS]
    by_rate = [r for r in rows if r["RTT ms"] == _ms(SWEEP_RTT_S)]
    panel = [("tokens/s", "throughput, tokens/s")]
    return [
        *sweep_plot(
            _plot_rows(by_rtt, "RTT ms"),
            folder,
            f"{NAME}-rtt",
            x="RTT ms",
            panels=panel,
            xlabel=f"RTT, ms ({rate_text(SWEEP_RATE_BPS)} each way)",
            logx=True,
            facet="pair",
        ),
        *sweep_plot(
            _plot_rows(by_rate, "rate bps"),
            folder,
            f"{NAME}-rate",
            x="rate bps",
            panels=panel,
            xlabel=f"link rate (each way), bit/s (RTT {_ms(SWEEP_RTT_S):g} ms)",
            logx=True,
            facet="pair",
        ),
    ]


LINK_EXPERIMENTS = [
    Experiment(
        NAME,
        "Tokens/s against the RTT and the link rate, fixed γ against γ = auto",
        "Simulator, virtual time, AceSpec's testbed: edge `edge-orin`, cloud `cloud-a100x4-70b`. "
        "RTT 10, 50, 150, 300 ms at 100 Mbit/s each way, and 50 kbit/s, 1, 10, 100 Mbit/s at "
        "50 ms. The synthetic pair (i.i.d. per-token acceptance α = 0.8 and 0.6) decides the "
        "tokens at T = 1; prompt i runs seed i. ar, sd, picospec at γ = 4; acespec and deepspec "
        "(AceSpec with D = 2 chains in flight) at every fixed γ and with "
        '`gamma="auto"` (the edge picks γ ≤ 8 per chain from what it measures; deepspec\'s auto '
        'also picks D ≤ 8, `chains_in_flight="auto"`; every auto also picks each tree\'s budget '
        "up to 64, where the fixed cells draft AceSpec's network-aware budget up to B_max). "
        "The summary tabulates both sweeps and judges goals (a) "
        "deepspec ≥ 1.3× acespec at RTT ≥ 150 ms, never below it; (b) auto within 5 % of the "
        "best fixed γ everywhere and ≥ 1.15× γ = 4 at the sweeps' extremes.",
        _cells,
        _run_cell,
        _table,
        _plot,
        _summary,
    )
]
