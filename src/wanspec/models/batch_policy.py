"""The cloud's batching policy: which queued model jobs share the next forward pass.

One rule, written once, for both places that batch a cloud's jobs: the server's model thread
(`wanspec.net.batching`) and the simulator's shared accelerator (`wanspec.sim.many`), so the
capacity the simulator measures is the scheduler `wanspec serve` runs. Plain data in and out:
no torch, no jobs, so either side describes its queue in a line.

The rule (`next_pass`), over the queue in arrival order:
- the oldest job always runs, alone if it is over the bound by itself: a long job cannot starve;
- then each later job that can share a pass joins while rows × longest row stays within
  `max_batch_tokens`: a pass pads every row to its longest, so that product, not the tokens'
  sum, is what it computes (`padded_tokens`);
- a job that does not fit is skipped and keeps its place; a later, smaller one may still join;
- a job that cannot share a pass (anything but a `Forward`, or one of no tokens) runs alone;
- `max_batch_tokens` 0: one job per pass, in arrival order (the comparison without batching).

A prompt longer than `prefill_chunk` tokens is fed in pieces (`prefill_pieces`), each its own
job going back to the end of the queue, so a long prefill delays the others by one piece's pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

DEFAULT_MAX_BATCH_TOKENS = 256  # rows × longest row per pass
DEFAULT_PREFILL_CHUNK = 256  # tokens per piece of a long prefill


class QueuedJob(NamedTuple):
    """What the policy needs of one queued job: how many new tokens it feeds and whether it can
    share a pass with others (a `Forward`)."""

    tokens: int
    batchable: bool

    @property
    def shares(self) -> bool:
        """A row of a batched pass: a shareable job feeding at least one token."""
        return self.batchable and self.tokens > 0


def next_pass(queue: Sequence[QueuedJob], max_batch_tokens: int) -> list[int]:
    """Indices into `queue` (arrival order) of the jobs that form the next pass, ascending: the
    oldest, then each later sharing job that keeps rows × longest row within the bound."""
    if not queue:
        return []
    head = queue[0]
    if max_batch_tokens <= 0 or not head.shares:
        return [0]
    chosen, longest = [0], head.tokens
    for i in range(1, len(queue)):
        job = queue[i]
        wider = max(longest, job.tokens)
        if job.shares and (len(chosen) + 1) * wider <= max_batch_tokens:
            chosen.append(i)
            longest = wider
    return chosen


def padded_tokens(tokens: Sequence[int]) -> int:
    """What a pass over rows of these token counts computes: rows × the longest row."""
    return len(tokens) * max(tokens, default=0)


def prefill_pieces(n: int, prefill_chunk: int) -> list[tuple[int, int]]:
    """The [start, stop) token ranges a job of `n` tokens is fed in: pieces of `prefill_chunk`
    tokens, the last one shorter; one piece when it fits or `prefill_chunk` is 0."""
    if prefill_chunk <= 0 or n <= prefill_chunk:
        return [(0, n)]
    return [(start, min(start + prefill_chunk, n)) for start in range(0, n, prefill_chunk)]


__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "DEFAULT_PREFILL_CHUNK",
    "QueuedJob",
    "next_pass",
    "padded_tokens",
    "prefill_pieces",
]
