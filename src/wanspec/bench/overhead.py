"""`wanspec bench overhead`: the protocol's own CPU per round, per side and per phase.

A speculative method pays, every round, for more than its forward passes: warps, vocabulary
projection, rounding, draws, the codec, tree ranking and bookkeeping. When that is large beside
one target decode step, the method loses to the target alone on a real machine whatever its
acceptance. This benchmark runs `wanspec.generate` (the simulator, real models in this process)
and times, on the wall clock:

- each side's `handle()` (the machines' own CPU: the simulator runs every forward pass apart,
  on the side's executor), split into the phases of `PHASES` by wrapping the named functions for
  the duration of the run; a phase's time is EXCLUSIVE (time in nested phases is subtracted),
  and what is left of `handle()` is `other`;
- the driver: simulate's wall time less both sides' `handle()` and the executors; the messages'
  encode and decode there show as its `codec`, the rest (event queue, link model) as `driver`;
- the reference: one target decode step (and one draft step) on the same model objects, through
  the executor API the simulator uses, with the prompt in the KV cache.
"""

from __future__ import annotations

import functools
import importlib
import json
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanspec.bench.config import REAL_HETERO, REAL_SHARED, TINY_PAIR, TINY_SHARED_PAIR

# Phase → the functions whose time is that phase's, as "module:qualname". A method is named by
# the class that defines it. Every name must resolve (the benchmark refuses to run otherwise, so
# the table follows the code); to time a new helper, add its name to the phase it belongs to.
PHASES: dict[str, list[str]] = {
    "warp": [
        "wanspec.sampling.warps:warp_logits",
        "wanspec.sampling.warps:warp_probs",
        "wanspec.sampling.target:target_probs",
        "wanspec.sampling.target:target_counts",
        "wanspec.sampling.draft:draft_row",
        "wanspec.sampling.draft:draft_rows",
    ],
    "projection": [
        "wanspec.vocab.alignment:VocabAlignment.project_draft_logits",
        "wanspec.vocab.alignment:VocabAlignment.project_draft",
        "wanspec.sampling.draft:_candidates",  # the draft's candidates, restricted to C
        "wanspec.protocols.schemes:Hybrid.spread",
    ],
    "rounding": [
        "wanspec.sampling.quant:quantize",
        "wanspec.sampling.quant:quantize_rows",
        "wanspec.sampling.quant:round_probs",
        "wanspec.sampling.quant:dequantize",
        "wanspec.sampling.resample:hybrid_bins",
        "wanspec.sampling.proposal:DraftRow.dense",
    ],
    "sampling": [
        "wanspec.sampling.draws:bernoulli",
        "wanspec.sampling.draws:pick",
        "wanspec.sampling.quant:sample",
        "wanspec.sampling.resample:sample_residual",
        "wanspec.sampling.resample:hybrid_o_sample",
        "wanspec.sampling.resample:hybrid_edge_resolve",
        "wanspec.sampling.resample:srdv_cloud_candidates",
        "wanspec.sampling.resample:srdv_edge_verify",
        "wanspec.sampling.resample:greedy_replacement",
        "wanspec.sampling.resample:truncate_top_k",
        "wanspec.sampling.resample:truncated_residual_sample",
        "wanspec.sampling.resample:uhlm_uncertainty",
        "wanspec.sampling.verify:verify_chain",
        "wanspec.protocols.base:position_rng",
        "wanspec.sampling.proposal:DraftRow.draw",
    ],
    "codec": [
        "wanspec.wire.codec:encode",
        "wanspec.wire.codec:decode",
        "wanspec.wire.messages:Dist.from_dense",
        "wanspec.wire.messages:Dist.to_dense",
        "wanspec.wire.messages:Dist.__post_init__",
    ],
    "tree ranking": [
        "wanspec.sampling.proposal:DraftRow.ranked",
        "wanspec.protocols.budget:ranked_capture",
    ],
}
OTHER = "other"  # the rest of a side's handle()
DRIVER = "driver"  # the simulator's own time outside handle() and the executors, less its codec
EXECUTOR = "executor"  # the forward passes: measured to be left out, never reported as protocol
COLUMNS: tuple[str, ...] = (*PHASES, OTHER, DRIVER)
SIDES = ("edge", "cloud", "driver")
SIMULATE = "wanspec.sim.driver:simulate"

PAIRS: dict[str, tuple[str, str]] = {  # name → (target, draft), as the experiments name them
    "hetero": REAL_HETERO,
    "shared": REAL_SHARED,
    "tiny-hetero": TINY_PAIR,
    "tiny-shared": TINY_SHARED_PAIR,
}
PROMPTS = (
    "def fibonacci(n):",
    "Write a short story about a robot who learns to paint.",
    "import numpy as np\n\ndef moving_average(x, k):",
    "Q: A farmer has 17 sheep and buys 5 more. How many sheep does he have?\nA:",
    "class Stack:\n    def __init__(self):",
    "Translate to German: The weather is nice today.",
    "The three laws of thermodynamics are",
    "Summarize: the meeting covered the budget, hiring and next year's roadmap.",
)


class PhaseTableError(LookupError):
    """A name in the phase table does not resolve to a function: the table must follow the code."""


# ============================================================================ the phase table


@dataclass(frozen=True)
class PhaseTarget:
    """One resolved name of the table: where it is defined and what is bound there."""

    phase: str
    name: str
    owner: Any  # the module or class that defines it
    attr: str
    raw: Any  # owner.__dict__[attr]: a function, staticmethod or classmethod

    @property
    def function(self) -> Callable[..., Any]:
        return self.raw.__func__ if isinstance(self.raw, staticmethod | classmethod) else self.raw


def resolve(table: dict[str, list[str]] | None = None) -> list[PhaseTarget]:
    """Every name of `table` (default `PHASES`) resolved; PhaseTableError names the first that
    does not, or one listed twice."""
    table = PHASES if table is None else table
    found: list[PhaseTarget] = []
    seen: dict[int, str] = {}
    for phase, names in table.items():
        if phase in (OTHER, DRIVER, EXECUTOR):
            raise PhaseTableError(f"phase {phase!r} is computed, not listed")
        for name in names:
            target = _resolve_one(phase, name)
            if id(target.raw) in seen:
                raise PhaseTableError(f"{name!r} is listed twice ({seen[id(target.raw)]}, {phase})")
            seen[id(target.raw)] = phase
            found.append(target)
    return found


def _resolve_one(phase: str, name: str) -> PhaseTarget:
    where = f"phase {phase!r}: {name!r}"
    fix = f"update PHASES in {__name__}"
    module_name, colon, qualname = name.partition(":")
    if not colon or not module_name or not qualname:
        raise PhaseTableError(f"{where}: expected 'package.module:function' or ':Class.method'")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise PhaseTableError(
            f"{where}: module {module_name} does not import ({err}); {fix}"
        ) from err
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if not isinstance(owner, type):
            raise PhaseTableError(f"{where}: {module_name} has no class {part!r}; {fix}")
    raw = vars(owner).get(attr)
    if raw is None:
        inherited = " (inherited: name the class that defines it)" if hasattr(owner, attr) else ""
        raise PhaseTableError(f"{where}: no longer exists{inherited}; {fix}")
    plain = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
    if not isinstance(plain, types.FunctionType):
        raise PhaseTableError(f"{where}: is a {type(raw).__name__}, not a function; {fix}")
    return PhaseTarget(phase, name, owner, attr, raw)


# ============================================================================ exclusive timers


class PhaseClock:
    """Exclusive wall time per (side, phase) from a stack of open frames: a frame's time less its
    nested frames' goes to its own phase, so the phases of a side add up to its handle() time.
    Only the thread that made the clock records, and only while a run is being timed."""

    def __init__(self, columns: Sequence[str] = COLUMNS) -> None:
        self.columns = tuple(columns)
        self._thread = threading.get_ident()
        self._stack: list[list[Any]] = []  # [side, phase, start, time in nested frames]
        self.recording = False
        self.reset()

    def reset(self) -> None:
        self.exclusive_s: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self.handle_s: dict[str, float] = {"edge": 0.0, "cloud": 0.0}
        self.executor_s: dict[str, float] = {"edge": 0.0, "cloud": 0.0}
        self.simulate_s = 0.0

    @property
    def active(self) -> bool:
        return self.recording and threading.get_ident() == self._thread

    def enter(self, phase: str, side: str | None = None) -> None:
        """Open a frame; `side` None: the enclosing frame's side (the driver's at the top)."""
        if side is None:
            side = self._stack[-1][0] if self._stack else DRIVER
        self._stack.append([side, phase, time.perf_counter(), 0.0])

    def leave(self) -> float:
        """Close the innermost frame and return its inclusive seconds."""
        now = time.perf_counter()
        side, phase, start, nested = self._stack.pop()
        elapsed = now - start
        key = (side, phase)
        self.exclusive_s[key] = self.exclusive_s.get(key, 0.0) + (elapsed - nested)
        self.calls[key] = self.calls.get(key, 0) + 1
        if self._stack:
            self._stack[-1][3] += elapsed
        return elapsed

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, its calls timed as `phase` while the clock records."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return fn(*args, **kwargs)
            self.enter(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        wrapper.__wanspec_phase__ = phase  # type: ignore[attr-defined]
        return wrapper

    def side_phases(self, side: str) -> dict[str, float]:
        """Exclusive seconds per column of one side (`driver`: its own remainder included)."""
        out = {column: 0.0 for column in self.columns}
        for (s, phase), seconds in self.exclusive_s.items():
            if s == side and phase != EXECUTOR:
                out[phase] = out.get(phase, 0.0) + seconds
        if side == DRIVER:
            out[DRIVER] = self.driver_s - sum(s for c, s in out.items() if c != DRIVER)
        return out

    @property
    def driver_s(self) -> float:
        """Simulate's wall time less both sides' handle() and their executors."""
        return self.simulate_s - sum(self.handle_s.values()) - sum(self.executor_s.values())


class _TimedMachine:
    """A machine as the simulator sees it, its handle() timed as its side's `other`."""

    def __init__(self, machine: Any, side: str, clock: PhaseClock) -> None:
        self._machine, self._side, self._clock = machine, side, clock

    def handle(self, event: Any) -> Any:
        clock = self._clock
        if not clock.active:
            return self._machine.handle(event)
        clock.enter(OTHER, self._side)
        try:
            return self._machine.handle(event)
        finally:
            clock.handle_s[self._side] += clock.leave()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._machine, name)


def _timed_executor(executor: Callable[[Any], Any], side: str, clock: PhaseClock) -> Any:
    def run(job: Any) -> Any:
        if not clock.active:
            return executor(job)
        clock.enter(EXECUTOR, side)
        try:
            return executor(job)
        finally:
            clock.executor_s[side] += clock.leave()

    return run


def _timed_simulate(simulate: Callable[..., Any], clock: PhaseClock) -> Callable[..., Any]:
    @functools.wraps(simulate)
    def wrapper(edge: Any, cloud: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.recording or threading.get_ident() != clock._thread:
            return simulate(edge, cloud, *args, **kwargs)  # nested or foreign: not ours to time
        for side in ("edge", "cloud"):
            executor = kwargs.get(f"{side}_executor")
            if executor is not None:
                kwargs[f"{side}_executor"] = _timed_executor(executor, side, clock)
        edge, cloud = _TimedMachine(edge, "edge", clock), _TimedMachine(cloud, "cloud", clock)
        clock.recording = True
        began = time.perf_counter()
        try:
            return simulate(edge, cloud, *args, **kwargs)
        finally:
            clock.simulate_s += time.perf_counter() - began
            clock.recording = False

    wrapper.__wanspec_phase__ = DRIVER  # type: ignore[attr-defined]
    return wrapper


# ============================================================================ patching


def _bindings(objects: dict[int, Any]) -> list[tuple[Any, str, Any]]:
    """Every (module, name, value) of a loaded module whose value is one of `objects` (by id):
    `from x import f` binds f in the importing module too, and each binding must be patched."""
    found = []
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        namespace = module.__dict__
        for name, value in list(namespace.items()):
            if id(value) in objects and value is objects[id(value)]:
                found.append((module, name, value))
    return found


def _replacement(target: PhaseTarget, clock: PhaseClock) -> Any:
    wrapped = clock.timed(target.phase, target.function)
    if isinstance(target.raw, staticmethod):
        return staticmethod(wrapped)
    if isinstance(target.raw, classmethod):
        return classmethod(wrapped)
    return wrapped


@contextmanager
def instrument(table: dict[str, list[str]] | None = None) -> Iterator[PhaseClock]:
    """Wrap every function of `table` (default `PHASES`) wherever it is bound, and the
    simulator's `simulate`, for the duration of the block; yields the clock they record on.
    Everything is put back on the way out, whatever happens inside."""
    table = PHASES if table is None else table
    targets = resolve(table)
    simulate = _resolve_one(DRIVER, SIMULATE)
    clock = PhaseClock((*table, OTHER, DRIVER))
    importlib.import_module("wanspec.api")  # every module that binds a timed name is loaded
    replacements: dict[int, tuple[Any, Any]] = {
        id(t.raw): (t.raw, _replacement(t, clock)) for t in targets
    }
    replacements[id(simulate.raw)] = (simulate.raw, _timed_simulate(simulate.raw, clock))
    sites = [(t.owner, t.attr, t.raw) for t in [*targets, simulate]]
    sites += _bindings({key: raw for key, (raw, _) in replacements.items()})
    undo: list[tuple[Any, str, Any]] = []
    done: set[tuple[int, str]] = set()
    try:
        for owner, attr, raw in sites:
            if (id(owner), attr) in done:
                continue
            done.add((id(owner), attr))
            undo.append((owner, attr, raw))
            setattr(owner, attr, replacements[id(raw)][1])
        yield clock
    finally:
        clock.recording = False
        for owner, attr, raw in reversed(undo):
            setattr(owner, attr, raw)


# ============================================================================ the benchmark


@dataclass
class MethodOverhead:
    """One method's timed runs: seconds per side and column, over all its prompts."""

    method: str
    rounds: int
    tokens: int
    prompts: int
    phases_s: dict[str, dict[str, float]]  # side → column → exclusive seconds
    handle_s: dict[str, float]
    executor_s: dict[str, float]
    simulate_s: float
    calls: dict[str, dict[str, int]] = field(default_factory=dict)  # side → phase → calls

    def side_s(self, side: str) -> float:
        """A side's protocol seconds: its handle(), or for the driver its own time."""
        return sum(self.phases_s[side].values())

    @property
    def both_sides_s(self) -> float:
        """What the two peers would spend: both handle()s plus encoding and decoding the
        messages between them (the simulator's own bookkeeping left out)."""
        codec = self.phases_s[DRIVER].get("codec", 0.0)
        return self.handle_s["edge"] + self.handle_s["cloud"] + codec


@dataclass
class OverheadReport:
    draft: str
    target: str
    settings: dict[str, Any]
    target_decode_ms: float
    draft_step_ms: float
    decodes: int
    methods: list[MethodOverhead]
    skipped: dict[str, str]
    table: dict[str, list[str]] = field(default_factory=lambda: PHASES)

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.table, OTHER, DRIVER)

    def to_json(self) -> dict[str, Any]:
        """The numbers the table shows, and the seconds they come from."""
        out: dict[str, Any] = {
            "pair": {"draft": self.draft, "target": self.target},
            "settings": self.settings,
            "reference": {
                "target_decode_ms": self.target_decode_ms,
                "draft_step_ms": self.draft_step_ms,
                "decodes": self.decodes,
            },
            "phase_table": self.table,
            "columns": list(self.columns),
            "methods": {},
            "skipped": self.skipped,
        }
        for m in self.methods:
            rounds = max(m.rounds, 1)
            sides = {}
            for side in SIDES:
                ms = 1e3 * m.side_s(side) / rounds
                sides[side] = {
                    "total_s": m.side_s(side),
                    "ms_per_round": ms,
                    "x_target_decode": ms / self.target_decode_ms,
                    "phases_ms_per_round": {
                        c: 1e3 * s / rounds for c, s in m.phases_s[side].items()
                    },
                    "calls": m.calls.get(side, {}),
                }
            both_ms = 1e3 * m.both_sides_s / rounds
            out["methods"][m.method] = {
                "rounds": m.rounds,
                "tokens": m.tokens,
                "prompts": m.prompts,
                "sides": sides,
                "both_sides_ms_per_round": both_ms,
                "both_sides_x_target_decode": both_ms / self.target_decode_ms,
                "handle_s": m.handle_s,
                "executor_s": m.executor_s,
                "simulate_s": m.simulate_s,
            }
        return out


def one_token_ms(model: Any, ids: Sequence[int], decodes: int = 10) -> float:
    """Median wall ms of one one-token decode after `ids` are cached, on a fresh session of
    `model` through the executor API the simulator uses (two untimed decodes first)."""
    from wanspec.jobs import Forward
    from wanspec.models.jobs import session_executor

    run = session_executor(model)
    run(Forward(0, tuple(ids), 1))
    step = Forward(len(ids), (int(ids[-1]),), 1)  # keep the prompt, feed one token
    times = []
    for _ in range(decodes + 2):
        began = time.perf_counter()
        run(step)
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times[2:])


def default_methods() -> tuple[str, ...]:
    """Every lossless method (`wanspec methods`)."""
    from wanspec.protocols.registry import METHODS

    return tuple(m.name for m in METHODS.values() if m.lossless)


def _rounds(stats: dict[str, Any], family: str) -> int:
    """Verdicts the edge committed; for a method that streams tokens, one per token."""
    return int(stats["rounds"]) if family not in ("ar", "split") else int(stats["new_tokens"])


def measure(
    pair: Any,
    methods: Sequence[str] | None = None,
    *,
    prompts: int = 4,
    tokens: int = 64,
    gamma: int = 4,
    temperature: float = 1.0,
    tree_budget: int | None = None,
    seed: int = 0,
    decodes: int = 10,
    warmup: bool = True,
    table: dict[str, list[str]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> OverheadReport:
    """Time each method's protocol CPU on `pair` (a loaded `wanspec.Pair`) over the first
    `prompts` built-in prompts, `tokens` new tokens each. A method that needs one tokenizer on
    both sides is skipped on a heterogeneous pair (named in `skipped`)."""
    import wanspec
    from wanspec.protocols.registry import get_method

    resolve(table)  # before any model work: a stale table fails at once
    names = [get_method(m).name for m in (methods or default_methods())]
    skipped = {
        m: "needs one tokenizer on both sides"
        for m in names
        if get_method(m).shared_vocab_only and not pair.shared_vocab
    }
    runnable = [m for m in names if m not in skipped]
    chosen = [PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    settings: dict[str, Any] = {
        "max_new_tokens": tokens,
        "temperature": temperature,
        "top_k": 0,
        "top_p": 1.0,
        "gamma": gamma,
    }
    if tree_budget is not None:
        settings["tree_budget"] = tree_budget
    say = progress or (lambda _: None)
    target_ms = one_token_ms(pair.target, pair.target_encode(chosen[0]), decodes)
    draft_ms = one_token_ms(pair.draft, pair.draft_encode(chosen[0]), decodes)
    results = []
    with instrument(table) as clock:
        for method in runnable:
            family = get_method(method).family
            if warmup:  # first passes allocate, caches fill: not the protocol's steady cost
                wanspec.generate(
                    pair, chosen[0], method, **{**settings, "max_new_tokens": min(tokens, 4)}
                )
            clock.reset()
            rounds = new_tokens = 0
            for i, prompt in enumerate(chosen):
                res = wanspec.generate(pair, prompt, method, seed=seed + i, **settings)
                rounds += _rounds(res.stats, family)
                new_tokens += res.stats["new_tokens"]
            results.append(
                MethodOverhead(
                    method,
                    rounds,
                    new_tokens,
                    len(chosen),
                    {side: clock.side_phases(side) for side in SIDES},
                    dict(clock.handle_s),
                    dict(clock.executor_s),
                    clock.simulate_s,
                    {
                        side: {p: n for (s, p), n in clock.calls.items() if s == side}
                        for side in SIDES
                    },
                )
            )
            say(f"  {method}: {new_tokens} tokens, {rounds} rounds")
    shown = {**settings, "prompts": prompts, "seed": seed}
    return OverheadReport(
        pair.draft_name,
        pair.target_name,
        shown,
        target_ms,
        draft_ms,
        decodes,
        results,
        skipped,
        PHASES if table is None else table,
    )


# ============================================================================ output


def table_lines(report: OverheadReport) -> list[str]:
    """The report as plain aligned text: one row per method and side, ms per round."""
    s = report.settings
    lines = [
        f"pair: {report.draft} → {report.target}; {s['prompts']} prompts × {s['max_new_tokens']} "
        f"tokens, T={s['temperature']:g}, γ={s['gamma']}"
        + (f", tree budget {s['tree_budget']}" if "tree_budget" in s else ""),
        f"target decode (1 token, prompt cached): {report.target_decode_ms:.2f} ms; "
        f"draft step: {report.draft_step_ms:.2f} ms (medians of {report.decodes})",
        "ms per round, phases exclusive; ×decode = ms per round / target decode",
        "",
    ]
    columns = report.columns
    header = ["method", "side", "rounds", "ms/round", "×decode", *columns, "both ×decode"]
    rows = [header]
    for m in report.methods:
        rounds = max(m.rounds, 1)
        for side in SIDES:
            ms = 1e3 * m.side_s(side) / rounds
            phases = m.phases_s[side]
            cells = [_ms(1e3 * phases[c] / rounds) if _applies(side, c) else "-" for c in columns]
            both = 1e3 * m.both_sides_s / rounds / report.target_decode_ms
            rows.append(
                [
                    m.method if side == "edge" else "",
                    side,
                    str(m.rounds) if side == "edge" else "",
                    _ms(ms),
                    f"{ms / report.target_decode_ms:.2f}",
                    *cells,
                    f"{both:.2f}" if side == "edge" else "",
                ]
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    lines.append("")
    lines.append(
        "both ×decode: edge + cloud handle() + the driver's codec (each message's encode and "
        "decode), per round, over one target decode"
    )
    lines += [f"skipped {m}: {why}" for m, why in report.skipped.items()]
    return lines


def _applies(side: str, column: str) -> bool:
    """The driver has no handle(): no `other`; a machine has no driver time."""
    return (column != DRIVER) if side != DRIVER else (column != OTHER)


def _ms(value: float) -> str:
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def load(pair: str, draft: str | None, target: str | None) -> Any:
    """The named pair (`PAIRS`), either model replaced by a name or folder."""
    from wanspec.bench.context import Context

    if pair not in PAIRS:
        raise ValueError(f"unknown pair {pair!r}; known: {', '.join(PAIRS)}")
    default_target, default_draft = PAIRS[pair]
    return Context().pair(target or default_target, draft or default_draft)


def run(
    *,
    pair: str = "hetero",
    draft: str | None = None,
    target: str | None = None,
    methods: Sequence[str] | None = None,
    json_path: Path | None = None,
    echo: Callable[[str], None] = print,
    **options: Any,
) -> OverheadReport:
    """`wanspec bench overhead`: load, measure, print the table, write the JSON."""
    resolve()  # a stale phase table fails before minutes of model loading
    loaded = load(pair, draft, target)
    echo(f"measuring {', '.join(methods) if methods else 'every lossless method'}…")
    report = measure(loaded, methods, progress=echo, **options)
    for line in table_lines(report):
        echo(line)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
        echo(f"wrote {json_path}")
    return report


__all__ = [
    "COLUMNS",
    "PAIRS",
    "PHASES",
    "MethodOverhead",
    "OverheadReport",
    "PhaseClock",
    "PhaseTableError",
    "instrument",
    "measure",
    "one_token_ms",
    "resolve",
    "run",
    "table_lines",
]
