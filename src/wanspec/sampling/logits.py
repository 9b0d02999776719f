"""A forward pass's logits rows as a protocol machine receives them: laws out, arrays only.

A machine never touches a tensor. What a model job hands back is a `LogitRows` (the shape is
`wanspec.jobs.LogitRows`): the rows stay where the model left them, and the machine asks for
the laws it decides with (the target's q at a row, the draft's p̃ over its candidates) or for
the raw row as an array. Each law is computed here, by the same functions as everywhere else,
when the machine asks, so a rejection at position j still leaves the rows after j untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wanspec.sampling.draft import draft_rows
from wanspec.sampling.params import SamplingParams
from wanspec.sampling.proposal import DraftRow
from wanspec.sampling.target import target_probs, valid_mask


class TorchLogitRows:
    """A [rows, V] block of float32 logits from one model job."""

    __slots__ = ("block",)

    def __init__(self, block: torch.Tensor) -> None:
        if block.ndim != 2:
            raise ValueError(f"logits rows must be [rows, V], got {tuple(block.shape)}")
        self.block = block

    def __len__(self) -> int:
        return int(self.block.shape[0])

    @classmethod
    def concat(cls, parts: Sequence[TorchLogitRows]) -> TorchLogitRows:
        """One job's rows from the rows of its pieces, in order (a prefill run in pieces)."""
        return parts[0] if len(parts) == 1 else cls(torch.cat([p.block for p in parts]))

    @property
    def nbytes(self) -> int:
        return self.block.element_size() * self.block.nelement()

    def copy(self) -> TorchLogitRows:
        """Rows of their own (an inference-mode block is copied as one, as the pass made it)."""
        with torch.inference_mode(self.block.is_inference()):
            return TorchLogitRows(self.block.clone())

    def last(self) -> TorchLogitRows:
        """The last row alone (what a draft step samples from)."""
        return TorchLogitRows(self.block[-1:])

    def numpy(self) -> np.ndarray:
        """The raw rows as a float32 array."""
        return self.block.detach().float().cpu().numpy()

    def target_probs(
        self,
        row: int,
        params: SamplingParams,
        valid: np.ndarray,
        prev_ids: Sequence[int] | None = None,
    ) -> np.ndarray:
        """The target's float q at `row` (`wanspec.sampling.target.target_probs`)."""
        return target_probs(self.block[row], params, valid_mask(valid), prev_ids)

    def draft_rows(
        self,
        params: SamplingParams,
        *,
        allowed: np.ndarray | None = None,
        to_ids: np.ndarray | None = None,
        width: int | None = None,
        ranks: int = 0,
    ) -> list[DraftRow]:
        """p̃ at every row in one block (`wanspec.sampling.draft.draft_rows`)."""
        return draft_rows(
            self.block, params, allowed=allowed, to_ids=to_ids, width=width, ranks=ranks
        )
