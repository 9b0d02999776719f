"""AceSpec's experiments (paper Table I, Fig. 5, Table II, Figs. 6 and 7) and the pipelines'
targets.

- `acespec-table1`: speedup over `ar` of every AceSpec baseline, per dataset, on the shared pair
  and (methods that work across vocabularies only) the heterogeneous pair;
- `acespec-bandwidth`: tokens/s against the link rate (both directions), 100 Mbit/s … 10 kbit/s;
- `acespec-ablation` (alias `ablation`): single / uniform / geometric trees at one fixed budget,
  plus, from the same run, the pipelines at 100 Mbit/s beside the ideal-pipeline bound, and
  AceSpec at 50 kbit/s as a fraction of its 100 Mbit/s throughput (`summary.md`);
- `acespec-budget`, `acespec-temperature`: tree-cache hit rate against B and against T.

They are `ACESPEC_EXPERIMENTS`, a plain list, with `ACESPEC_ALIASES`; `wanspec.bench.registry`
assembles them with the other modules' experiments.

Why these profiles. AceSpec's testbed is an AGX Orin edge and a 4×A100 cloud; wanspec prices
compute with the same hardware (`edge-orin`, `cloud-a100x4-70b`: the paper's LLaMA-1B/70B
setting), never with this machine's clock. With one chain in flight a miss costs only the
redraft, T_redraft(γ) = γ·T_edge(1), so AceSpec's gain over PicoSpec per cycle is
(P_hit,ace − P_hit,pico)·T_redraft: it is large only when the edge drafts slowly relative to the
window RTT + T_verify, yet fast enough that a tree fits inside that window. Orin's passes cost
≈40 ms whatever the number of tips up to ~64, so at γ = 4 a redraft costs 160 ms against a
window of 50 ms + 147.5 ms (70B verifying 5 positions): the redraft is 0.8 of the window, and a
tree of ~90 tips still fits in it. (With the 32B cloud, 50 + 73 ms, even B = 1 at γ = 4 does not
fit: the network-aware budget would fall to a single chain and AceSpec would be PicoSpec.)

Sampling: nucleus sampling (top-p 0.9) at T = 1, as AceSpec evaluates. The top-p support is what
makes the downlink small: with plain temperature the target distribution at a rejection would
travel over all 151,665 Qwen tokens (≈2.4 Mbit, ~50 s at 50 kbit/s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wanspec.bench.config import (
    CONFIGS,
    REAL_HETERO,
    REAL_SHARED,
    TINY_PAIR,
    TINY_SHARED_PAIR,
    Config,
)
from wanspec.bench.context import Context
from wanspec.bench.experiment import (
    REFERENCE_METHOD,
    Experiment,
    Line,
    Row,
    expected_length,
    run_generation_cell,
    speedup_interval,
)
from wanspec.bench.pipelines import (
    PipelineSetup,
    ideal_bound,
    measures,
    pipeline_cell,
    rate_text,
    sweep_cells,
    sweep_plot,
)
from wanspec.bench.runner import Cell
from wanspec.bench.tables import markdown_table

TABLE1_METHODS = ("ar", "sd", "split", "picospec", "dssd", "acespec", "acespec-x")
PIPELINE_METHODS = ("ar", "sd", "picospec", "acespec", "acespec-x")  # the pipelines' table
BANDWIDTH_METHODS = ("ar", "picospec", "acespec")
TEMPERATURE_METHODS = ("picospec", "acespec")
ALLOCATIONS = ("single", "uniform", "geometric")
# the pipelines' targets: acespec over picospec, of the ideal bound, kept on a constrained link
TARGET_VS_PICOSPEC = 1.2
TARGET_OF_BOUND = 0.9
TARGET_CONSTRAINED = 0.9


@dataclass(frozen=True, kw_only=True)
class AceSetup(PipelineSetup):
    """What AceSpec's experiments fix for one configuration size (see the module docstring)."""

    hetero_pair: tuple[str, str]  # (target, draft), two tokenizers: TLI methods only
    ablation_budget: int = 40  # B of the fixed-budget runs (ablation, temperature sweep)
    constrained_bps: float = 50e3
    bandwidths_bps: tuple[float, ...] = (1e8, 1e7, 1e6, 1e5, 5e4, 2.5e4, 1e4)
    budgets: tuple[int, ...] = (20, 30, 40, 50, 60, 70, 80)
    temperatures: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7)


SETUPS: dict[str, AceSetup] = {
    "tiny": AceSetup(
        shared_pair=TINY_SHARED_PAIR,
        hetero_pair=TINY_PAIR,
        datasets=("mini-math",),
        max_new_tokens=6,
        gamma=2,
        tree_budget=8,
        ablation_budget=6,
        bandwidths_bps=(1e8, 1e4),
        budgets=(2, 8),
        temperatures=(0.3, 1.7),
    ),
    "quick": AceSetup(  # smaller trees than the paper's: each tip is a real CPU forward here
        shared_pair=REAL_SHARED,
        hetero_pair=REAL_HETERO,
        datasets=("gsm8k", "humaneval", "alpaca"),
        max_new_tokens=48,
        tree_budget=32,
        ablation_budget=24,
    ),
    "moderate": AceSetup(  # quick's trees, 16 tokens of one prompt, each sweep's two ends
        shared_pair=REAL_SHARED,
        hetero_pair=REAL_HETERO,
        datasets=("gsm8k",),
        max_new_tokens=16,
        tree_budget=32,
        ablation_budget=24,
        bandwidths_bps=(1e8, 1e4),
        budgets=(20, 80),
        temperatures=(0.3, 1.7),
    ),
    "full": AceSetup(
        shared_pair=REAL_SHARED,
        hetero_pair=REAL_HETERO,
        datasets=("gsm8k", "humaneval", "alpaca"),
        max_new_tokens=128,
    ),
}


def setup_of(config: Config) -> AceSetup:
    """The AceSpec setup of a configuration; `--datasets` and `--max-new-tokens` replace its
    dataset list and its token budget."""
    if config.name not in SETUPS:
        raise ValueError(f"AceSpec's experiments have no {config.name!r} setup; known: {SETUPS}")
    setup, default = SETUPS[config.name], CONFIGS[config.name]
    if config.datasets != default.datasets:  # given on the command line
        setup = replace(setup, datasets=config.datasets)
    if config.tokens_given is not None:
        setup = replace(setup, max_new_tokens=config.tokens_given)
    return setup


# ============================================================================ cells


def ace_cell(
    experiment: str,
    config: Config,
    ctx: Context,
    method: str,
    dataset: str,
    pair: tuple[str, str],
    **options: Any,
) -> Cell:
    """`pipeline_cell` under the configuration's AceSpec setup."""
    return pipeline_cell(
        experiment, config, ctx, method, dataset, pair, setup_of(config), **options
    )


# ============================================================================ measures


def bound_of(line: Line, alpha: float | None, mean_budget: float | None) -> float | None:
    """`ideal_bound` for a line: its own α, γ, RTT and profiles, at its mean budget (rounded;
    1 for methods without a tree)."""
    s = line["settings"]
    gamma = s["generation"].get("gamma")
    if alpha is None or gamma is None:
        return None
    budget = max(1, round(mean_budget)) if mean_budget else 1
    return ideal_bound(
        alpha, gamma, budget, s["link"]["rtt_s"], s["edge_profile"], s["cloud_profile"]
    )


def _pair_label(line: Line) -> str:
    return f"{line['settings']['draft']} → {line['settings']['target']}"


def _tree_label(line: Line) -> str | None:
    g = line["settings"]["generation"]
    if "tree_budget" not in g:
        return None
    how = "fixed" if g["tree_fixed"] else "B_max"
    return f"{g['tree_allocation']}, {how} {g['tree_budget']}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ============================================================================ acespec-table1


def _table1_cells(config: Config, ctx: Context) -> list[Cell]:
    from wanspec.protocols.registry import get_method

    setup = setup_of(config)
    cells = []
    for dataset in setup.datasets:
        for pair, hetero in ((setup.shared_pair, False), (setup.hetero_pair, True)):
            for method in TABLE1_METHODS:
                if hetero and get_method(method).shared_vocab_only:
                    continue  # needs one tokenizer on both sides
                cells.append(ace_cell("acespec-table1", config, ctx, method, dataset, pair))
    return cells


def _table1_table(lines: list[Line]) -> list[Row]:
    from wanspec.bench.stats import ci_column

    rows = []
    for line in lines:
        m = measures(line)
        rows.append(
            {
                "pair": _pair_label(line),
                "dataset": line["settings"]["dataset"]["name"],
                "method": line["settings"]["method"],
                "tokens": m["tokens"],
                **_with_intervals(m, ("tokens/s", "decode tokens/s", "alpha", "hit rate")),
            }
        )
    reference = {
        (r["pair"], r["dataset"]): (r["tokens/s"], line)
        for r, line in zip(rows, lines, strict=True)
        if r["method"] == REFERENCE_METHOD
    }
    for r, line in zip(rows, lines, strict=True):
        base, base_line = reference.get((r["pair"], r["dataset"]), (None, None))
        r["speedup vs ar"] = _ratio(r["tokens/s"], base)
        speedup = speedup_interval(line, base_line) if r["speedup vs ar"] is not None else None
        r[ci_column("speedup vs ar")] = speedup
    return rows


def _with_intervals(row: Row, names: Sequence[str]) -> Row:
    """The columns `names` of a row, each followed by its interval column when it has one."""
    from wanspec.bench.stats import ci_column

    picked: Row = {}
    for name in names:
        picked[name] = row[name]
        if ci_column(name) in row:
            picked[ci_column(name)] = row[ci_column(name)]
    return picked


def _table1_plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots  # matplotlib: only when drawing

    series = [{**r, "pair · dataset": f"{r['pair']} · {r['dataset']}"} for r in rows]
    fig = plots.grouped_bars(
        series,
        panels=[("speedup vs ar", "throughput speedup vs ar")],
        group="method",
        series="pair · dataset",
        ylabel="× ar",
    )
    return plots.save(fig, folder, "acespec-table1")


# ============================================================================ acespec-bandwidth


def _sweep_cells(
    experiment: str, config: Config, ctx: Context, runs: list[tuple[str, dict[str, Any]]]
) -> list[Cell]:
    """One cell per (method, `ace_cell` options) on the first dataset and the shared pair."""
    return sweep_cells(experiment, config, ctx, runs, setup_of(config))


def _bandwidth_cells(config: Config, ctx: Context) -> list[Cell]:
    rates = setup_of(config).bandwidths_bps
    runs = [(m, {"bandwidth_bps": rate}) for rate in rates for m in BANDWIDTH_METHODS]
    return _sweep_cells("acespec-bandwidth", config, ctx, runs)


def _link_rows(lines: list[Line]) -> list[Row]:
    rows = []
    for line in lines:
        s, m = line["settings"], measures(line)
        rows.append(
            {
                "dataset": s["dataset"]["name"],
                "method": s["method"],
                "bandwidth bps": s["link"]["downlink_bps"],
                "T": s["generation"]["temperature"],
                "tree": _tree_label(line),
                **m,
            }
        )
    return rows


def _bandwidth_plot(rows: list[Row], folder: Path) -> list[Path]:
    return sweep_plot(
        rows,
        folder,
        "acespec-bandwidth",
        x="bandwidth bps",
        panels=[("tokens/s", "throughput, tokens/s"), ("TTFT ms", "time to first token, ms")],
        xlabel="link rate (each direction), bit/s",
        logx=True,
    )


# ============================================================================ acespec-ablation

PART_SHAPES, PART_METHODS, PART_CONSTRAINED = "Table II", "pipelines", "constrained"


def _ablation_cells(config: Config, ctx: Context) -> list[Cell]:
    """The pipelines first, then the constrained link, then Table II's shapes (a run cut
    short keeps the cells that matter most)."""
    setup = setup_of(config)
    fixed = {"tree_fixed": True, "tree_budget": setup.ablation_budget}
    runs = [
        *[(method, {}) for method in PIPELINE_METHODS],
        ("acespec", {"bandwidth_bps": setup.constrained_bps}),
        *[("acespec", {"tree": {**fixed, "tree_allocation": mode}}) for mode in ALLOCATIONS],
    ]
    return _sweep_cells("acespec-ablation", config, ctx, runs)


def _part(line: Line) -> str:
    s = line["settings"]
    if s["generation"].get("tree_fixed"):
        return PART_SHAPES
    return PART_CONSTRAINED if s["link"]["downlink_bps"] < 1e6 else PART_METHODS


def _ablation_table(lines: list[Line]) -> list[Row]:
    rows = []
    for line in lines:
        s, m = line["settings"], measures(line)
        bound = bound_of(line, m["alpha"], m["mean B"])
        gamma = s["generation"].get("gamma")
        rows.append(
            {
                "part": _part(line),
                "dataset": s["dataset"]["name"],
                "method": s["method"],
                "allocation": s["generation"].get("tree_allocation"),
                "tree": _tree_label(line),
                "bandwidth bps": s["link"]["downlink_bps"],
                "rtt ms": 1e3 * s["link"]["rtt_s"],
                "TTFT ms": m["TTFT ms"],
                **_with_intervals(m, ("hit rate", "tokens/s", "decode tokens/s", "alpha")),
                "E[L]": expected_length(m["alpha"], gamma) if m["alpha"] is not None else None,
                "tokens/round": m["tokens/round"],
                "ms/round": m["ms/round"],
                "mean B": m["mean B"],
                "ideal bound tokens/s": bound,
                "of bound": _ratio(m["decode tokens/s"], bound),  # steady state to steady state
                **_with_intervals(m, ("downlink bits/token",)),
            }
        )
    return rows


def _ablation_summary(rows: list[Row]) -> str:
    """Per dataset: whether this run tells Table II's tree shapes apart, then the pipelines' tables
    (the pipelines at the fast link beside the ideal bound, the constrained link as a fraction
    of the fast one, and whether the targets are met)."""
    parts = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        shapes = [r for r in rows if r["dataset"] == dataset and r["part"] == PART_SHAPES]
        fast = {
            r["method"]: r for r in rows if r["dataset"] == dataset and r["part"] == PART_METHODS
        }
        slow = [r for r in rows if r["dataset"] == dataset and r["part"] == PART_CONSTRAINED]
        if shapes:
            parts.append(f"### Tree shapes at one budget ({dataset})\n\n" + shapes_verdict(shapes))
        if fast:
            parts.append(_dataset_summary(dataset, fast, slow))
    return "\n\n".join(parts)


SHAPE_MEASURES = ("hit rate", "tokens/s")  # what Table II compares the shapes by


def shapes_verdict(shapes: list[Row]) -> str:
    """One sentence: for each of `SHAPE_MEASURES`, whether the tree shapes' 95 % intervals all
    overlap (this run does not tell the shapes apart) or which pairs are disjoint."""
    from wanspec.bench.stats import ci_column, interval_text

    budgets = sorted({r["mean B"] for r in shapes if r.get("mean B") is not None})
    at = f"At B = {', '.join(f'{b:g}' for b in budgets)}" if budgets else "At one budget"
    clauses = []
    for measure in SHAPE_MEASURES:
        found = [(r["allocation"], r.get(ci_column(measure))) for r in shapes]
        listed = ", ".join(f"{shape} {interval_text(ci) or 'none'}" for shape, ci in found)
        missing = [shape for shape, ci in found if ci is None]
        if len(missing) == len(found):
            clauses.append(
                f"no shape has a {measure} interval (fewer than 2 prompts, or no estimate), so "
                f"this run cannot say whether the shapes differ by {measure}"
            )
            continue
        if missing:
            clauses.append(
                f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
                f"{measure} interval ({listed}), so this run cannot say whether the shapes "
                f"differ by {measure}"
            )
            continue
        pairs = _pairs(found)
        apart = [_order(x, y) for x, y in pairs if not x[1].overlaps(y[1])]
        if not apart:
            clauses.append(
                f"the {measure} intervals all overlap ({listed}): this run does not tell the "
                f"shapes apart by {measure}"
            )
        else:
            rest = "" if len(apart) == len(pairs) else "; the other pairs overlap"
            clauses.append(
                f"by {measure}, {' and '.join(apart)} with disjoint intervals ({listed}{rest}): "
                f"this run tells {'those' if len(apart) > 1 else 'that pair'} apart"
            )
    return f"{at}, {'; '.join(clauses)}."


def _pairs(items: Sequence[Any]) -> list[tuple[Any, Any]]:
    return [(a, b) for i, a in enumerate(items) for b in items[i + 1 :]]


def _order(x: tuple[str, Any], y: tuple[str, Any]) -> str:
    """Says "low < high" of two (shape, interval) whose intervals are disjoint."""
    low, high = (x, y) if x[1].hi < y[1].lo else (y, x)
    return f"{low[0]} < {high[0]}"


def _dataset_summary(dataset: str, fast: dict[str, Row], slow: list[Row]) -> str:
    link = next(iter(fast.values()))
    fast_rate = rate_text(link["bandwidth bps"])
    pico = fast.get("picospec", {}).get("tokens/s")
    pipelines = [
        {
            "method": method,
            **_with_intervals(r, ("tokens/s",)),
            "TTFT ms": r["TTFT ms"],
            **_with_intervals(r, ("decode tokens/s",)),
            "ideal bound tokens/s": r["ideal bound tokens/s"],
            "of bound": r["of bound"],
            **_with_intervals(r, ("hit rate", "alpha")),
            "E[L]": r["E[L]"],
            "tokens/round": r["tokens/round"],
            "ms/round": r["ms/round"],
            "mean B": r["mean B"],
            "vs picospec": _ratio(r["tokens/s"], pico),
        }
        for method, r in fast.items()
    ]
    constrained = [
        {
            "method": r["method"],
            "link": rate_text(r["bandwidth bps"]),
            f"tokens/s at {fast_rate}": fast.get(r["method"], {}).get("tokens/s"),
            **_with_intervals(r, ("tokens/s",)),
            "fraction": _ratio(r["tokens/s"], fast.get(r["method"], {}).get("tokens/s")),
        }
        for r in slow
    ]
    ace = fast.get("acespec", {})
    checks = [
        ("acespec ≥ 1.2× picospec", _ratio(ace.get("tokens/s"), pico), TARGET_VS_PICOSPEC),
        ("acespec ≥ 0.9 of the ideal bound", ace.get("of bound"), TARGET_OF_BOUND),
        *[
            (
                f"{r['method']} at {r['link']} ≥ 0.9 of {fast_rate}",
                r["fraction"],
                TARGET_CONSTRAINED,
            )
            for r in constrained
        ],
    ]
    targets = [
        {"target": name, "measured": value, "met": value is not None and value >= goal}
        for name, value, goal in checks
    ]
    return "\n".join(
        [
            f"### Pipelines at {fast_rate}, RTT {link['rtt ms']:.0f} ms ({dataset})",
            "",
            "Ideal bound: E[L] / max(T_tree(B), RTT + T_verify), E[L] = (1−α^γ)/(1−α) from the "
            "run's per-token acceptance α, T_tree = γ tree passes of the edge profile at the "
            "run's mean budget B (1 without a tree), T_verify = the cloud profile at γ + 1 "
            'positions. The bound describes the steady state, so "of bound" divides the '
            "decode rate by it: tokens emitted after the first emit over the time from the "
            "first emit to the last (tokens/s counts TTFT as well). tokens/round and "
            "ms/round are measured over the whole run: E[L] assumes i.i.d. acceptance, a "
            "bursty run yields fewer tokens per round.",
            "",
            markdown_table(pipelines),
            "",
            f"### Constrained link against {fast_rate} ({dataset})",
            "",
            markdown_table(constrained),
            "",
            f"### Pipeline targets ({dataset})",
            "",
            markdown_table(targets),
        ]
    )


def _ablation_plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots
    from wanspec.bench.stats import ci_column

    shapes = [r for r in rows if r["part"] == PART_SHAPES]
    fast = [r for r in rows if r["part"] == PART_METHODS]
    fig, axes = plots.plt.subplots(1, 4, figsize=(18, 3.8))
    for ax, column in zip(axes[:3], ("hit rate", "TTFT ms", "tokens/s"), strict=True):
        ax.bar(range(len(shapes)), [r[column] or 0 for r in shapes])
        ax.set_xticks(range(len(shapes)), [str(r["allocation"]) for r in shapes])
        cis = [r.get(ci_column(column)) for r in shapes]
        plots.interval_bars(ax, range(len(shapes)), cis, "black")
        ax.set_title(f"{column} by tree shape (fixed B)")
    ax = axes[3]
    names = [r["method"] for r in fast]
    ax.bar(names, [r["tokens/s"] or 0 for r in fast], label="measured")
    plots.interval_bars(ax, names, [r.get(ci_column("tokens/s")) for r in fast], "black")
    bounds = [(n, r["ideal bound tokens/s"]) for n, r in zip(names, fast, strict=True)]
    bounds = [(n, b) for n, b in bounds if b is not None]
    ax.plot([n for n, _ in bounds], [b for _, b in bounds], "k_", ms=24, mew=2, label="bound")
    ax.set_title("tokens/s at the fast link, ideal-pipeline bound")
    ax.legend(fontsize="small")
    return plots.save(fig, folder, "acespec-ablation")


# ============================================================================ budget, temperature


def _budget_cells(config: Config, ctx: Context) -> list[Cell]:
    budgets = setup_of(config).budgets
    runs = [("acespec", {"tree": {"tree_fixed": True, "tree_budget": b}}) for b in budgets]
    return _sweep_cells("acespec-budget", config, ctx, runs)


def _budget_table(lines: list[Line]) -> list[Row]:
    return [
        {"B": line["settings"]["generation"]["tree_budget"], **row}
        for line, row in zip(lines, _link_rows(lines), strict=True)
    ]


def _budget_plot(rows: list[Row], folder: Path) -> list[Path]:
    return sweep_plot(
        rows,
        folder,
        "acespec-budget",
        x="B",
        panels=[("hit rate", "tree-cache hit rate"), ("tokens/s", "throughput, tokens/s")],
        xlabel="budget B (tips per tree pass, fixed)",
    )


def _temperature_cells(config: Config, ctx: Context) -> list[Cell]:
    setup = setup_of(config)
    fixed = {"tree_fixed": True, "tree_budget": setup.ablation_budget}
    runs = [
        (method, {"temperature": t, "tree": fixed})
        for t in setup.temperatures
        for method in TEMPERATURE_METHODS
    ]
    return _sweep_cells("acespec-temperature", config, ctx, runs)


def _temperature_plot(rows: list[Row], folder: Path) -> list[Path]:
    return sweep_plot(
        rows,
        folder,
        "acespec-temperature",
        x="T",
        panels=[("hit rate", "tree-cache hit rate"), ("alpha", "per-token acceptance α")],
        xlabel="temperature T (top-p fixed)",
    )


# ============================================================================ the experiments

_SETUP_NOTE = (
    "Simulator, virtual time: edge `edge-orin` (AGX Orin, AceSpec's edge), cloud "
    "`cloud-a100x4-70b` (4×A100, AceSpec's LLaMA-70B cloud), 100 Mbit/s each way and 50 ms "
    "RTT unless varied, nucleus sampling T = 1, top-p 0.9, γ = 4; real models decide the "
    "tokens (quick and full: Qwen2.5-Coder-0.5B → 1.5B shared, SmolLM2-135M → Qwen2.5-Coder-0.5B "
    "heterogeneous). "
)

ACESPEC_EXPERIMENTS = [
    Experiment(
        "acespec-table1",
        "Throughput speedup over the cloud alone (AceSpec Table I)",
        _SETUP_NOTE + "Speedup is tokens/s over `ar` of the same pair and dataset. Methods "
        "needing one shared vocabulary (sd, dssd = cosd, picospec, acespec) run on the shared "
        "pair only; ar, split and acespec-x on both.",
        _table1_cells,
        run_generation_cell,
        _table1_table,
        _table1_plot,
    ),
    Experiment(
        "acespec-bandwidth",
        "Throughput against the link rate (AceSpec Fig. 5)",
        _SETUP_NOTE + "The link rate is set in both directions; RTT stays 50 ms. AceSpec's "
        "budget follows the observed reply window, so a slower link also buys a larger tree.",
        _bandwidth_cells,
        run_generation_cell,
        _link_rows,
        _bandwidth_plot,
    ),
    Experiment(
        "acespec-ablation",
        "Tree shapes at one budget (AceSpec Table II) and the pipelines against their bound",
        _SETUP_NOTE + "Table II rows: acespec with a fixed budget (`tree_fixed`), single (all "
        "alternatives at depth 0), uniform, geometric (eq. 14). Pipelines rows: ar, sd, "
        "picospec, acespec (network-aware budget up to B_max) and acespec-x at 100 Mbit/s; "
        "constrained: acespec at 50 kbit/s. The summary says whether the shapes' hit-rate and "
        "tokens/s intervals tell them apart, sets each pipeline beside the ideal-pipeline "
        "bound and checks the pipelines' targets.",
        _ablation_cells,
        run_generation_cell,
        _ablation_table,
        _ablation_plot,
        _ablation_summary,
    ),
    Experiment(
        "acespec-budget",
        "Tree-cache hit rate against the budget B (AceSpec Fig. 6)",
        _SETUP_NOTE + "acespec, geometric shape, B fixed (`tree_fixed`).",
        _budget_cells,
        run_generation_cell,
        _budget_table,
        _budget_plot,
    ),
    Experiment(
        "acespec-temperature",
        "Tree-cache hit rate against the temperature (AceSpec Fig. 7)",
        _SETUP_NOTE + "acespec at the ablation's fixed budget (geometric) and picospec (its "
        "hit rate is the chain survival α^γ), top-p fixed.",
        _temperature_cells,
        run_generation_cell,
        _link_rows,
        _temperature_plot,
    ),
]

ACESPEC_ALIASES = {"ablation": "acespec-ablation"}  # other command names: alias -> experiment
