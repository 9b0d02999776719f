"""Pass-shape (batch) invariance: a position's logits do not depend on how many rows the pass has.

A transformer is row-wise except for its reductions: the matrix multiplies of the linear layers
and of attention, whose CPU kernels (MKL) pick a different blocking, and so a different summation
order, for each number of rows. One token decoded alone, the same token inside a γ+1-row
verification and inside a tree pass therefore get logits that differ in the last bits, and in
bf16 that flips greedy choices. This module removes the dependence:

- every linear layer multiplies fixed chunks of `ROW_CHUNK` rows (the last one zero-padded): each
  row always meets the same kernel with the same shape, whichever pass it is in;
- attention runs per chunk of `QUERY_CHUNK` queries against fixed blocks of `KEY_BLOCK` keys: the
  row maximum is exact in any order, each block's exp-weighted values and normaliser come from
  one fixed-shape matrix multiply, and the blocks are summed one after another from the first key,
  so blocks of keys a query cannot see (future tokens, other tree branches, padding) add exact
  zeros.

Norms, activations, rotary embeddings and the rest are row-wise already. The cost is the padding
(a float32 one-token decode multiplies a whole chunk) and attention in float32 blocks. Measured on
SmolLM2-135M, one thread, CPU time per pass at a 64-token context, invariant / default: float32
(chunk 8) decode 1.6x, 5-row extend 1.0-1.1x, 32-node tree 1.8-2x (Qwen2.5-Coder-0.5B: 1.6x,
1.06x, 2.0x); bfloat16 (one row at a time) 1.26x, 1.25x, 1.33x.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

ROW_CHUNK = 8  # rows per linear-layer multiply (float32)
# 16-bit weights: one row at a time. On a CPU without bf16 instructions a multi-row bf16 multiply
# has no fast kernel (8 rows cost 5x one row on SmolLM2), while one row is a fast gemv.
HALF_ROW_CHUNK = 1
QUERY_CHUNK = 8  # queries per attention block
KEY_BLOCK = 64  # keys per attention block
ATTENTION_NAME = "wanspec_invariant"


def _pad_rows(x: torch.Tensor, multiple: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """`x` padded with `value` at the end of dimension `dim` (>= 0) to a multiple of `multiple`."""
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    return F.pad(x, [0, 0] * (x.ndim - 1 - dim) + [0, extra], value=value)


class InvariantLinear(torch.nn.Linear):
    """nn.Linear computed on fixed chunks of `row_chunk` rows, so a row's result never depends
    on how many rows came with it.

    Each chunk is multiplied as W · chunkᵀ (the layout that is fastest for a few rows on CPU, see
    `lm._SwappedLinear`); within one fixed shape the kernel treats every row alike, wherever it
    sits in the chunk and whatever the other rows hold.
    """

    row_chunk: int = ROW_CHUNK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        rows, chunk = flat.shape[0], self.row_chunk
        padded = _pad_rows(flat, chunk, 0)
        out = torch.cat([torch.mm(self.weight, part.T).T for part in padded.split(chunk)])
        out = out[:rows]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.weight.shape[0])


def _visible_bias(
    mask: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device
) -> torch.Tensor:
    """Additive float32 bias [b|1, h|1, q, kv]: 0 where a query sees a key, -inf (or the mask's
    own very negative value) where not. No mask means causal behind the cache, built on
    `device` (the queries')."""
    if mask is None:
        keys = torch.arange(kv_len, device=device)[None, :]
        queries = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        mask = (keys <= queries)[None, None]
    mask = mask[..., :kv_len]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, -math.inf)
    return mask.float()


def _blocked_bias(
    mask: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device
) -> torch.Tensor:
    """The bias laid out like the blocked scores [b, h, n_query_chunks, n_key_blocks, R, B];
    padded keys are invisible, padded queries see everything (their rows are dropped)."""
    bias = _pad_rows(_visible_bias(mask, q_len, kv_len, device), KEY_BLOCK, 3, -math.inf)
    bias = _pad_rows(bias, QUERY_CHUNK, 2, 0.0)
    nq, nk = bias.shape[2] // QUERY_CHUNK, bias.shape[3] // KEY_BLOCK
    return bias.reshape(*bias.shape[:2], nq, QUERY_CHUNK, nk, KEY_BLOCK).transpose(3, 4)


def _key_blocks(states: torch.Tensor, groups: int) -> torch.Tensor:
    """Keys or values [b, kv_heads, kv, d] as float32 blocks [b, heads, 1, n_blocks, B, d]."""
    states = _pad_rows(states.float().repeat_interleave(groups, dim=1), KEY_BLOCK, 2)
    batch, heads, length, dim = states.shape
    return states.reshape(batch, heads, 1, length // KEY_BLOCK, KEY_BLOCK, dim)


def invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention (inference: no dropout) whose every query row is computed the
    same way whatever the number of queries and keys in the pass (see the module docstring).

    transformers' attention-function signature: query [b, h, q, d], key/value [b, kv_h, kv, d]
    (grouped heads allowed), an additive or boolean mask [b, 1, q, kv]; returns [b, q, h, d].
    """
    batch, heads, q_len, head_dim = query.shape
    groups = heads // key.shape[1]
    scaling = head_dim**-0.5 if scaling is None else scaling
    q = _pad_rows(query.float(), QUERY_CHUNK, 2)
    q = q.reshape(batch, heads, q.shape[2] // QUERY_CHUNK, 1, QUERY_CHUNK, head_dim)
    k = _key_blocks(key, groups)
    ones = torch.ones((*value.shape[:-1], 1), dtype=value.dtype, device=value.device)
    v = _key_blocks(torch.cat([value, ones], dim=-1), groups)  # last column: sum of weights
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling  # [b, h, nq, nk, R, B]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + _blocked_bias(attention_mask, q_len, key.shape[2], query.device)
    top = scores.amax(dim=(3, 5), keepdim=True)  # exact: a maximum has no summation order
    weighted = torch.matmul(torch.exp(scores - top), v)  # [b, h, nq, nk, R, d + 1]
    total = weighted[:, :, :, 0]
    for block in range(1, weighted.shape[3]):  # in key order: masked blocks add exact zeros
        total = total + weighted[:, :, :, block]
    out = (total[..., :head_dim] / total[..., head_dim:]).reshape(batch, heads, -1, head_dim)
    return out[:, :, :q_len].transpose(1, 2).contiguous().to(query.dtype), None


def register_invariant_attention() -> str:
    """Make `ATTENTION_NAME` a transformers attention implementation (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, eager_mask)
    return ATTENTION_NAME


def make_batch_invariant(model: torch.nn.Module, row_chunk: int | None = None) -> int:
    """Switch `model` (a transformers causal LM) to pass-shape-invariant linear layers and
    attention, in place; returns how many linear layers were newly swapped.

    `row_chunk`: rows per linear-layer multiply (default: `ROW_CHUNK` for float32 weights,
    `HALF_ROW_CHUNK` for 16-bit ones); larger makes many-row passes cheaper and a one-token
    decode dearer. Every pass of one model must use the same value.
    """
    if row_chunk is None:
        dtype = next(model.parameters()).dtype
        row_chunk = ROW_CHUNK if dtype == torch.float32 else HALF_ROW_CHUNK
    if not isinstance(row_chunk, int) or isinstance(row_chunk, bool) or row_chunk < 1:
        raise ValueError(f"row_chunk must be a positive integer, got {row_chunk!r}")
    model.set_attn_implementation(register_invariant_attention())
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            count += not isinstance(module, InvariantLinear)
            module.__class__ = InvariantLinear
            module.row_chunk = row_chunk
    return count


def is_batch_invariant(model: torch.nn.Module) -> bool:
    """Whether `make_batch_invariant` has switched `model` (its attention and every linear)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    attention = getattr(model.config, "_attn_implementation", None)
    return attention == ATTENTION_NAME and all(isinstance(m, InvariantLinear) for m in linears)
