"""One forward pass that extends several KV-cache sessions of one model at once.

A cloud serving many edges verifies each edge's draft on that edge's own session. Run one after
the other, every verification pays a full pass over the weights; `batched_extend` runs them as
ONE pass with a batch row per session, so the weights are read once for all of them.

Each session keeps its own `DynamicCache`. During the pass `_RaggedCache` stands in for the
model's cache: when a layer hands it the new keys and values of the whole batch, it appends row
i's real (unpadded) ones to session i's cache and gives the layer back every session's full keys
and values packed row by row, **each starting at slot 0, exactly where they sit when that session
runs alone**, zero-padded at the end to the longest row. The attention mask (one additive bias
per row from `lm.tree_bias`, a chain being a tree without branches) shows each query its own
session's cache and its own earlier new tokens only; positions come from `position_ids`.

Why slot 0 and not the usual left padding: the pass-shape-invariant attention of
`wanspec.models.invariant` sums keys in fixed blocks counted from the first slot, so a session's
keys must occupy the same slots as alone for its logits to come out bitwise the same. With
`make_batch_invariant` on, a session's logits in a batch therefore equal its logits alone bit for
bit; with the default kernels they agree to float rounding (the summation order of a [B, n]
pass differs from a [1, n] one), which can flip an exact tie but not a law.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from wanspec.models.lm import HFLanguageModel, LanguageModel, to_host, tree_bias


def can_batch(sessions: Sequence[LanguageModel]) -> bool:
    """Whether `batched_extend` can run these sessions in one pass: transformers sessions over
    the very same weights, none with a pending tree, no session twice."""
    if not sessions or not all(isinstance(s, HFLanguageModel) for s in sessions):
        return False
    first = sessions[0]
    return (
        all(s.model is first.model for s in sessions)  # type: ignore[attr-defined]
        and not any(s.pending_tree_size for s in sessions)
        and len({id(s) for s in sessions}) == len(sessions)
    )


class _RaggedCache(DynamicCache):
    """The cache a batched pass's layers see (see the module docstring)."""

    def __init__(self, sessions: Sequence[HFLanguageModel], new: Sequence[int]) -> None:
        super().__init__()
        self.sessions, self.new = sessions, new
        self.width = max(s.length + n for s, n in zip(sessions, new, strict=True))

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_zeros((batch, heads, self.width, dim))
        values = value_states.new_zeros((batch, heads, self.width, value_states.shape[-1]))
        for row, (session, n) in enumerate(zip(self.sessions, self.new, strict=True)):
            own_keys, own_values = session._cache.update(
                key_states[row : row + 1, :, :n], value_states[row : row + 1, :, :n], layer_idx
            )
            keys[row, :, : own_keys.shape[-2]] = own_keys[0]
            values[row, :, : own_values.shape[-2]] = own_values[0]
        return keys, values


def _row_bias(length: int, n: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """[n, length + n] additive bias of n new chain tokens after `length` cached ones."""
    return tree_bias(
        length,
        attach=np.full(n, length - 1),
        key_positions=np.arange(length + n),
        query_positions=np.arange(length, length + n),
        ancestors=np.tril(np.ones((n, n), dtype=bool)),
        window=window,
        dtype=dtype,
    )[0, 0]


def _batch_bias(
    lengths: Sequence[int],
    new: Sequence[int],
    width: int,
    window: int | None,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """[B, 1, N, width] on `device`: each row's own bias, everything else hidden; a padding query
    sees slot 0 only (its output is dropped, but a row that sees nothing would be NaN). Built on
    the CPU row by row, then moved in one copy."""
    bias = torch.full((len(new), 1, max(new), width), torch.finfo(dtype).min, dtype=dtype)
    bias[:, :, :, 0] = 0
    for row, (length, n) in enumerate(zip(lengths, new, strict=True)):
        bias[row, 0, :n, : length + n] = _row_bias(length, n, window, dtype)
    return bias.to(device)


def _padded(
    rows: Sequence[Sequence[int]], fill: Sequence[int], device: torch.device
) -> torch.Tensor:
    """[B, N] integer tensor of ragged rows on `device`, row i padded with fill[i]."""
    width = max(len(r) for r in rows)
    padded = [[*r, *[f] * (width - len(r))] for r, f in zip(rows, fill, strict=True)]
    return torch.tensor(padded, device=device)


@torch.inference_mode()
def batched_extend(
    sessions: Sequence[LanguageModel],
    token_lists: Sequence[Sequence[int]],
    rows: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Append `token_lists[i]` to `sessions[i]` for every i in ONE forward pass; returns each
    session's float32 CPU logits, as `sessions[i].extend(token_lists[i], rows[i])` would (rows
    None: every row). The rows asked for leave the device together, in one copy.

    Needs `can_batch(sessions)` and at least one token per session. On failure every session is
    rolled back to where it was and the error propagates.
    """
    if not can_batch(sessions):
        raise ValueError("batched_extend needs distinct transformers sessions of one model")
    hf: list[HFLanguageModel] = list(sessions)  # type: ignore[arg-type]
    ids = [s._check_tokens(t, "ids") for s, t in zip(hf, token_lists, strict=True)]
    if any(not row for row in ids):
        raise ValueError("every session of a batched pass needs at least one new token")
    lengths, new = [s.length for s in hf], [len(row) for row in ids]
    if rows is not None and len(rows) != len(new):
        raise ValueError(f"{len(rows)} row counts for {len(new)} sessions")
    given = new if rows is None else rows
    wanted = [hf[0]._check_rows(given[i], n) for i, n in enumerate(new)]
    cache = _RaggedCache(hf, new)
    lead = hf[0]
    device = lead.device
    masks = {
        kind: _batch_bias(lengths, new, cache.width, window, lead.dtype, device)
        for kind, window in lead._windows.items()
    }
    positions = [range(length, length + n) for length, n in zip(lengths, new, strict=True)]
    try:
        out = lead.model(
            input_ids=_padded(ids, [0] * len(ids), device),
            position_ids=_padded(positions, lengths, device),
            attention_mask=masks if len(masks) > 1 else next(iter(masks.values())),
            use_cache=True,
            **{lead._cache_kwarg: cache},
        )
    except BaseException:
        for session, length in zip(hf, lengths, strict=True):
            session._length = length
            session.truncate(length)
        raise
    for session, n in zip(hf, new, strict=True):
        session._length += n
    picked = [out.logits[row, n - wanted[row] : n] for row, n in enumerate(new)]
    return list(to_host(torch.cat(picked)).split(wanted))  # one copy off the device
