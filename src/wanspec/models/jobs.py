"""The one place a protocol's jobs (`wanspec.jobs`) touch a model: run them on a session.

The result of every forward-like job is a `TorchLogitRows` over a float32 CPU logits tensor
[rows, V] of its own, whatever device the model computes on (only those rows leave the device):
the machine asks it for laws and gets arrays. `Embed` returns its activations as a float32 array;
a job that only rearranges the cache returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from wanspec.jobs import (
    Embed,
    Executor,
    Forward,
    ForwardEmbeddings,
    Job,
    KeepTreePath,
    TreeForward,
)
from wanspec.models.lm import HFLanguageModel, LanguageModel
from wanspec.sampling.logits import TorchLogitRows


def run_job(session: LanguageModel, job: Job) -> Any:
    """Carry out `job` on one KV-cache session; the only place a protocol's jobs touch a model."""
    if isinstance(job, Forward):
        _roll_back(session, job.keep)
        return TorchLogitRows(session.extend(list(job.tokens), rows=job.rows))
    if isinstance(job, TreeForward):
        return TorchLogitRows(session.tree_forward(list(job.tokens), list(job.parents)))
    if isinstance(job, KeepTreePath):
        session.keep_tree_path(list(job.nodes), job.keep_descendants)
        return None
    if isinstance(job, Embed):
        return session.embed(list(job.ids)).detach().float().numpy()  # type: ignore[attr-defined]
    if isinstance(job, ForwardEmbeddings):
        _roll_back(session, job.keep)
        activations = torch.from_numpy(np.asarray(job.rows, dtype=np.float32))
        logits = session.extend_embeddings(activations, rows=1)  # type: ignore[attr-defined]
        return TorchLogitRows(logits)
    raise TypeError(f"not a model job: {job!r}")


def run_jobs_batched(work: Sequence[tuple[LanguageModel, Job]]) -> list[Any]:
    """Carry out several sessions' jobs, each as `run_job(session, job)` would, in as few passes
    as possible; the results in the order given.

    The `Forward` jobs of distinct transformers sessions of one model run as ONE forward pass
    (`HFLanguageModel.extend_batch`); any other job, or a batch of one, runs alone through
    `run_job`. The caller gives at most one job per session (a session's jobs must run in order).
    Bad input (a `keep` beyond the cache, an id out of range) raises before any model work; if the
    batched pass itself fails, every session is back where it was and the error propagates.
    """
    batch = [i for i, (_, job) in enumerate(work) if isinstance(job, Forward) and job.tokens]
    if len(batch) < 2 or not HFLanguageModel.can_batch([work[i][0] for i in batch]):
        return [run_job(session, job) for session, job in work]
    results: list[Any] = [None] * len(work)
    for i, (session, job) in enumerate(work):
        if i not in batch:
            results[i] = run_job(session, job)
    forwards: list[tuple[LanguageModel, Forward]] = [work[i] for i in batch]  # type: ignore[misc]
    for session, job in forwards:
        session.check_tokens(job.tokens, "tokens")
        _roll_back(session, job.keep)
    logits = HFLanguageModel.extend_batch(
        [s for s, _ in forwards], [job.tokens for _, job in forwards], [j.rows for _, j in forwards]
    )
    for i, rows in zip(batch, logits, strict=True):
        results[i] = TorchLogitRows(rows)
    return results


def _roll_back(session: LanguageModel, keep: int) -> None:
    if keep > session.length:
        raise RuntimeError(f"job keeps {keep} cached tokens but the session holds {session.length}")
    if session.length != keep or session.pending_tree_size:
        session.truncate(keep)


def session_executor(model: LanguageModel) -> Executor:
    """An executor running jobs on a fresh session of `model` (weights shared, cache its own)."""
    session = model.new_session()
    return lambda job: run_job(session, job)
