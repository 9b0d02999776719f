"""What an experiment is, and the building blocks the experiment modules share.

An experiment is an `Experiment`: `cells(config, ctx)` lists its cells, `run_cell(cell, ctx)`
computes one (on the simulator, through the public `wanspec.generate`), `table(lines)` turns the
finished cells into rows, `plot(rows, folder)` draws them. Cells store raw per-prompt stats, so
tables and accounting can change without rerunning anything. Generation cells take any method,
dataset, profile pair, link and generation settings (`generation_cell`). The experiments
themselves live in `xcosd`, `acespec` and `capacity`; `registry` assembles them. This module
imports none of them, so each can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wanspec.bench.config import METHOD_OPTIONS, Config
from wanspec.bench.context import Context, vocab_sizes
from wanspec.bench.runner import Cell

if TYPE_CHECKING:  # numpy: kept off the command line's start-up
    from wanspec.bench.stats import Interval

Line = dict[str, Any]
Row = dict[str, Any]
# one-off messages of a request's session (handshake, prompt, close): not per-token load
SESSION_MESSAGES = {"up": ("Hello", "StartRequest", "Close"), "down": ("HelloAck",)}
REFERENCE_METHOD = "ar"  # the target model alone: the quality every lossless method must match


@dataclass(frozen=True)
class Experiment:
    """One `wanspec bench` experiment: its cells, how one runs, its table, figures and summary."""

    name: str
    title: str
    about: str
    cells: Callable[[Config, Context], list[Cell]]
    run_cell: Callable[[Cell, Context], dict[str, Any]]
    table: Callable[[list[Line]], list[Row]]
    plot: Callable[[list[Row], Path], list[Path]]
    # further Markdown tables drawn from the same rows (summary.md, printed after the table)
    summary: Callable[[list[Row]], str] | None = None


# ============================================================================ generation cells


def generation_cell(
    config: Config,
    ctx: Context,
    experiment: str,
    method: str,
    dataset: str,
    *,
    temperature: float,
    max_new_tokens: int,
    downlink_bps: float | None = None,
) -> Cell:
    """One method on one prompt set; only this method's options enter its settings."""
    prompts = ctx.prompts(dataset, config.prompts)
    generation: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_k": 0,
        "top_p": 1.0,
        "seed": config.seed,
    }
    if method != REFERENCE_METHOD:
        generation["gamma"] = config.gamma
    generation.update({k: config.options[k] for k in METHOD_OPTIONS.get(method, ())})
    link = {
        "uplink_bps": config.uplink_bps,
        "downlink_bps": downlink_bps or config.downlink_bps,
        "rtt_s": config.rtt_s,
    }
    settings = {
        "experiment": experiment,
        "method": method,
        "dataset": {"name": prompts.name, "n": len(prompts.records), "digest": prompts.digest},
        "target": config.target,
        "draft": config.draft,
        "edge_profile": config.edge_profile,
        "cloud_profile": config.cloud_profile,
        "link": link,
        "generation": generation,
    }
    key = f"{method} | {prompts.name} | T={temperature}"
    if downlink_bps:
        key += f" | down={downlink_bps:.3g} bps"
    return Cell(key, settings)


def run_generation_cell(cell: Cell, ctx: Context) -> dict[str, Any]:
    """Every prompt of the cell through `wanspec.generate`; prompt i uses seed + i."""
    import wanspec
    from wanspec.bench import metrics

    s = cell.settings
    pair = ctx.pair(s["target"], s["draft"])
    prompts = ctx.prompts(s["dataset"]["name"], s["dataset"]["n"])
    if prompts.digest != s["dataset"]["digest"]:
        raise ValueError(f"prompt set {prompts.name!r} changed while the sweep ran")
    link = wanspec.Link(
        bandwidth_bps=s["link"]["downlink_bps"],
        uplink_bps=s["link"]["uplink_bps"],
        downlink_bps=s["link"]["downlink_bps"],
        rtt_s=s["link"]["rtt_s"],
    )
    results = []
    for i, record in enumerate(prompts.records):
        generation = {**s["generation"], "seed": s["generation"]["seed"] + i}
        res = wanspec.generate(
            pair,
            record["prompt"],
            s["method"],
            link=link,
            edge_profile=s["edge_profile"],
            cloud_profile=s["cloud_profile"],
            reuse=ctx.reuse,
            **generation,
        )
        entry = {"id": record["id"], "text": res.text, "stats": res.stats}
        if prompts.task:
            entry["gold"] = metrics.gold_answer(prompts.task, record)
        results.append(entry)
    return {"vocab": vocab_sizes(pair), "task": prompts.task, "prompts": results}


def prompt_bits(stats: dict[str, Any], direction: str) -> int:
    """One prompt's bits in `direction` ("up" or "down"), the session's one-off messages left
    out: the load that grows with the tokens."""
    session = SESSION_MESSAGES[direction]
    return stats[f"{direction}link_bits"] - sum(stats["bits_by_type"].get(m, 0) for m in session)


def cell_totals(line: Line) -> dict[str, float]:
    """Sums over a cell's prompts of the quantities its tables need."""
    stats = [p["stats"] for p in line["result"]["prompts"]]
    return {
        "tokens": sum(s["new_tokens"] for s in stats),
        "time_s": sum(s["time_s"] for s in stats),
        "up_bits": sum(prompt_bits(s, "up") for s in stats),
        "down_bits": sum(prompt_bits(s, "down") for s in stats),
    }


# ============================================================================ intervals


def prompt_interval(
    line: Line,
    num: Callable[[dict[str, Any]], float],
    den: Callable[[dict[str, Any]], float],
) -> Interval | None:
    """The bootstrap interval over a cell's prompts of Σ num(stats) / Σ den(stats) (a
    `wanspec.bench.stats.Interval`, None with fewer than 2 prompts or no estimate)."""
    from wanspec.bench.stats import ratio_interval  # numpy: kept off the command line's start-up

    stats = [p["stats"] for p in line["result"]["prompts"]]
    return ratio_interval([num(s) for s in stats], [den(s) for s in stats])


def speedup_interval(line: Line, reference: Line | None) -> Interval | None:
    """The paired interval of the cell's tokens/s over `reference`'s (the same prompts resampled
    for both); None without a reference or when the two cells ran different prompts."""
    from wanspec.bench.stats import paired_ratio_interval

    if reference is None:
        return None
    ours, theirs = line["result"]["prompts"], reference["result"]["prompts"]
    if [p.get("id") for p in ours] != [p.get("id") for p in theirs]:
        return None
    return paired_ratio_interval(
        [p["stats"]["new_tokens"] for p in ours],
        [p["stats"]["time_s"] for p in ours],
        [p["stats"]["new_tokens"] for p in theirs],
        [p["stats"]["time_s"] for p in theirs],
    )


def throughput_interval(line: Line) -> Interval | None:
    """tokens/s = Σ new tokens / Σ request seconds, bootstrapped over the cell's prompts."""
    return prompt_interval(line, lambda s: s["new_tokens"], lambda s: s["time_s"])


def bits_interval(line: Line, direction: str) -> Interval | None:
    """Bits per token in `direction` without the session's messages, over the cell's prompts."""
    return prompt_interval(line, lambda s: prompt_bits(s, direction), lambda s: s["new_tokens"])


# ============================================================================ synthetic pair, E[L]


def expected_length(alpha: float, gamma: int) -> float:
    """(1 − α^γ)/(1 − α): E[L] for γ; with γ + 1, the tokens a stop-and-wait round yields."""
    return float(gamma) if alpha == 1 else (1 - alpha**gamma) / (1 - alpha)


@cache
def _byte_vocabulary() -> tuple[Any, Any]:
    """A small byte-level tokenizer and its identity alignment (trained once per process)."""
    from wanspec.models.tiny import build_tokenizer
    from wanspec.vocab import VocabAlignment

    tokenizer = build_tokenizer("bytelevel", 300)
    return tokenizer, VocabAlignment.identity(tokenizer)


def synthetic_pair(alpha: float, seed: int, alpha_alt: float | None = None) -> Any:
    """The synthetic pair with i.i.d. acceptance α (or α and `alpha_alt` in stretches), as a
    `wanspec.Pair` (shared byte tokenizer)."""
    import wanspec
    from wanspec.models.synthetic import SyntheticLM, SyntheticSpec

    tokenizer, alignment = _byte_vocabulary()
    spec = SyntheticSpec(alpha, vocab_size=alignment.target_width, seed=seed, alpha_alt=alpha_alt)
    draft, target = SyntheticLM(spec, "draft"), SyntheticLM(spec, "target")
    draft.tokenizer = target.tokenizer = tokenizer
    return wanspec.Pair(target, draft, alignment, target.name, draft.name)
