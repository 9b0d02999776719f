"""Every method by name: what it is, whether it is lossless, and how to build its two machines."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from wanspec.protocols.base import Machine
from wanspec.protocols.budget import BranchPlanner
from wanspec.protocols.candidates import CandidatePlanner
from wanspec.protocols.control import ChainController, PassCost
from wanspec.protocols.endpoints import (
    CloudEndpoint,
    EdgeMachine,
    Fingerprints,
    TargetInfo,
    short_fingerprint,
)
from wanspec.protocols.methods import METHODS, MethodInfo, get_method
from wanspec.protocols.pipeline import PipelineEdge
from wanspec.protocols.settings import DEFAULT_GAMMA, DEFAULT_TREE_BUDGET, GenerationSettings
from wanspec.protocols.speculative import SpecCloud, SpecEdge
from wanspec.protocols.stream import ArCloud, ArEdge, SplitCloud, SplitEdge
from wanspec.vocab import VocabAlignment, fingerprint

__all__ = [
    "METHODS",
    "MethodInfo",
    "build_machines",
    "cloud_machine",
    "edge_fingerprints",
    "edge_model_for",
    "get_method",
    "kv_bytes_per_token",
    "make_cloud",
    "make_edge",
    "table_fingerprint",
    "target_info",
]


@functools.lru_cache(maxsize=64)
def table_fingerprint(table: Any) -> str:
    """A tokenizer table's fingerprint, computed once per table (hashing 150k pieces is slow)."""
    return short_fingerprint(fingerprint(table))


def edge_fingerprints(alignment: VocabAlignment, target_model: str = "") -> Fingerprints:
    """What an edge with this alignment expects of the cloud and reports of itself."""
    return Fingerprints(
        short_fingerprint(target_model),
        table_fingerprint(alignment.target),
        table_fingerprint(alignment.draft),
    )


def edge_model_for(method: str, *, draft: Any, target: Any) -> Any:
    """The model an edge's jobs run on: the draft, except for split inference, whose edge runs
    the target's own embedding layer (`target` may be None where the edge has no target)."""
    return target if get_method(method).family == "split" else draft


def make_edge(
    method: str,
    *,
    alignment: VocabAlignment,
    prompt: str,
    settings: GenerationSettings,
    draft_encode: Callable[[str], list[int]],
    target_decode: Callable[[list[int]], str],
    target_encode: Callable[[str], list[int]] | None = None,
    target_model: str = "",
    tree_seconds: Callable[[int], float] | None = None,
    target_tokenizer: Any = None,
) -> EdgeMachine:
    """The edge machine of one request. It needs no model: its jobs run on the driver's
    executor (the draft model; for `split`, the target's embedding layer). `tree_seconds(B)`
    prices one tree pass of B tips on this edge (AceSpec's budget; None: fitted to the passes
    the edge times, `PassCost`).
    `target_tokenizer` (transformers) makes stop strings match as transformers' criteria do,
    special tokens and matches across the prompt/output boundary included."""
    info = get_method(method)
    if settings.adaptive_gamma and info.family != "pipeline":
        raise ValueError(
            f"gamma 'auto' needs a pipeline method ({_names(family='pipeline')}), whose "
            f"tokens do not depend on γ; {info.name!r} would change its tokens with every choice"
        )
    if settings.adaptive_depth and not info.sends_ahead:
        raise ValueError(
            f"chains_in_flight 'auto' needs a method that sends chains ahead "
            f"({_names(sends_ahead=True)}); "
            f"{info.name!r} keeps one chain in flight"
        )
    if settings.adaptive_budget:
        _check_budget_choice(info, settings)
    adaptive_srdv = settings.adaptive_srdv_k or settings.adaptive_srdv_m
    if adaptive_srdv and not (info.scheme is not None and info.scheme.candidate_sets):
        which = "srdv_k" if settings.adaptive_srdv_k else "srdv_m"
        raise ValueError(
            f"{which} 'auto' needs a method that resolves rejections by SR-DV "
            f"({_names_where(lambda m: m.scheme is not None and m.scheme.candidate_sets)}); "
            f"{info.name!r} has no candidate sets"
        )
    if info.shared_vocab_only and not alignment.is_identity:
        raise ValueError(
            f"method {info.name!r} needs a shared vocabulary, but the draft and target tokenizers "
            "differ; use 'naive', 'xcosd', 'xcosd-e' or 'xcosd-auto' for a heterogeneous pair "
            "(or the pipelines 'acespec-x', 'deepspec-x' and 'deepspec-tree')"
        )
    common = dict(
        method=info.name,
        prompt=prompt,
        settings=settings,
        fingerprints=edge_fingerprints(alignment, target_model),
        decode=target_decode,
        target_tokenizer=target_tokenizer,
        stop_context=target_encode(prompt) if (settings.stop and target_encode) else (),
    )
    if info.family == "ar":
        return ArEdge(**common)
    if info.family == "split":
        if target_encode is None:
            raise ValueError("split inference needs the target tokenizer on the edge")
        if settings.sampling.needs_context:
            raise ValueError("split inference cannot apply a repetition penalty (see stream.py)")
        return SplitEdge(prompt_ids=target_encode(prompt), **common)
    assert info.scheme is not None
    drafting = dict(
        scheme=info.scheme(),
        alignment=alignment,
        prompt_draft_ids=draft_encode(prompt),
        candidates=_candidate_planner(settings) if adaptive_srdv else None,
        **common,
    )
    if info.family == "pipeline":
        # without a latency profile the edge prices its tree passes by those it times
        measured = PassCost() if tree_seconds is None and info.drafts_tree else None
        tree_seconds = tree_seconds or measured
        planner = _planner(info, settings, tree_seconds)
        depth = settings.chains_in_flight if info.sends_ahead else 1
        start = min(DEFAULT_GAMMA, settings.gamma) if settings.adaptive_gamma else settings.gamma
        budgets = _budgets(settings)  # () unless chosen
        controller = (
            ChainController(
                start=start,
                gamma_max=settings.gamma,
                chains_in_flight=depth,
                sends_forks=info.sends_forks,
                adapt_gamma=settings.adaptive_gamma,
                adapt_depth=settings.adaptive_depth,
                restart=settings.restart_length,
                hit_model=None if planner is None else planner.expected_hit,
                budgets=budgets,
                tree_seconds=tree_seconds,
                start_budget=min([DEFAULT_TREE_BUDGET, *budgets[-1:]]),
            )
            if settings.adaptive_gamma or settings.adaptive_depth or settings.adaptive_budget
            else None
        )
        return PipelineEdge(
            planner=planner,
            send_ahead=info.sends_ahead,
            send_forks=info.sends_forks,
            controller=controller,
            pass_cost=measured,
            **drafting,
        )
    return SpecEdge(**drafting)


def _names(**fields: Any) -> str:
    """The methods whose `MethodInfo` has these field values, by name, in the table's order."""
    return _names_where(lambda m: all(getattr(m, k) == v for k, v in fields.items()))


def _names_where(test: Callable[[MethodInfo], bool]) -> str:
    """The methods that pass `test`, by name, in the table's order."""
    return ", ".join(m.name for m in METHODS.values() if test(m))


def _candidate_planner(settings: GenerationSettings) -> CandidatePlanner:
    """SR-DV's K and M chosen online, from the defaults, within the request's caps."""
    k, m = settings.srdv_start
    return CandidatePlanner(
        k,
        m,
        k_max=settings.srdv_k,
        m_max=settings.srdv_m,
        adapt_k=settings.adaptive_srdv_k,
        adapt_m=settings.adaptive_srdv_m,
    )


def _check_budget_choice(info: MethodInfo, settings: GenerationSettings) -> None:
    """`tree_budget="auto"` prices each budget at its pass time: it needs a tree and a budget
    the planner does not fix."""
    if info.family != "pipeline" or not info.drafts_tree:
        raise ValueError(
            f"tree_budget 'auto' needs a pipeline with a tree; {info.name!r} drafts none"
        )
    if settings.tree_fixed:
        raise ValueError("tree_budget 'auto' chooses the budget; tree_fixed would hold it")


def _budgets(settings: GenerationSettings) -> tuple[int, ...]:
    """The budgets `tree_budget="auto"` chooses among: powers of two up to the cap, and the cap.
    Where the passes also draft forks' trees (`deepspec-tree`), those are drafted at the chosen
    budget too, and the controller prices a pass at the trees it measured per pass."""
    if not settings.adaptive_budget:
        return ()
    cap = settings.tree_budget
    return tuple(sorted({*(1 << k for k in range(cap.bit_length())), cap}))


def _planner(
    info: MethodInfo, settings: GenerationSettings, tree_seconds: Callable[[int], float] | None
) -> BranchPlanner | None:
    """AceSpec's budget and shape policy (None for a pipeline with no branches: PicoSpec)."""
    if not info.drafts_tree:
        return None
    return BranchPlanner(
        b_max=settings.tree_budget,
        mode=settings.tree_allocation,
        tree_seconds=None if settings.tree_fixed else tree_seconds,
        fixed_budget=settings.tree_budget if settings.tree_fixed else None,
    )


def cloud_machine(
    method: str,
    target: TargetInfo,
    alignment: VocabAlignment,
    settings: GenerationSettings,
    prompt: str,
) -> Machine:
    """The method's cloud machine, built once the handshake named the method and settings."""
    info = get_method(method)
    if info.family == "ar":
        return ArCloud(target, settings, prompt)
    if info.family == "split":
        return SplitCloud(target, settings)
    assert info.scheme is not None
    return SpecCloud(
        scheme=info.scheme(),
        target=target,
        alignment=alignment,
        settings=settings,
        prompt=prompt,
        bonus=info.family != "pipeline",
    )


def make_cloud(target: TargetInfo) -> CloudEndpoint:
    """The cloud machine of one session: it learns everything else from the handshake."""
    return CloudEndpoint(target, cloud_machine)


@functools.lru_cache(maxsize=16)
def _identity(table: Any, width: int) -> VocabAlignment:
    return VocabAlignment.identity(table, width)


def target_info(
    target_lm: Any,
    encode: Callable[[str], list[int]],
    alignments: tuple[VocabAlignment, ...] = (),
) -> TargetInfo:
    """What a cloud serving `target_lm` knows, able to verify drafts of the given alignments.
    The context length, hidden size and KV-cache bytes per token come from the model's config
    when it has one."""
    if alignments:
        table = alignments[0].target
    else:
        from wanspec.vocab import TokenTable

        table = TokenTable(target_lm.tokenizer)
    config = getattr(target_lm, "config", None)
    accepts_activations = hasattr(target_lm, "extend_embeddings")
    return TargetInfo(
        name=getattr(target_lm, "name", "target"),
        model_fingerprint=short_fingerprint(target_lm.fingerprint),
        tokenizer_fingerprint=table_fingerprint(table),
        vocab=_identity(table, target_lm.vocab_size),
        eos_token_ids=tuple(target_lm.eos_token_ids),
        encode=encode,
        alignments={table_fingerprint(a.draft): a for a in alignments},
        accepts_activations=accepts_activations,
        context_length=_config_size(config, "max_position_embeddings"),
        hidden_size=_config_size(config, "hidden_size") if accepts_activations else None,
        kv_bytes_per_token=kv_bytes_per_token(config, getattr(target_lm, "dtype", None)),
    )


def kv_bytes_per_token(config: Any, dtype: Any) -> int | None:
    """The KV cache's bytes per cached token of a model with this config loaded in `dtype`
    (a torch dtype): 2 (keys and values) × layers × KV heads × head size × bytes per element.
    Every layer keeps every key here (`HFLanguageModel` evicts no sliding window), so a session
    of n tokens holds n times this. None when the config does not say (a synthetic model)."""
    element = getattr(dtype, "itemsize", None)
    if config is None or not isinstance(element, int):
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = _config_size(text, "num_hidden_layers")
    heads = _config_size(text, "num_attention_heads")
    kv_heads = _config_size(text, "num_key_value_heads") or heads
    hidden = _config_size(text, "hidden_size")
    head_dim = _config_size(text, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_dim):
        return None
    return 2 * layers * kv_heads * head_dim * element


def _config_size(config: Any, name: str) -> int | None:
    """A positive size from a model config (None when it has none)."""
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def build_machines(
    method: str,
    *,
    draft_lm: Any,
    target_lm: Any,
    alignment: VocabAlignment,
    draft_encode: Callable[[str], list[int]],
    target_encode: Callable[[str], list[int]],
    target_decode: Callable[[list[int]], str],
    prompt: str,
    settings: GenerationSettings,
    tree_seconds: Callable[[int], float] | None = None,
) -> tuple[EdgeMachine, CloudEndpoint]:
    """Both machines of one request, for models loaded in this process (`wanspec.generate`,
    benchmarks, tests).

    The machines hold no model: run them with `session_executor` of `edge_model_for(method, …)`
    on the edge and of `target_lm` on the cloud."""
    edge = make_edge(
        method,
        alignment=alignment,
        prompt=prompt,
        settings=settings,
        draft_encode=draft_encode,
        target_decode=target_decode,
        target_encode=target_encode,
        target_model=target_lm.fingerprint,
        tree_seconds=tree_seconds,
        target_tokenizer=getattr(target_lm, "tokenizer", None),
    )
    return edge, make_cloud(target_info(target_lm, target_encode, (alignment,)))
