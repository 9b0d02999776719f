"""Floor 0: the sampling math every method uses (pure functions, no I/O)."""

from wanspec.sampling.draws import bernoulli, pick
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
from wanspec.sampling.target import target_counts, target_probs
from wanspec.sampling.verify import accept_token, verify_chain
from wanspec.sampling.warps import SamplingParams, warp_logits, warp_probs

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
