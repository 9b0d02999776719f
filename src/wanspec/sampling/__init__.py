"""Floor 0: the sampling math every method uses (pure functions, no I/O).

What the protocol machines use needs nothing but numpy. The warps, which must equal
transformers' processors bit for bit, and the laws computed from logits are torch
(`warps`, `target`, `draft`, `logits`); their names here are imported when first used.
"""

from importlib import import_module
from typing import Any

from wanspec.sampling.draws import bernoulli, pick
from wanspec.sampling.params import SamplingParams
from wanspec.sampling.quant import (
    PROB_SCALE,
    Q_BITS,
    Counts,
    Rounded,
    dequantize,
    quantize,
    round_probs,
    sample,
    scale_of,
)
from wanspec.sampling.resample import (
    HybridChoice,
    HybridPayload,
    greedy_replacement,
    hybrid_bins,
    hybrid_cloud_payload,
    hybrid_edge_resolve,
    hybrid_o_sample,
    residual,
    sample_residual,
    srdv_cloud_candidates,
    srdv_edge_verify,
    truncate_top_k,
    truncated_residual_sample,
    uhlm_uncertainty,
)
from wanspec.sampling.verify import accept_token, verify_chain

__all__ = [
    "PROB_SCALE",
    "Q_BITS",
    "Counts",
    "HybridChoice",
    "HybridPayload",
    "Rounded",
    "SamplingParams",
    "accept_token",
    "bernoulli",
    "dequantize",
    "greedy_replacement",
    "hybrid_bins",
    "hybrid_cloud_payload",
    "hybrid_edge_resolve",
    "hybrid_o_sample",
    "pick",
    "quantize",
    "residual",
    "round_probs",
    "sample",
    "sample_residual",
    "scale_of",
    "srdv_cloud_candidates",
    "srdv_edge_verify",
    "target_counts",
    "target_probs",
    "truncate_top_k",
    "truncated_residual_sample",
    "uhlm_uncertainty",
    "verify_chain",
    "warp_logits",
    "warp_probs",
]

_TORCH = {
    "target_counts": "wanspec.sampling.target",
    "target_probs": "wanspec.sampling.target",
    "warp_logits": "wanspec.sampling.warps",
    "warp_probs": "wanspec.sampling.warps",
}


def __getattr__(name: str) -> Any:
    """The torch-backed functions, loaded on first use (PEP 562)."""
    if name in _TORCH:
        return getattr(import_module(_TORCH[name]), name)
    raise AttributeError(f"module 'wanspec.sampling' has no attribute {name!r}")
