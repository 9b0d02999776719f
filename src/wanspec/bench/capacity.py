"""`wanspec bench capacity`: how many edges one cloud serves before each edge slows down by 20%.

N edges (1, 2, 4, … 64), each with its own link and request, share one cloud accelerator on the
simulator (`wanspec.sim.simulate_many`): the cloud batches continuously by the policy `wanspec
serve`'s model thread runs (`wanspec.models.batch_policy`: the oldest job, then each later one
that keeps rows × longest row within `max_batch_tokens`; a prompt over `prefill_chunk` tokens in
pieces), each pass priced by the cloud profile's `T(tokens, sessions)` (weights read once per
pass, per-token compute along the profile's slope, each further session's KV-cache read).
Cloud profiles: `cloud-a100-8b` (one A100, X-CoSD's server, with X-CoSD's TITAN RTX edge) and the
4×A100 `cloud-a100-32b` and `cloud-a100x4-70b` (AceSpec's cloud, with its Orin edge).

Tokens: the synthetic pair with i.i.d. per-token acceptance α (default 0.8, about what the real
Qwen2.5-Coder 0.5B → 1.5B pair measured in the AceSpec benchmark), so a sweep of hundreds of
requests takes minutes; the compute is priced by the profiles either way. A setup may name a
real (target, draft) pair instead.

Edge i sends prompt i (cycled) with seed + i over a link of its own, starting at a seeded
uniform time in [0, stagger_s) (edges do not arrive in lockstep). Its slowdown is its tokens/s
beside the very same request run alone (seed, prompt and link: one `alone` cell per cloud and
RTT), which removes the spread of acceptance between edges from the comparison; "within 20%"
holds for N when the edges' mean keeps ≥ 0.8 of their alone rate, and the capacity is the
largest N of the sweep before the first N that does not.

`CAPACITY_EXPERIMENTS` holds the two experiments, `capacity` (the synthetic pair) and
`capacity-real` (real models decide the tokens); `wanspec.bench.registry` assembles them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from wanspec.bench.config import REAL_SHARED, TINY_SHARED_PAIR, Config
from wanspec.bench.context import Context
from wanspec.bench.experiment import Experiment, Line, Row, synthetic_pair
from wanspec.bench.runner import Cell
from wanspec.models.batch_policy import DEFAULT_MAX_BATCH_TOKENS, DEFAULT_PREFILL_CHUNK

SLOWDOWN = 0.2  # the question's 20%
PAPER_CLOUDS = (  # (cloud profile, the edge profile of the paper that used that cloud)
    ("cloud-a100-8b", "edge-titanrtx-68m"),
    ("cloud-a100-32b", "edge-orin"),
    ("cloud-a100x4-70b", "edge-orin"),
)


@dataclass(frozen=True)
class CapacitySetup:
    """What one configuration size fixes (see the module docstring)."""

    clouds: tuple[tuple[str, str], ...]
    rtts_s: tuple[float, ...]
    edges: tuple[int, ...]
    max_new_tokens: int
    pair: tuple[str, str] | None = None  # (target, draft); None: the synthetic pair with alpha
    alpha: float = 0.8
    method: str = "cosd"  # shared vocabulary (the synthetic pair); one verify pass per round
    gamma: int = 4
    temperature: float = 1.0
    bandwidth_bps: float = 100e6
    stagger_s: float = 0.5
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS  # the server's defaults
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    dataset: str = "mini-math"


CellsFn = Callable[[Config, Context], list[Cell]]
SETUPS: dict[str, CapacitySetup] = {
    "tiny": CapacitySetup(
        clouds=PAPER_CLOUDS[:1], rtts_s=(0.05,), edges=(1, 2, 4), max_new_tokens=24
    ),
    "quick": CapacitySetup(
        clouds=PAPER_CLOUDS, rtts_s=(0.05, 0.15), edges=(1, 2, 4, 8, 16, 32, 64), max_new_tokens=96
    ),
    "full": CapacitySetup(
        clouds=PAPER_CLOUDS, rtts_s=(0.05, 0.15), edges=(1, 2, 4, 8, 16, 32, 64), max_new_tokens=256
    ),
}
SETUPS["moderate"] = SETUPS["quick"]  # the synthetic pair costs seconds: no smaller run needed


# real models decide the tokens (`capacity-real`): AceSpec's Qwen pair, shared vocabulary
REAL_SETUPS: dict[str, CapacitySetup] = {
    "tiny": replace(SETUPS["tiny"], pair=TINY_SHARED_PAIR, edges=(1, 2), max_new_tokens=12),
    "quick": CapacitySetup(
        clouds=PAPER_CLOUDS[1:2],
        rtts_s=(0.05, 0.15),
        edges=(1, 2, 4, 8),
        max_new_tokens=32,
        pair=REAL_SHARED,
        dataset="gsm8k",
    ),
    "moderate": CapacitySetup(  # docs/RESULTS.md: minutes on one CPU core
        clouds=PAPER_CLOUDS[1:2],
        rtts_s=(0.05,),
        edges=(1, 2, 4),
        max_new_tokens=16,
        pair=REAL_SHARED,
        dataset="gsm8k",
    ),
    "full": replace(SETUPS["full"], clouds=PAPER_CLOUDS[1:], pair=REAL_SHARED, dataset="gsm8k"),
}


# ============================================================================ cells


def _cells_of(name: str, setups: dict[str, CapacitySetup]) -> CellsFn:
    """The cell list of experiment `name`, whose configuration sizes are `setups`."""

    def cells(config: Config, ctx: Context) -> list[Cell]:
        if config.name not in setups:
            raise ValueError(f"{name} has no setup {config.name!r}; known: {', '.join(setups)}")
        return _cells(name, setups[config.name], config.seed, ctx)

    return cells


def _cells(name: str, setup: CapacitySetup, seed: int, ctx: Context) -> list[Cell]:
    prompts = ctx.prompts(setup.dataset, max(setup.edges))
    common = {
        **asdict(setup),
        "experiment": name,
        "seed": seed,
        "dataset": {"name": prompts.name, "n": len(prompts.records), "digest": prompts.digest},
    }
    for key in ("clouds", "rtts_s", "edges"):
        del common[key]
    cells = []
    for cloud, edge in setup.clouds:
        for rtt in setup.rtts_s:
            where = {**common, "cloud_profile": cloud, "edge_profile": edge, "rtt_s": rtt}
            label = f"{cloud} | RTT {1e3 * rtt:g} ms"
            alone = {**where, "mode": "alone", "edges": max(setup.edges)}
            cells.append(Cell(f"{label} | alone", alone))
            cells += [
                Cell(f"{label} | {n} edges", {**where, "mode": "shared", "edges": n})
                for n in setup.edges
            ]
    return cells


def _pair(s: dict[str, Any], ctx: Context) -> Any:
    if s["pair"] is None:
        return synthetic_pair(s["alpha"], s["seed"])
    return ctx.pair(*s["pair"])


def _sessions(s: dict[str, Any], ctx: Context, starts: Sequence[float]) -> list[Any]:
    """Edge i's request (prompt i, seed + i, a link of its own) starting at starts[i]."""
    import wanspec
    from wanspec.models.jobs import session_executor
    from wanspec.protocols.settings import GenerationSettings
    from wanspec.sim import EdgeSession

    pair = _pair(s, ctx)
    records = ctx.prompts(s["dataset"]["name"], s["dataset"]["n"]).records
    sessions = []
    for i, start in enumerate(starts):
        settings = GenerationSettings(
            max_new_tokens=s["max_new_tokens"],
            temperature=s["temperature"],
            gamma=s["gamma"],
            seed=s["seed"] + i,
        )
        edge, cloud = pair.machines(s["method"], records[i % len(records)]["prompt"], settings)
        link = wanspec.Link(bandwidth_bps=s["bandwidth_bps"], rtt_s=s["rtt_s"], seed=i)
        executors = (session_executor(pair.edge_model(s["method"])), session_executor(pair.target))
        sessions.append(EdgeSession(edge, cloud, link, *executors, s["edge_profile"], start))
    return sessions


def start_times(seed: int, edges: int, stagger_s: float) -> list[float]:
    """When each edge starts: seeded, uniform in [0, stagger_s)."""
    return [float(t) for t in np.random.default_rng([seed, edges]).uniform(0, stagger_s, edges)]


def _run_cell(cell: Cell, ctx: Context) -> dict[str, Any]:
    """Shared: all edges on one cloud. Alone: each edge's request on a cloud of its own."""
    from wanspec.sim import simulate_many

    s = cell.settings
    batching = {"max_batch_tokens": s["max_batch_tokens"], "prefill_chunk": s["prefill_chunk"]}
    if s["mode"] == "alone":
        edges = _sessions(s, ctx, [0.0] * s["edges"])
        runs = [simulate_many([one], s["cloud_profile"], **batching).sessions[0] for one in edges]
        return {"sessions": [_session_stats(r) for r in runs]}
    starts = start_times(s["seed"], s["edges"], s["stagger_s"])
    run = simulate_many(_sessions(s, ctx, starts), s["cloud_profile"], **batching)
    return {
        "sessions": [_session_stats(r) for r in run.sessions],
        "starts": starts,
        "end_s": run.end_s,
        "cloud_busy_s": run.cloud_busy_s,
        "passes": len(run.passes),
        "batch_sessions": run.mean_batch_sessions,
        "batch_tokens": sum(p.tokens for p in run.passes) / len(run.passes),
        "max_wait_s": max(w for p in run.passes for w in p.waits),
    }


def _session_stats(res: Any) -> dict[str, Any]:
    return {"tokens": len(res.tokens), "time_s": res.duration_s, "ttft_s": res.ttft_s}


# ============================================================================ table


def _rate(session: dict[str, Any]) -> float:
    return session["tokens"] / session["time_s"]


def _where(line: Line) -> tuple[str, str, float]:
    s = line["settings"]
    return s["cloud_profile"], s["edge_profile"], s["rtt_s"]


def _table(lines: list[Line]) -> list[Row]:
    """One row per cell: shared cells against their edges alone, alone cells as reference."""
    alone = {_where(x): [_rate(e) for e in x["result"]["sessions"]] for x in lines if _alone(x)}
    first = {
        _where(x): _mean([_rate(e) for e in x["result"]["sessions"]])
        for x in lines
        if not _alone(x) and x["settings"]["edges"] == 1
    }
    return [_row(x, alone.get(_where(x)), first.get(_where(x))) for x in lines]


def _alone(line: Line) -> bool:
    return line["settings"]["mode"] == "alone"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _row(line: Line, alone: list[float] | None, first: float | None) -> Row:
    s, r = line["settings"], line["result"]
    rates = [_rate(e) for e in r["sessions"]]
    row: Row = {
        "cloud": s["cloud_profile"],
        "edge": s["edge_profile"],
        "RTT ms": round(1e3 * s["rtt_s"], 3),
        "edges": "alone" if _alone(line) else s["edges"],
        "per-edge tok/s": _mean(rates),
    }
    if _alone(line):
        return row
    ratios = [a / b for a, b in zip(rates, alone or [], strict=False)]
    span = r["end_s"] - min(r["starts"])
    relative = _mean(ratios) if len(ratios) == len(rates) else None
    row.update(
        {
            "total tok/s": sum(e["tokens"] for e in r["sessions"]) / span,
            "vs alone": relative,
            "worst edge vs alone": min(ratios) if relative is not None else None,
            "vs 1 edge": _mean(rates) / first if first else None,
            "within 20%": relative is not None and relative >= 1 - SLOWDOWN,
            "cloud busy": r["cloud_busy_s"] / span,
            "sessions/pass": r["batch_sessions"],
            "tokens/pass": r["batch_tokens"],
            "max wait ms": 1e3 * r["max_wait_s"],
        }
    )
    return row


def _key(row: Row) -> tuple[str, str, float]:
    return row["cloud"], row["edge"], row["RTT ms"]


def capacity(rows: Sequence[Row]) -> dict[tuple[str, str, float], tuple[int, bool]]:
    """Per (cloud, edge, RTT): the largest N before the first N not within 20%, and whether
    every N of the sweep was within (then the capacity is at least that N)."""
    found: dict[tuple[str, str, float], tuple[int, bool]] = {}
    for key in dict.fromkeys(_key(r) for r in rows):
        shared = [r for r in rows if _key(r) == key and r["edges"] != "alone"]
        shared.sort(key=lambda r: r["edges"])
        best, every = 0, True
        for r in shared:
            if not r["within 20%"]:
                every = False
                break
            best = r["edges"]
        found[key] = (best, every)
    return found


def _summary(rows: list[Row]) -> str:
    lines = [
        "Edges one cloud serves before per-edge tokens/s drops 20% (largest N of the sweep "
        "before the first N whose edges keep < 0.8 of their alone rate):",
        "",
        "| cloud | edge | RTT ms | edges within 20% | per-edge tok/s alone | total tok/s there |",
        "|---|---|---|---|---|---|",
    ]
    for key, (n, every) in capacity(rows).items():
        cloud, edge, rtt = key
        alone = [r for r in rows if _key(r) == key and r["edges"] == "alone"]
        there = [r for r in rows if _key(r) == key and r["edges"] == n]
        rate = f"{alone[0]['per-edge tok/s']:.1f}" if alone else ""
        total = f"{there[0]['total tok/s']:.1f}" if there else ""
        shown = f"≥ {n}" if every else str(n)
        lines.append(f"| {cloud} | {edge} | {rtt:g} | {shown} | {rate} | {total} |")
    return "\n".join(lines)


def _plot(rows: list[Row], folder: Path) -> list[Path]:
    from wanspec.bench import plots  # matplotlib: only when drawing

    shared = [{**r, "RTT": f"{r['RTT ms']:g} ms"} for r in rows if r["edges"] != "alone"]
    fig = plots.lines_vs(
        shared,
        x="edges",
        panels=[("vs alone", "per-edge tokens/s vs alone"), ("total tok/s", "total tokens/s")],
        series="RTT",
        facet="cloud",
        xlabel="edges sharing the cloud",
    )
    return plots.save(fig, folder, folder.name)


ABOUT = (
    "N edges, each with its own 100 Mbit/s link and request, share one cloud that batches "
    "their jobs continuously as `wanspec serve` does (the oldest queued job, then each later one "
    "while rows × longest row ≤ max_batch_tokens; each pass priced T(tokens, sessions) by the "
    "cloud profile). Per-edge tokens/s (mean of each edge's rate), against the same requests "
    "alone (*vs alone*) and against 1 edge; total tokens/s = every token over first start to "
    "last finish; *cloud busy* = share of that span in passes. {tokens}; the profiles price "
    "the compute."
)


def _experiment(
    name: str, setups: dict[str, CapacitySetup], tokens: str, *, real_models: bool = False
) -> Experiment:
    """The capacity sweep under `setups`; `tokens` says what decides the tokens."""
    title = "Edges per cloud accelerator: batched verification on the simulator"
    return Experiment(
        name,
        title + (" (real models)" if real_models else ""),
        ABOUT.format(tokens=tokens),
        _cells_of(name, setups),
        _run_cell,
        _table,
        _plot,
        _summary,
    )


CAPACITY_EXPERIMENTS = [
    _experiment(
        "capacity", SETUPS, "The synthetic pair (i.i.d. acceptance α = 0.8) decides the tokens"
    ),
    _experiment(
        "capacity-real",
        REAL_SETUPS,
        "Real models decide the tokens (tiny: the tiny shared pair; "
        "quick, full: Qwen2.5-Coder 0.5B → 1.5B on GSM8K prompts)",
        real_models=True,
    ),
]
