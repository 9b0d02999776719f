"""Model work as plain data: what a protocol machine asks a driver to compute, and its cost.

A protocol machine never touches a model: it returns a job (what to compute) and later receives
the result. Jobs are frozen, picklable dataclasses, so a driver can run them on an executor
thread, in another process, or batch them with other sessions' jobs, and the machine's output
for a seed cannot depend on when or where they ran. Running them is `wanspec.models.jobs`'s
work; this module needs nothing but numpy, so the protocols that build jobs import no model code.

A forward-like job's result is `LogitRows`: the machine asks it for laws and gets arrays back,
so no machine touches a tensor (`wanspec.sampling.logits` is the model side's).

`ComputeCost` is what a job costs in the simulator's terms (see `wanspec.sim.profiles`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from wanspec.models.batch_policy import prefill_pieces

if TYPE_CHECKING:
    from wanspec.sampling.params import SamplingParams
    from wanspec.sampling.proposal import DraftRow


@dataclass(frozen=True)
class ComputeCost:
    """What a computation costs, for drivers that charge virtual time.

    kind: "forward" (n new tokens after a cache of `context` tokens), "tree" (n tree nodes in one
    pass), "cpu" (bookkeeping, charged as free unless a profile says otherwise).
    """

    kind: Literal["forward", "tree", "cpu"]
    n: int = 0
    context: int = 0
    passes: int = 1  # sequential forward passes of `n` tokens each


@dataclass(frozen=True)
class Forward:
    """Keep the first `keep` cached tokens, feed `tokens`, return the logits of the last `rows`.

    Only the rows a machine needs come back: a 500-token prefill of a 152k-word model would
    otherwise hand over 300 MB of logits nobody reads.
    """

    keep: int
    tokens: tuple[int, ...]
    rows: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if self.keep < 0 or not 0 <= self.rows <= len(self.tokens):
            raise ValueError(
                f"bad Forward: keep={self.keep}, {len(self.tokens)} tokens, rows={self.rows}"
            )

    @property
    def cost(self) -> ComputeCost:
        return ComputeCost("forward", n=len(self.tokens), context=self.keep)


@dataclass(frozen=True)
class TreeForward:
    """Score tree nodes in one pass after the cache (see `LanguageModel.tree_forward`)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    context: int = 0  # cached tokens the tree hangs from (for pricing only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))

    @property
    def cost(self) -> ComputeCost:
        return ComputeCost("tree", n=len(self.tokens), context=self.context)


@dataclass(frozen=True)
class KeepTreePath:
    """Keep one root-to-leaf chain of the pending tree behind its prefix; drop the rest (or,
    with `keep_descendants`, keep the subtree below the chain pending, re-rooted)."""

    nodes: tuple[int, ...]
    keep_descendants: bool = False

    @property
    def cost(self) -> ComputeCost:
        return ComputeCost("cpu", n=len(self.nodes))


@dataclass(frozen=True)
class Embed:
    """The model's input embeddings of `ids` (split inference's edge half)."""

    ids: tuple[int, ...]

    @property
    def cost(self) -> ComputeCost:
        return ComputeCost("cpu", n=len(self.ids))


@dataclass(frozen=True, eq=False)
class ForwardEmbeddings:
    """Keep `keep` cached positions, feed activation rows, return the last row's logits."""

    keep: int
    rows: np.ndarray = field(repr=False)

    @property
    def cost(self) -> ComputeCost:
        return ComputeCost("forward", n=int(self.rows.shape[0]), context=self.keep)


class LogitRows(Protocol):
    """What `Forward`, `TreeForward` and `ForwardEmbeddings` return: their logits rows, asked for
    the laws a machine decides with; every answer is a numpy array (or arrays of them)."""

    def __len__(self) -> int: ...

    def last(self) -> LogitRows:
        """The last row alone."""
        ...

    def numpy(self) -> np.ndarray:
        """The raw rows, float32 [rows, V]."""
        ...

    def target_probs(
        self, row: int, params: SamplingParams, valid: np.ndarray, prev_ids: Sequence[int] | None
    ) -> np.ndarray:
        """The target's q at `row` (float64, the request's warp; see `sampling.target`)."""
        ...

    def draft_rows(
        self,
        params: SamplingParams,
        *,
        allowed: np.ndarray | None,
        to_ids: np.ndarray | None,
        width: int | None,
        ranks: int,
    ) -> list[DraftRow]:
        """p̃ at every row (see `sampling.draft.draft_rows`)."""
        ...


Job = Forward | TreeForward | KeepTreePath | Embed | ForwardEmbeddings


def split_forward(job: Forward, size: int) -> list[Forward]:
    """`job` as consecutive `Forward`s of at most `size` tokens whose results, concatenated, are
    `job`'s: a long prefill in pieces, so other sessions' passes can run between them and no
    single pass holds attention over the whole prompt at once; the pieces' bounds are
    `batch_policy.prefill_pieces`. `size` 0: never split."""
    n = len(job.tokens)
    bounds = prefill_pieces(n, size)
    if len(bounds) == 1:
        return [job]
    first_row = n - job.rows  # the first token whose logits row comes back
    return [
        Forward(job.keep + start, job.tokens[start:stop], max(0, stop - max(start, first_row)))
        for start, stop in bounds
    ]


Executor = Callable[[Job], Any]  # runs one job on one session, returns its result

__all__ = [
    "ComputeCost",
    "Embed",
    "Executor",
    "Forward",
    "ForwardEmbeddings",
    "Job",
    "KeepTreePath",
    "LogitRows",
    "TreeForward",
    "split_forward",
]
