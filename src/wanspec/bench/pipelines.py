"""What the experiments that run the pipelines (picospec, acespec, deepspec, deepspec-tree,
acespec-x, deepspec-x) share: one cell under a setup of models, link and sampling, the measures
every pipeline table draws on (per-token α as AceSpec's planner counts it, hit rates, budgets),
AceSpec's ideal-pipeline bound, and the line plot of a sweep. `bench.acespec` and
`bench.linksweep` both build on it, so neither experiment module imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wanspec.bench.config import METHOD_OPTIONS, Config
from wanspec.bench.context import Context
from wanspec.bench.experiment import (
    Line,
    Row,
    bits_interval,
    cell_totals,
    expected_length,
    prompt_interval,
    throughput_interval,
)
from wanspec.bench.runner import Cell

if TYPE_CHECKING:
    from wanspec.bench.stats import Interval

TREE_METHODS = (
    "acespec",
    "deepspec",
    "deepspec-tree",
    "acespec-x",
    "deepspec-x",
)  # the methods that take tree_* settings


@dataclass(frozen=True)
class PipelineSetup:
    """What a pipeline cell fixes besides the method: models, prompts, sampling, profiles, link
    and the tree's B_max (AceSpec's testbed unless told otherwise)."""

    shared_pair: tuple[str, str]  # (target, draft), one tokenizer
    datasets: tuple[str, ...]  # the sweeps use the first
    max_new_tokens: int
    gamma: int = 4
    temperature: float = 1.0
    top_p: float = 0.9
    edge_profile: str = "edge-orin"
    cloud_profile: str = "cloud-a100x4-70b"
    bandwidth_bps: float = 100e6  # both directions
    rtt_s: float = 0.05
    tree_budget: int = 64  # B_max of the network-aware budget


# ============================================================================ cells


def pipeline_cell(
    experiment: str,
    config: Config,
    ctx: Context,
    method: str,
    dataset: str,
    pair: tuple[str, str],
    setup: PipelineSetup,
    *,
    bandwidth_bps: float | None = None,
    rtt_s: float | None = None,
    temperature: float | None = None,
    gamma: int | str | None = None,
    depth: int | str | None = None,
    tree: dict[str, Any] | None = None,
) -> Cell:
    """One method on one prompt set under `setup`, in `run_generation_cell`'s shape; tree and
    SR-DV settings enter only the cells of the methods that read them. A link rate, RTT,
    temperature, γ or D (chains in flight) given here replaces the setup's or the method's
    default; an RTT, γ or D given enters the key."""
    from wanspec.protocols.registry import get_method

    prompts = ctx.prompts(dataset, config.prompts)
    generation: dict[str, Any] = {
        "max_new_tokens": setup.max_new_tokens,
        "temperature": setup.temperature if temperature is None else temperature,
        "top_k": 0,
        "top_p": setup.top_p,
        "seed": config.seed,
    }
    if get_method(method).needs_draft:
        generation["gamma"] = setup.gamma if gamma is None else gamma
    if method in TREE_METHODS:
        defaults = {"tree_budget": setup.tree_budget, "tree_allocation": "geometric"}
        generation.update({**defaults, "tree_fixed": False, **(tree or {})})
    if depth is not None:
        generation["chains_in_flight"] = depth
    generation.update({k: config.options[k] for k in METHOD_OPTIONS.get(method, ())})
    rate = bandwidth_bps or setup.bandwidth_bps
    settings = {
        "experiment": experiment,
        "method": method,
        "dataset": {"name": prompts.name, "n": len(prompts.records), "digest": prompts.digest},
        "target": pair[0],
        "draft": pair[1],
        "edge_profile": setup.edge_profile,
        "cloud_profile": setup.cloud_profile,
        "link": {"uplink_bps": rate, "downlink_bps": rate, "rtt_s": rtt_s or setup.rtt_s},
        "generation": generation,
    }
    key = f"{method} | {pair[1]}→{pair[0]} | {prompts.name} | {rate:.3g} bps"
    key += f" | RTT {1e3 * rtt_s:g} ms" if rtt_s else ""
    key += f" | γ={gamma}" if gamma is not None and "gamma" in generation else ""
    key += f" | D={depth}" if depth is not None else ""
    key += f" | T={generation['temperature']}"
    if method in TREE_METHODS:
        key += f" | B={generation['tree_budget']} {generation['tree_allocation']}"
        key += " fixed" if generation["tree_fixed"] else ""
    return Cell(key, settings)


def sweep_cells(
    experiment: str,
    config: Config,
    ctx: Context,
    runs: list[tuple[str, dict[str, Any]]],
    setup: PipelineSetup,
) -> list[Cell]:
    """One cell per (method, `pipeline_cell` options) on `setup`'s first dataset and shared
    pair."""
    dataset, pair = setup.datasets[0], setup.shared_pair
    return [pipeline_cell(experiment, config, ctx, m, dataset, pair, setup, **kw) for m, kw in runs]


# ============================================================================ measures


def per_token_acceptance(accepted: Sequence[int], gamma: int) -> float | None:
    """α as AceSpec's planner estimates it: Σaccepted / Σtested, a round testing its accepted
    tokens plus the first rejected one (accepted/drafted would count untested tokens as
    rejections and bias α low)."""
    from wanspec.protocols.budget import BranchPlanner

    if not accepted:
        return None
    planner = BranchPlanner(b_max=1)
    for a in accepted:
        planner.observe_round(a, gamma)
    return planner.alpha


def acceptance_counts(accepted: Sequence[int], gamma: int) -> tuple[int, int]:
    """(Σaccepted, Σtested) of `per_token_acceptance` over the given rounds: one prompt's share
    of the α estimate, which the bootstrap resamples."""
    from wanspec.protocols.budget import BranchPlanner

    planner = BranchPlanner(b_max=1)
    for a in accepted:
        planner.observe_round(a, gamma)
    return planner.accepted, planner.tested


def tree_draft_seconds(edge_profile: Any, budget: int, gamma: int) -> float:
    """T_tree(B): γ tree passes over B tips (how the pipeline drafts and the budget prices it)."""
    from wanspec.jobs import ComputeCost
    from wanspec.sim import load_profile

    return gamma * load_profile(edge_profile).seconds(ComputeCost("tree", n=budget))


def verify_seconds(cloud_profile: Any, gamma: int) -> float:
    """T_verify: one target pass over γ + 1 positions."""
    from wanspec.jobs import ComputeCost
    from wanspec.sim import load_profile

    return load_profile(cloud_profile).seconds(ComputeCost("forward", n=gamma + 1))


def ideal_bound(
    alpha: float, gamma: int, budget: int, rtt_s: float, edge_profile: Any, cloud_profile: Any
) -> float:
    """Tokens/s of an ideal pipeline that never misses: E[L] / max(T_tree(B), RTT + T_verify),
    E[L] = (1−α^γ)/(1−α) (AceSpec's T_ideal; bandwidth not counted)."""
    window = rtt_s + verify_seconds(cloud_profile, gamma)
    cycle = max(tree_draft_seconds(edge_profile, budget, gamma), window)
    return expected_length(alpha, gamma) / cycle


def _prompt_stats(line: Line) -> list[dict[str, Any]]:
    return [p["stats"] for p in line["result"]["prompts"]]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def measures(line: Line) -> Row:
    """The figures every AceSpec table draws on, summed or averaged over a cell's prompts; each
    rate is followed by its 95 % interval over the prompts (`wanspec.bench.stats`)."""
    from wanspec.bench.stats import ci_column

    s, stats = line["settings"], _prompt_stats(line)
    totals = cell_totals(line)
    gamma = s["generation"].get("gamma")
    gamma = gamma if isinstance(gamma, int) else None  # "auto": each chain's γ is the edge's
    accepted = [a for st in stats for a in st["accepted_per_round"]]
    hits = sum(st.get("cache_hits", 0) for st in stats)
    misses = sum(st.get("cache_misses", 0) for st in stats)
    budgets = [b for st in stats for b in st.get("budget_per_round") or []]
    ttfts = [st["ttft_s"] for st in stats if st["ttft_s"] is not None]
    decode_time = sum(st.get("decode_time_s", 0.0) for st in stats)
    decode_tokens = sum(st.get("decode_tokens", 0) for st in stats)
    alpha = per_token_acceptance(accepted, gamma) if gamma else None
    return {
        "tokens": totals["tokens"],
        "tokens/s": totals["tokens"] / totals["time_s"] if totals["time_s"] else None,
        ci_column("tokens/s"): throughput_interval(line),
        "decode tokens/s": decode_tokens / decode_time if decode_time else None,
        ci_column("decode tokens/s"): prompt_interval(
            line, lambda st: st.get("decode_tokens", 0), lambda st: st.get("decode_time_s", 0.0)
        ),
        "TTFT ms": 1e3 * _mean(ttfts) if ttfts else None,
        "alpha": alpha,
        ci_column("alpha"): _alpha_interval(line, gamma) if alpha is not None else None,
        "hit rate": hits / (hits + misses) if hits + misses else None,
        ci_column("hit rate"): prompt_interval(
            line,
            lambda st: st.get("cache_hits", 0),
            lambda st: st.get("cache_hits", 0) + st.get("cache_misses", 0),
        ),
        "mean B": _mean(budgets),
        "tokens/round": totals["tokens"] / len(accepted) if accepted else None,
        "ms/round": 1e3 * totals["time_s"] / len(accepted) if accepted else None,
        "uplink bits/token": totals["up_bits"] / totals["tokens"] if totals["tokens"] else None,
        ci_column("uplink bits/token"): bits_interval(line, "up"),
        "downlink bits/token": totals["down_bits"] / totals["tokens"] if totals["tokens"] else None,
        ci_column("downlink bits/token"): bits_interval(line, "down"),
    }


def _alpha_interval(line: Line, gamma: int) -> Interval | None:
    """α's interval: each prompt's (Σaccepted, Σtested), resampled by prompt."""
    from wanspec.bench.stats import ratio_interval

    counts = [acceptance_counts(st["accepted_per_round"], gamma) for st in _prompt_stats(line)]
    return ratio_interval([a for a, _ in counts], [t for _, t in counts])


def rate_text(bps: float) -> str:
    """A link rate as people write it: 100 Mbit/s, 50 kbit/s, 300 bit/s."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


# ============================================================================ plots


def sweep_plot(
    rows: list[Row],
    folder: Path,
    stem: str,
    *,
    x: str,
    panels: list[tuple[str, str]],
    xlabel: str,
    logx: bool = False,
    facet: str = "dataset",
) -> list[Path]:
    """One line per method of each panel's column against the swept setting, per `facet`."""
    from wanspec.bench import plots  # matplotlib: only when drawing

    fig = plots.lines_vs(
        rows, x=x, panels=panels, series="method", facet=facet, xlabel=xlabel, logx=logx
    )
    return plots.save(fig, folder, stem)
