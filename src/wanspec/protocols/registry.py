"""Every method by name: what it is, whether it is lossless, and how to build its two machines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wanspec.protocols import speculative as spec
from wanspec.protocols.autoregressive import ArCloud, ArEdge
from wanspec.protocols.settings import GenerationSettings
from wanspec.protocols.split import SplitCloud, SplitEdge
from wanspec.protocols.stopping import StopChecker


@dataclass(frozen=True)
class MethodInfo:
    name: str
    lossless: bool
    description: str
    scheme: type[spec.Scheme] | None  # None: not a draft/verify method
    shared_vocab_only: bool = False
    aliases: tuple[str, ...] = ()
    source: str = ""
    family: str = "speculative"  # "speculative", "ar" or "split": which machine pair runs it


METHODS: dict[str, MethodInfo] = {
    m.name: m
    for m in [
        MethodInfo(
            "ar",
            True,
            "cloud-only autoregressive; tokens streamed down",
            None,
            source="baseline",
            family="ar",
        ),
        MethodInfo(
            "split",
            False,
            "split inference at the embedding layer: float16 activations up per token, tokens "
            "down (exact up to float16 activations)",
            None,
            source="AceSpec baseline",
            family="split",
        ),
        MethodInfo(
            "sd",
            True,
            "vanilla stop-and-wait SD; cloud verifies and resamples (asks the "
            "edge for p_j at a rejection)",
            spec.AskForDraftDist,
            True,
            source="baseline",
        ),
        MethodInfo(
            "cosd",
            True,
            "CoSD: edge resamples; full q_j downlink at a rejection",
            spec.ResidualDownlink,
            True,
            ("dssd",),
            "X-CoSD baseline / DSSD",
        ),
        MethodInfo(
            "naive",
            True,
            "TLI drafting + full q_j over V_L downlink; O tokens by id",
            spec.ResidualDownlink,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "ul",
            True,
            "uplink every draft distribution; cloud resamples",
            spec.UplinkDists,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "xcosd",
            True,
            "X-CoSD hybrid resampling (q on C + θ_o; O-sample as a piece)",
            spec.Hybrid,
            source="X-CoSD",
        ),
        MethodInfo(
            "xcosd-e",
            True,
            "X-CoSD-E: SR-DV, K candidates × M rounds, then HR",
            spec.ServerResampleDeviceVerify,
            aliases=("srdv",),
            source="X-CoSD",
        ),
        MethodInfo(
            "gr",
            False,
            "greedy replacement by the cloud's argmax at a rejection",
            spec.GreedyReplacement,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "tr",
            False,
            "top-k truncated q_j downlink, residual over the truncation",
            spec.TruncatedResidual,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "uhlm",
            False,
            "U-HLM: confident draft tokens skip verification (E, η_max, "
            "u_th); uncertain ones upload p",
            spec.UncertaintySkip,
            source="X-CoSD baseline",
        ),
    ]
}

_ALIASES = {alias: m.name for m in METHODS.values() for alias in m.aliases}


def get_method(name: str) -> MethodInfo:
    key = _ALIASES.get(name, name)
    if key not in METHODS:
        known = ", ".join(sorted([*METHODS, *_ALIASES]))
        raise ValueError(f"unknown method {name!r}; known methods: {known}")
    return METHODS[key]


def build_machines(
    method: str,
    *,
    draft_lm: Any,
    target_lm: Any,
    alignment: Any,
    draft_encode: Callable[[str], list[int]],
    target_encode: Callable[[str], list[int]],
    target_decode: Callable[[list[int]], str],
    prompt: str,
    settings: GenerationSettings,
) -> tuple[Any, Any]:
    """The edge and cloud state machines of one request."""
    info = get_method(method)
    if info.shared_vocab_only and not alignment.is_identity:
        raise ValueError(
            f"method {info.name!r} needs a shared vocabulary, but the draft and target tokenizers "
            "differ; use 'naive', 'xcosd' or 'xcosd-e' for a heterogeneous pair"
        )
    eos = () if settings.ignore_eos else tuple(target_lm.eos_token_ids)
    stopper = StopChecker(
        max_new_tokens=settings.max_new_tokens,
        eos_ids=eos,
        stop=settings.stop,
        decode=target_decode,
    )
    if info.family == "ar":
        edge = ArEdge(prompt=prompt, settings=settings, stopper=stopper)
        cloud = ArCloud(
            target_lm=target_lm, alignment=alignment, encode_prompt=target_encode, eos_ids=eos
        )
        return edge, cloud
    if info.family == "split":
        cloud = SplitCloud(target_lm=target_lm, alignment=alignment, eos_ids=eos)
        edge = SplitEdge(
            prompt_ids=target_encode(prompt),
            embed=target_lm.embed,
            settings=settings,
            stopper=stopper,
        )
        return edge, cloud
    scheme = info.scheme()
    edge = spec.SpecEdge(
        scheme=scheme,
        draft_lm=draft_lm,
        alignment=alignment,
        prompt=prompt,
        prompt_draft_ids=draft_encode(prompt),
        settings=settings,
        stopper=stopper,
    )
    cloud = spec.SpecCloud(
        scheme=scheme, target_lm=target_lm, alignment=alignment, encode_prompt=target_encode
    )
    return edge, cloud
