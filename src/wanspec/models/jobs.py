"""Model computations as plain data, and the one function that runs them on a session.

A protocol machine never touches a model: it returns a job (what to compute) and later receives
the result. Jobs are frozen, picklable dataclasses, so a driver can run them on an executor
thread, in another process, or batch them with other sessions' jobs, and the machine's output
for a seed cannot depend on when or where they ran. The result of every forward-like job is a
float32 CPU logits tensor [rows, V] of its own, whatever device the model computes on (only
those rows leave the device); a job that only rearranges the cache returns None.

`ComputeCost` is what a job costs in the simulator's terms (see `wanspec.sim.profiles`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from wanspec.models.batch_policy import prefill_pieces
from wanspec.models.batched import batched_extend, can_batch
from wanspec.models.lm import LanguageModel


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


def run_job(session: LanguageModel, job: Job) -> Any:
    """Carry out `job` on one KV-cache session; the only place a protocol's jobs touch a model."""
    if isinstance(job, Forward):
        _roll_back(session, job.keep)
        return session.extend(list(job.tokens), rows=job.rows)
    if isinstance(job, TreeForward):
        return session.tree_forward(list(job.tokens), list(job.parents))
    if isinstance(job, KeepTreePath):
        session.keep_tree_path(list(job.nodes), job.keep_descendants)
        return None
    if isinstance(job, Embed):
        return session.embed(list(job.ids))  # type: ignore[attr-defined]
    if isinstance(job, ForwardEmbeddings):
        _roll_back(session, job.keep)
        activations = torch.from_numpy(np.asarray(job.rows, dtype=np.float32))
        return session.extend_embeddings(activations, rows=1)  # type: ignore[attr-defined]
    raise TypeError(f"not a model job: {job!r}")


def run_jobs_batched(work: Sequence[tuple[LanguageModel, Job]]) -> list[Any]:
    """Carry out several sessions' jobs, each as `run_job(session, job)` would, in as few passes
    as possible; the results in the order given.

    The `Forward` jobs of distinct transformers sessions of one model run as ONE forward pass
    (`wanspec.models.batched`); any other job, or a batch of one, runs alone through `run_job`.
    The caller gives at most one job per session (a session's jobs must run in order). Bad input
    (a `keep` beyond the cache, an id out of range) raises before any model work; if the batched
    pass itself fails, every session is back where it was and the error propagates.
    """
    batch = [i for i, (_, job) in enumerate(work) if isinstance(job, Forward) and job.tokens]
    if len(batch) < 2 or not can_batch([work[i][0] for i in batch]):
        return [run_job(session, job) for session, job in work]
    results: list[Any] = [None] * len(work)
    for i, (session, job) in enumerate(work):
        if i not in batch:
            results[i] = run_job(session, job)
    forwards: list[tuple[LanguageModel, Forward]] = [work[i] for i in batch]  # type: ignore[misc]
    for session, job in forwards:
        session._check_tokens(job.tokens, "tokens")
        _roll_back(session, job.keep)
    logits = batched_extend(
        [s for s, _ in forwards], [job.tokens for _, job in forwards], [j.rows for _, j in forwards]
    )
    for i, rows in zip(batch, logits, strict=True):
        results[i] = rows
    return results


def _roll_back(session: LanguageModel, keep: int) -> None:
    if keep > session.length:
        raise RuntimeError(f"job keeps {keep} cached tokens but the session holds {session.length}")
    if session.length != keep or session.pending_tree_size:
        session.truncate(keep)


Executor = Callable[[Job], Any]


def session_executor(model: LanguageModel) -> Executor:
    """An executor running jobs on a fresh session of `model` (weights shared, cache its own)."""
    session = model.new_session()
    return lambda job: run_job(session, job)
