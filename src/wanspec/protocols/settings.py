"""Per-request generation settings, shared by every method and sent in StartRequest.

Every setting is checked when the settings are built, against the limits of the wire that will
carry the request, so a bad value is one clear error up front and never a numpy or wire error in
the middle of a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from wanspec.protocols.base import shown
from wanspec.protocols.candidates import AUTO_SRDV_K_MAX, AUTO_SRDV_M_MAX
from wanspec.sampling import Q_BITS, SamplingParams
from wanspec.sampling.proposal import MAX_CANDIDATES
from wanspec.wire import DEFAULT_LIMITS, WireError
from wanspec.wire.validate import check_settings

# A round's drafted tokens travel in one id list (plus the bonus in the reply) and, for UL,
# one distribution each in one DraftWithDists.
MAX_GAMMA = min(DEFAULT_LIMITS.max_dists, DEFAULT_LIMITS.max_tokens - 1)
# SR-DV asks for K candidates in one CandidatesRequest / Candidates message.
MAX_SRDV_K = DEFAULT_LIMITS.max_candidates
# Candidate sets per rejection before the exact fallback: each costs the cloud K draws over the
# whole vocabulary, and past a few sets the exact fallback is cheaper anyway.
MAX_SRDV_M = 64
# Tokens travel in rounds, so the wire sets no hard cap on a whole generation; this one only
# catches typos: 2^20 tokens is beyond the context of every supported model.
MAX_NEW_TOKENS = 1 << 20
# AceSpec's tree: branch tips extended together in one pass (the edge's batch limit).
MAX_TREE_TIPS = 1024
# Seeds travel as JSON integers and seed numpy; keep them within an int64 like every counter.
MAX_SEED = (1 << 63) - 1
# γ when none is given, and where `gamma="auto"` starts; the longest chain it may choose.
DEFAULT_GAMMA = 4
AUTO_GAMMA_MAX = 8
# Chains a pipeline may keep in flight: each holds a tree in the edge's cache until its verdict.
MAX_CHAINS_IN_FLIGHT = 8
# B_max when none is given, and where `tree_budget="auto"` starts; the most tips it may choose.
DEFAULT_TREE_BUDGET = 16
AUTO_TREE_BUDGET_MAX = 64
# SR-DV's K and M when none are given, and where `srdv_k="auto"` / `srdv_m="auto"` start.
DEFAULT_SRDV_K = 4
DEFAULT_SRDV_M = 2
# Stop strings a request may carry (an OpenAI request carries at most 4; the edge service's cap).
MAX_STOP_STRINGS = 16


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(low: int, high: int) -> Callable[[object], bool]:
    return lambda v: _is_int(v) and low <= v <= high


def _real_in(low: float, high: float, *, open_low: bool = False) -> Callable[[object], bool]:
    def check(v: object) -> bool:
        if not (_is_int(v) or isinstance(v, float)):
            return False
        try:
            x = float(v)  # type: ignore[arg-type]
        except OverflowError:  # an int beyond every float
            return False
        return math.isfinite(x) and (low < x if open_low else low <= x) and x <= high

    return check


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


# name -> (test, the rule in words). The sampling settings are SamplingParams' rules, checked
# here first so that a bad value is named and shown like any other (SamplingParams checks again).
_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    "temperature": (_real_in(0.0, math.inf), "a finite number >= 0"),
    "top_k": (_int_in(0, MAX_SEED), "an integer in [0, 2^63 - 1] (0 = off)"),
    "top_p": (_real_in(0.0, 1.0, open_low=True), "a number in (0, 1]"),
    "min_p": (_real_in(0.0, 1.0), "a number in [0, 1] (0 = off)"),
    "repetition_penalty": (
        _real_in(0.0, math.inf, open_low=True),
        "a finite number > 0 (1.0 = off)",
    ),
    "max_new_tokens": (_int_in(1, MAX_NEW_TOKENS), f"an integer in [1, {MAX_NEW_TOKENS}]"),
    "seed": (_int_in(0, MAX_SEED), "an integer in [0, 2^63 - 1]"),
    "gamma": (
        _int_in(1, MAX_GAMMA),
        f"an integer in [1, {MAX_GAMMA}] (the wire's draft limit) or 'auto'",
    ),
    "srdv_k": (
        _int_in(1, MAX_SRDV_K),
        f"an integer in [1, {MAX_SRDV_K}] (the wire's candidate limit) or 'auto'",
    ),
    "srdv_m": (_int_in(1, MAX_SRDV_M), f"an integer in [1, {MAX_SRDV_M}] or 'auto'"),
    "adaptive_srdv_k": (_is_bool, "True or False"),
    "adaptive_srdv_m": (_is_bool, "True or False"),
    "tr_k": (_int_in(1, DEFAULT_LIMITS.max_width), "an integer >= 1"),
    "uhlm_samples": (_int_in(1, 1 << 16), "an integer in [1, 65536]"),
    "uhlm_eta_max": (_real_in(0.0, math.inf, open_low=True), "a finite number > 0"),
    "uhlm_threshold": (_real_in(0.0, 1.0), "a number in [0, 1]"),
    "q_bits": (lambda v: _is_int(v) and v in Q_BITS, "16, 24 or 32 (bits per shipped count)"),
    "ignore_eos": (_is_bool, "True or False"),
    "hr_piggyback": (_is_bool, "True or False"),
    "tree_budget": (_int_in(1, MAX_TREE_TIPS), f"an integer in [1, {MAX_TREE_TIPS}] or 'auto'"),
    "tree_allocation": (
        lambda v: v in ("single", "uniform", "geometric"),
        "'single', 'uniform' or 'geometric'",
    ),
    "tree_fixed": (_is_bool, "True or False"),
    "adaptive_gamma": (_is_bool, "True or False"),
    "adaptive_depth": (_is_bool, "True or False"),
    "adaptive_budget": (_is_bool, "True or False"),
    "chains_in_flight": (
        _int_in(1, MAX_CHAINS_IN_FLIGHT),
        f"an integer in [1, {MAX_CHAINS_IN_FLIGHT}]",
    ),
    "forks_per_tree": (_int_in(0, MAX_TREE_TIPS), f"an integer in [0, {MAX_TREE_TIPS}]"),
    "fork_trees": (_int_in(0, MAX_TREE_TIPS), f"an integer in [0, {MAX_TREE_TIPS}]"),
    "chain_dists": (lambda v: v in ("always", "auto"), "'always' or 'auto'"),
    "restart_length": (_int_in(0, MAX_GAMMA), f"an integer in [0, {MAX_GAMMA}] (0 = off)"),
    "draft_reshape": (_real_in(0.0, 1.0, open_low=True), "a number in (0, 1] (1 = off)"),
    "draft_reshape_top": (_int_in(1, MAX_CANDIDATES), f"an integer in [1, {MAX_CANDIDATES}]"),
}


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _auto_help(text: str) -> dict[str, Any]:
    """The help of a setting that also takes 'auto' (its command-line option accepts it)."""
    return {**_help(text), "auto": True}


# a setting given as 'auto' -> (the cap it becomes, the switch that lets the run choose it)
_AUTO: dict[str, tuple[int, str]] = {
    "gamma": (AUTO_GAMMA_MAX, "adaptive_gamma"),
    "chains_in_flight": (MAX_CHAINS_IN_FLIGHT, "adaptive_depth"),
    "tree_budget": (AUTO_TREE_BUDGET_MAX, "adaptive_budget"),
    "srdv_k": (AUTO_SRDV_K_MAX, "adaptive_srdv_k"),
    "srdv_m": (AUTO_SRDV_M_MAX, "adaptive_srdv_m"),
}


@dataclass(frozen=True)
class GenerationSettings:
    """Everything a request needs; validated on construction so bad settings fail early."""

    # Each field's `help` is its command-line option's help text (`wanspec.settings_cli`).
    max_new_tokens: int = field(default=64, metadata=_help("Tokens to generate at most."))
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature; 0 = greedy."))
    top_k: int = field(default=0, metadata=_help("Keep only the k likeliest tokens; 0 = off."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus (top-p) mass; 1.0 = off."))
    seed: int = field(default=0, metadata=_help("Seed of the run's random draws."))
    gamma: int = field(
        default=DEFAULT_GAMMA,
        metadata=_auto_help(
            "Draft length: tokens drafted per round; 'auto' (pipelines): chosen per chain "
            f"from the measured link, up to {AUTO_GAMMA_MAX}."
        ),
    )
    chains_in_flight: int = field(
        default=2,
        metadata=_auto_help(
            "deepspec, deepspec-tree, deepspec-x: chains in flight at once (D), the one "
            "awaiting its verdict included; "
            f"'auto': chosen per chain from the measured link, up to {MAX_CHAINS_IN_FLIGHT}."
        ),
    )
    adaptive_gamma: bool = field(
        default=False,
        metadata=_help("Pipelines: choose γ per chain online, with `gamma` as its upper limit."),
    )
    adaptive_depth: bool = field(
        default=False,
        metadata=_help(
            "deepspec, deepspec-tree, deepspec-x: choose D per chain online, with "
            "`chains_in_flight` as its upper limit."
        ),
    )
    adaptive_budget: bool = field(
        default=False,
        metadata=_help(
            "Pipelines with a tree: choose the tree budget per chain online (a power of two), "
            "with `tree_budget` as its upper limit."
        ),
    )
    stop: tuple[str, ...] = field(default=(), metadata=_help("Stop string (repeatable)."))
    ignore_eos: bool = field(
        default=False, metadata=_help("Keep generating past the end-of-sequence token.")
    )
    srdv_k: int = field(
        default=DEFAULT_SRDV_K,
        metadata=_auto_help(
            "SR-DV (xcosd-e, xcosd-auto, acespec-x, deepspec-x): candidates K per set; "
            f"'auto': chosen per rejection from the measured link, up to {AUTO_SRDV_K_MAX}."
        ),
    )
    srdv_m: int = field(
        default=DEFAULT_SRDV_M,
        metadata=_auto_help(
            "SR-DV: candidate sets M before the fallback on the cloud; 'auto': chosen per "
            f"rejection from the measured link, up to {AUTO_SRDV_M_MAX}."
        ),
    )
    adaptive_srdv_k: bool = field(
        default=False,
        metadata=_help("SR-DV: choose K online, with `srdv_k` as its upper limit."),
    )
    adaptive_srdv_m: bool = field(
        default=False,
        metadata=_help("SR-DV: choose M online, with `srdv_m` as its upper limit."),
    )
    hr_piggyback: bool = field(
        default=True, metadata=_help("X-CoSD: a pre-drawn O-sample rides on the reply.")
    )
    # Precision of a target distribution the cloud must ship (Naive, CoSD, HR, TR, PicoSpec,
    # AceSpec): 16 is the papers' setting; 32 keeps TV(q, q̂) below 1e-5 per token at T = 1
    # on Qwen2.5-Coder-0.5B (docs/EXACTNESS.md). Methods that decide on the cloud ignore it.
    q_bits: int = field(
        default=32,
        metadata=_help(
            "Precision of a q shipped to the edge (16, 24 or 32; 16 = the papers' bits)."
        ),
    )
    tr_k: int = field(default=8, metadata=_help("TR: top-k of q that travels."))
    uhlm_samples: int = field(
        default=20, metadata=_help("U-HLM: temperature-perturbed draft samples per token.")
    )
    uhlm_eta_max: float = field(
        default=2.0, metadata=_help("U-HLM: highest temperature of those samples.")
    )
    uhlm_threshold: float = field(
        default=0.5, metadata=_help("U-HLM: uncertainty above which a draft token is verified.")
    )
    min_p: float = field(
        default=0.0, metadata=_help("Drop tokens below this share of the likeliest; 0 = off.")
    )
    repetition_penalty: float = field(default=1.0, metadata=_help("Repetition penalty; 1.0 = off."))
    tree_budget: int = field(
        default=DEFAULT_TREE_BUDGET,
        metadata=_auto_help(
            "AceSpec: B_max, branch tips per tree pass (the main one included); 'auto' "
            f"(pipelines with a tree): chosen per chain from the measured link, up to "
            f"{AUTO_TREE_BUDGET_MAX}."
        ),
    )
    tree_allocation: str = field(
        default="geometric",
        metadata=_help("AceSpec: how tips spread over depths: single, uniform or geometric."),
    )
    tree_fixed: bool = field(
        default=False,
        metadata=_help("AceSpec: always use the full tree budget, ignoring the network window."),
    )
    forks_per_tree: int = field(
        default=MAX_TREE_TIPS,
        metadata=_help(
            "deepspec-tree: at most this many of a tree's branches go up as forks, the likeliest "
            "first (each carries its p̃: on a slow uplink, fewer); 0 = none."
        ),
    )
    fork_trees: int = field(
        default=3,
        metadata=_help(
            "deepspec-tree: the passes of the next chain's tree also draft the trees of this "
            "many of the likeliest forks, so a fork taken goes on at once; where the edge's "
            "pass cost is known (a latency profile), only as many as keep a pass within 15 % "
            "of its cost without them; 0 = none."
        ),
    )
    chain_dists: str = field(
        default="auto",
        metadata=_help(
            "deepspec-tree: which chains carry their p̃, which lets the cloud resolve a chain's "
            "rejection and go on with a fork: always, or auto (a chain carries it only where "
            "its forks are expected to save more time than the p̃ takes on the uplink; "
            "otherwise q̂ comes down and the edge draws the token, as in deepspec). auto "
            "chooses by the clock, so a seed's tokens may then differ with the link; the law "
            "does not."
        ),
    )
    restart_length: int = field(
        default=2,
        metadata=_help(
            "deepspec, deepspec-tree, deepspec-x: after a miss (nothing of the edge's left with "
            "the cloud) the first chain is at most this long, so it leaves sooner and the next "
            "goes ahead behind it; only while more than one chain may be in flight; 0 = off."
        ),
    )
    # The draft may propose from any law it reports exactly: moving its mass off the tokens a
    # tree caches moves a rejection's residual onto them (more hits, at some acceptance).
    draft_reshape: float = field(
        default=1.0,
        metadata=_help("Factor on the draft's mass of its top tokens (reported exactly); 1 = off."),
    )
    draft_reshape_top: int = field(
        default=4, metadata=_help("How many of the draft's top tokens --draft-reshape scales.")
    )

    def __post_init__(self) -> None:
        if not isinstance(self.stop, list | tuple):
            raise ValueError(f"invalid setting stop={shown(self.stop)}: must be a list of strings")
        object.__setattr__(self, "stop", tuple(self.stop))
        for name, (cap, switch) in _AUTO.items():
            if getattr(self, name) == "auto":  # the controller's upper limit, and its switch
                object.__setattr__(self, name, cap)
                object.__setattr__(self, switch, True)
        for name, (ok, rule) in _RULES.items():
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"invalid setting {name}={shown(value)}: must be {rule}")
        self.sampling  # noqa: B018 - validates temperature / top-k / top-p / min-p / penalty
        self._check_stop()

    def _check_stop(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(
                f"invalid setting stop: {len(self.stop)} strings, at most {MAX_STOP_STRINGS}"
            )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"invalid setting stop: {shown(s)} is not a non-empty string")
            try:
                s.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"invalid setting stop: {shown(s)} is not valid text") from exc
        try:
            check_settings(self.to_dict(), DEFAULT_LIMITS)
        except WireError as exc:
            raise ValueError(f"invalid setting stop: too long for the wire ({exc})") from exc

    @property
    def srdv_start(self) -> tuple[int, int]:
        """SR-DV's (K, M) at the start of a run: the defaults, within the caps, where chosen
        online. Edge and cloud both start from it."""
        k = min(DEFAULT_SRDV_K, self.srdv_k) if self.adaptive_srdv_k else self.srdv_k
        m = min(DEFAULT_SRDV_M, self.srdv_m) if self.adaptive_srdv_m else self.srdv_m
        return k, m

    @property
    def sampling(self) -> SamplingParams:
        try:
            return SamplingParams(
                self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty
            )
        except ValueError as exc:
            raise ValueError(f"invalid setting {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown settings: {shown(sorted(unknown))}")
        return cls(**data)
