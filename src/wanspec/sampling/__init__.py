"""Floor 0: the sampling math every method uses (pure functions, no I/O)."""

from wanspec.sampling.quant import (
    PROB_SCALE,
    Counts,
    bernoulli,
    quantize,
    sample,
)
from wanspec.sampling.resample import (
    HybridChoice,
    HybridPayload,
    greedy_replacement,
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
from wanspec.sampling.target import target_counts
from wanspec.sampling.verify import accept_token, verify_chain
from wanspec.sampling.warps import SamplingParams, warp_logits, warp_probs

__all__ = [
    "PROB_SCALE",
    "Counts",
    "HybridChoice",
    "HybridPayload",
    "SamplingParams",
    "accept_token",
    "bernoulli",
    "greedy_replacement",
    "hybrid_cloud_payload",
    "hybrid_edge_resolve",
    "hybrid_o_sample",
    "quantize",
    "residual",
    "sample",
    "sample_residual",
    "srdv_cloud_candidates",
    "srdv_edge_verify",
    "target_counts",
    "truncate_top_k",
    "truncated_residual_sample",
    "uhlm_uncertainty",
    "verify_chain",
    "warp_logits",
    "warp_probs",
]
