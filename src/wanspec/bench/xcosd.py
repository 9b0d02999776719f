"""X-CoSD's experiments: `xcosd-bits` (Table 5), `xcosd-rate`, `quality` and `analysis`.

Each is an `Experiment` (`wanspec.bench.experiment`) in `XCOSD_EXPERIMENTS`, a plain list:
`wanspec.bench.registry` assembles it with the other modules' lists, and importing this module
changes nothing elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wanspec.bench.accounting import ACCOUNTED_METHODS, Events, Vocab, paper_bits
from wanspec.bench.config import Config
from wanspec.bench.context import Context
from wanspec.bench.experiment import (
    REFERENCE_METHOD,
    Experiment,
    Line,
    Row,
    bits_interval,
    cell_totals,
    expected_length,
    generation_cell,
    prompt_interval,
    run_generation_cell,
    speedup_interval,
    synthetic_pair,
    throughput_interval,
)
from wanspec.bench.runner import Cell

if TYPE_CHECKING:  # numpy: kept off the command line's start-up
    from wanspec.bench.stats import Interval


def _per_token(total: float, tokens: int) -> float | None:
    return total / tokens if tokens else None


def _acceptance(line: Line) -> float | None:
    rounds = [a for p in line["result"]["prompts"] for a in p["stats"]["accepted_per_round"]]
    gamma = line["settings"]["generation"].get("gamma")
    return sum(rounds) / (len(rounds) * gamma) if rounds and gamma else None


def _acceptance_interval(line: Line) -> Interval | None:
    """`_acceptance`'s interval: per prompt, its accepted drafts over its drafted ones."""
    gamma = line["settings"]["generation"].get("gamma")
    if not gamma:
        return None
    return prompt_interval(
        line, lambda s: sum(s["accepted_per_round"]), lambda s: len(s["accepted_per_round"]) * gamma
    )


# ============================================================================ xcosd-bits


def _bits_cells(config: Config, ctx: Context) -> list[Cell]:
    return [
        generation_cell(
            config,
            ctx,
            "xcosd-bits",
            method,
            dataset,
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
        )
        for dataset in config.datasets
        for method in ACCOUNTED_METHODS
    ]


def paper_bits_per_prompt(line: Line) -> list[tuple[int, int]]:
    """The paper's (uplink, downlink) bits of each of a cell's prompts."""
    s = line["settings"]
    gamma = s["generation"]["gamma"]
    vocab = Vocab(**line["result"]["vocab"])
    return [
        paper_bits(s["method"], Events.from_stats(p["stats"], gamma), vocab, gamma, s["generation"])
        for p in line["result"]["prompts"]
    ]


def paper_bits_of_line(line: Line) -> tuple[int, int]:
    """The paper's (uplink, downlink) bits summed over a cell's prompts."""
    per_prompt = paper_bits_per_prompt(line)
    return sum(u for u, _ in per_prompt), sum(d for _, d in per_prompt)


def _bits_table(lines: list[Line]) -> list[Row]:
    from wanspec.bench.stats import ci_column, ratio_interval

    rows = []
    for line in lines:
        t = cell_totals(line)
        per_prompt = paper_bits_per_prompt(line)
        up, down = sum(u for u, _ in per_prompt), sum(d for _, d in per_prompt)
        tokens = [p["stats"]["new_tokens"] for p in line["result"]["prompts"]]
        rows.append(
            {
                "dataset": line["settings"]["dataset"]["name"],
                "method": line["settings"]["method"],
                "tokens": t["tokens"],
                "acceptance": _acceptance(line),
                ci_column("acceptance"): _acceptance_interval(line),
                "uplink wire": _per_token(t["up_bits"], t["tokens"]),
                ci_column("uplink wire"): bits_interval(line, "up"),
                "uplink paper": _per_token(up, t["tokens"]),
                ci_column("uplink paper"): ratio_interval([u for u, _ in per_prompt], tokens),
                "downlink wire": _per_token(t["down_bits"], t["tokens"]),
                ci_column("downlink wire"): bits_interval(line, "down"),
                "downlink paper": _per_token(down, t["tokens"]),
                ci_column("downlink paper"): ratio_interval([d for _, d in per_prompt], tokens),
            }
        )
    return rows


def _bits_plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots  # matplotlib: only when drawing

    panels = [
        ("uplink wire", "uplink, wire"),
        ("uplink paper", "uplink, paper accounting"),
        ("downlink wire", "downlink, wire"),
        ("downlink paper", "downlink, paper accounting"),
    ]
    fig = plots.grouped_bars(
        rows, panels=panels, group="method", series="dataset", ylabel="bits per token"
    )
    return plots.save(fig, folder, "xcosd-bits")


# ============================================================================ xcosd-rate

RATE_METHODS = (REFERENCE_METHOD, *ACCOUNTED_METHODS)


def _rate_cells(config: Config, ctx: Context) -> list[Cell]:
    return [
        generation_cell(
            config,
            ctx,
            "xcosd-rate",
            method,
            dataset,
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
            downlink_bps=rate,
        )
        for dataset in config.rate_datasets
        for rate in config.rates_bps
        for method in RATE_METHODS
    ]


def _rate_table(lines: list[Line]) -> list[Row]:
    from wanspec.bench.stats import ci_column

    rows = []
    for line in lines:
        t = cell_totals(line)
        stats = [p["stats"] for p in line["result"]["prompts"]]
        latencies = [s["time_s"] / s["new_tokens"] for s in stats if s["new_tokens"]]
        rows.append(
            {
                "dataset": line["settings"]["dataset"]["name"],
                "method": line["settings"]["method"],
                "downlink bps": line["settings"]["link"]["downlink_bps"],
                "tokens": t["tokens"],
                "tokens/s": t["tokens"] / t["time_s"] if t["time_s"] else None,
                ci_column("tokens/s"): throughput_interval(line),
                "per-token latency ms": 1e3 * sum(latencies) / len(latencies)
                if latencies
                else None,
                "TTFT ms": 1e3 * sum(s["ttft_s"] or 0 for s in stats) / len(stats),
            }
        )
    reference = {
        (r["dataset"], r["downlink bps"]): (r["tokens/s"], line)
        for r, line in zip(rows, lines, strict=True)
        if r["method"] == REFERENCE_METHOD
    }
    for r, line in zip(rows, lines, strict=True):
        base, base_line = reference.get((r["dataset"], r["downlink bps"]), (None, None))
        r["speedup vs ar"] = r["tokens/s"] / base if base and r["tokens/s"] else None
        speedup = speedup_interval(line, base_line) if r["speedup vs ar"] is not None else None
        r[ci_column("speedup vs ar")] = speedup
    return rows


def _rate_plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots  # matplotlib: only when drawing

    fig = plots.lines_vs(
        rows,
        x="downlink bps",
        panels=[
            ("tokens/s", "throughput, tokens/s"),
            ("per-token latency ms", "per-token latency, ms"),
        ],
        series="method",
        facet="dataset",
        xlabel="downlink rate, bit/s",
    )
    return plots.save(fig, folder, "xcosd-rate")


# ============================================================================ quality


def _quality_cells(config: Config, ctx: Context) -> list[Cell]:
    from wanspec.bench import metrics  # numpy: kept off the command line's start-up

    cells = []
    for dataset in config.quality_datasets:
        task = ctx.prompts(dataset, config.prompts).task
        if task not in metrics.METRICS:
            raise ValueError(f"dataset {dataset!r} has no quality metric (task {task!r})")
        for temperature in config.quality_temperatures:
            for method in RATE_METHODS:
                cells.append(
                    generation_cell(
                        config,
                        ctx,
                        "quality",
                        method,
                        dataset,
                        temperature=temperature,
                        max_new_tokens=config.task_tokens(task),
                    )
                )
    return cells


def _quality_table(lines: list[Line]) -> list[Row]:
    """Score, bootstrap interval, and the paired interval of (method − target) per cell."""
    from wanspec.bench import metrics
    from wanspec.protocols.registry import get_method

    stats_of: dict[tuple[str, float, str], Any] = {}
    for line in lines:
        s, result = line["settings"], line["result"]
        metric = metrics.METRICS[result["task"]]
        outputs = [p["text"] for p in result["prompts"]]
        golds = [p["gold"] for p in result["prompts"]]
        stats_of[(s["dataset"]["name"], s["generation"]["temperature"], s["method"])] = (
            metric,
            metric.stats(outputs, golds),
        )
    rows = []
    for (dataset, temperature, method), (metric, stats) in stats_of.items():
        lo, hi = metrics.bootstrap_interval(metric, stats)
        row = {
            "dataset": dataset,
            "T": temperature,
            "method": method,
            "lossless": get_method(method).lossless,
            "metric": metric.name,
            "score": metric.aggregate(stats),
            "95% CI low": lo,
            "95% CI high": hi,
        }
        reference = stats_of.get((dataset, temperature, REFERENCE_METHOD))
        if reference is not None and method != REFERENCE_METHOD:
            d_lo, d_hi = metrics.paired_difference_interval(metric, stats, reference[1])
            row.update({"Δ vs ar low": d_lo, "Δ vs ar high": d_hi, "matches ar": d_lo <= 0 <= d_hi})
        rows.append(row)
    return rows


def _quality_plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots  # matplotlib: only when drawing

    panels = [{**r, "panel": f"{r['dataset']} T={r['T']} ({r['metric']})"} for r in rows]
    fig = plots.intervals(
        panels,
        facet="panel",
        label="method",
        value="score",
        lo="95% CI low",
        hi="95% CI high",
        ylabel="score",
    )
    return plots.save(fig, folder, "quality")


# ============================================================================ analysis

ANALYSIS_RTT_S = 0.1
ANALYSIS_EDGE_MS = 20.0  # flat profiles: every pass costs the same, so the cycle is exact
ANALYSIS_CLOUD_MS = 35.0


def _analysis_cells(config: Config, ctx: Context) -> list[Cell]:
    return [
        Cell(
            f"α={alpha} γ={gamma}",
            {
                "experiment": "analysis",
                "method": "xcosd",
                "alpha": alpha,
                "gamma": gamma,
                "seeds": config.analysis_seeds,
                "max_new_tokens": config.analysis_tokens,
                "rtt_s": ANALYSIS_RTT_S,
                "edge_ms": ANALYSIS_EDGE_MS,
                "cloud_ms": ANALYSIS_CLOUD_MS,
            },
        )
        for gamma in config.analysis_gammas
        for alpha in config.alphas
    ]


def _flat_profile(name: str, ms: float) -> Any:
    from wanspec.sim import load_profile

    return load_profile({"name": name, "forward_ms": {"1": ms, "64": ms}})


def _run_analysis_cell(cell: Cell, ctx: Context) -> dict[str, Any]:
    import wanspec

    s = cell.settings
    runs = []
    for seed in range(s["seeds"]):
        res = wanspec.generate(
            synthetic_pair(s["alpha"], seed),
            "The edge drafts and the cloud verifies.",
            s["method"],
            link=wanspec.Link(bandwidth_bps=math.inf, rtt_s=s["rtt_s"]),
            edge_profile=_flat_profile("edge-flat", s["edge_ms"]),
            cloud_profile=_flat_profile("cloud-flat", s["cloud_ms"]),
            gamma=s["gamma"],
            max_new_tokens=s["max_new_tokens"],
            seed=seed,
            temperature=1.0,
        )
        runs.append(
            {"accepted_per_round": res.stats["accepted_per_round"], "time_s": res.stats["time_s"]}
        )
    return {"runs": runs}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _analysis_table(lines: list[Line]) -> list[Row]:
    from wanspec.bench.stats import ci_column, ratio_interval

    rows = []
    for line in lines:
        s, runs = line["settings"], line["result"]["runs"]
        alpha, gamma = s["alpha"], s["gamma"]
        accepted = [a for r in runs for a in r["accepted_per_round"][:-1]]  # last round may be cut
        # intervals over the seeds: each seed's run is one independent sequence of rounds
        per_run = [r["accepted_per_round"][:-1] for r in runs]
        rounds = [len(a) for a in per_run]
        e_l = expected_length(alpha, gamma)
        cycle = gamma * s["edge_ms"] + 1e3 * s["rtt_s"] + s["cloud_ms"]
        sim_l = _mean([min(a + 1, gamma) for a in accepted])
        sim_cycle = 1e3 * _mean([r["time_s"] / len(r["accepted_per_round"]) for r in runs])
        rows.append(
            {
                "alpha": alpha,
                "gamma": gamma,
                "rounds": len(accepted),
                "E[L] formula": e_l,
                "E[L] sim": sim_l,
                ci_column("E[L] sim"): ratio_interval(
                    [sum(min(a + 1, gamma) for a in run) for run in per_run], rounds
                ),
                "E[L] rel. error": sim_l / e_l - 1,
                "tokens/round formula": expected_length(alpha, gamma + 1),
                "tokens/round sim": _mean([a + 1 for a in accepted]),
                ci_column("tokens/round sim"): ratio_interval(
                    [sum(a + 1 for a in run) for run in per_run], rounds
                ),
                "cycle ms formula": cycle,
                "cycle ms sim": sim_cycle,
                "cycle rel. error": sim_cycle / cycle - 1,
            }
        )
    return rows


def _analysis_plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots  # matplotlib: only when drawing

    return plots.save(plots.analysis_figure(rows, expected_length), folder, "analysis")


# ============================================================================ the experiments

XCOSD_EXPERIMENTS = [
    Experiment(
        "xcosd-bits",
        "Communication load per generated token (X-CoSD Table 5, N = γ = 2)",
        "Uplink and downlink bits per generated token of every heterogeneous-vocabulary "
        "method, per dataset. *wire*: the exact encoded bytes wanspec sends (sparse "
        "distributions where smaller, message framing included; the one-off session "
        "messages Hello, HelloAck, StartRequest (with the prompt) and Close left out). "
        "*paper*: the same runs under X-CoSD's accounting (16 bits per probability over the "
        "vocabulary a distribution lives on), counted from each run's events; the formulas "
        "are in `wanspec.bench.accounting`.",
        _bits_cells,
        run_generation_cell,
        _bits_table,
        _bits_plot,
    ),
    Experiment(
        "xcosd-rate",
        "Throughput and per-token latency against the downlink rate (X-CoSD Figs.)",
        "Tokens per second and mean per-token latency (request time / tokens) of the same "
        "methods and the target alone (`ar`) as the downlink rate varies; uplink and RTT "
        "fixed by the configuration. Speedup is against `ar` at the same rate. `xcosd-auto` "
        "picks HR or SR-DV per round from what its rejected rounds cost on the link.",
        _rate_cells,
        run_generation_cell,
        _rate_table,
        _rate_plot,
    ),
    Experiment(
        "quality",
        "Generation quality: lossless methods match the target model",
        "BLEU (translation), ROUGE-2 (summaries), exact-match accuracy (math: final "
        "number; multiple choice: letter), per method and temperature, with a 95% "
        "bootstrap interval over prompts. *matches ar*: the paired-bootstrap interval of "
        "(method − ar) holds 0, i.e. the method's quality equals the target model's within "
        "sampling noise. Lossless methods must match; lossy ones (gr, tr, uhlm) may not.",
        _quality_cells,
        run_generation_cell,
        _quality_table,
        _quality_plot,
    ),
    Experiment(
        "analysis",
        "Analysis against the simulator (synthetic pair, i.i.d. acceptance α)",
        "E[L] = (1−α^γ)/(1−α) (AceSpec's expected accepted length, measured as "
        "E[min(A+1, γ)]), tokens per round (1−α^{γ+1})/(1−α), and the stop-and-wait cycle "
        "T_draft(γ) + RTT + T_verify with flat profiles (edge 20 ms and cloud 35 ms per "
        "pass, RTT 100 ms, unlimited bandwidth) against the discrete-event simulator.",
        _analysis_cells,
        _run_analysis_cell,
        _analysis_table,
        _analysis_plot,
    ),
]
