"""Batched verification's model side: one pass over several sessions' KV caches gives each
session the logits (and the cache) it gets alone; the model thread's batch policy.

Bitwise where the pass-shape-invariant mode is on (`make_batch_invariant`), to float rounding
with the default kernels; on every tiny family (Llama, Qwen2, Gemma3 with sliding windows).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from wanspec.jobs import Forward, KeepTreePath, split_forward
from wanspec.models.invariant import make_batch_invariant
from wanspec.models.jobs import run_job, run_jobs_batched
from wanspec.models.lm import LanguageModel, load_model
from wanspec.net.batching import ModelBatcher, _Ask, take_batch

PROMPTS = (5, 70, 1, 33)  # cache lengths across a key block (64) and a sliding window
STEPS = (3, 1, 5, 2)  # then a verification-sized step each


def _ids(model: LanguageModel, sizes: tuple[int, ...], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.vocab_size, (n,), generator=g).tolist() for n in sizes]


def _two_steps(model: LanguageModel, batched: bool) -> tuple[list[torch.Tensor], list[int]]:
    """A prefill then one step for four sessions, each job's logits in order, and the
    sessions' cache lengths after; `batched`: each step as one `run_jobs_batched` call."""
    sessions = [model.new_session() for _ in PROMPTS]
    prompts, steps = _ids(model, PROMPTS, 0), _ids(model, STEPS, 1)
    rounds = [
        [Forward(0, tuple(p), len(p)) for p in prompts],
        [Forward(len(p), tuple(s), len(s)) for p, s in zip(prompts, steps, strict=True)],
    ]
    out: list[torch.Tensor] = []
    for jobs in rounds:
        if batched:
            out += [r.block for r in run_jobs_batched(list(zip(sessions, jobs, strict=True)))]
        else:
            out += [run_job(s, j).block for s, j in zip(sessions, jobs, strict=True)]
    return out, [s.length for s in sessions]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def folder(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Path:
    return tiny_models[request.param]


def test_a_batched_pass_is_bitwise_each_session_alone_in_invariant_mode(folder: Path) -> None:
    model = load_model(folder, threads=1)
    make_batch_invariant(model.model)
    alone, lengths = _two_steps(model, batched=False)
    together, batched_lengths = _two_steps(model, batched=True)
    assert batched_lengths == lengths == [p + s for p, s in zip(PROMPTS, STEPS, strict=True)]
    for a, b in zip(alone, together, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


def test_a_batched_pass_matches_each_session_alone_with_default_kernels(folder: Path) -> None:
    model = load_model(folder, threads=1)
    alone, _ = _two_steps(model, batched=False)
    together, _ = _two_steps(model, batched=True)
    for a, b in zip(alone, together, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_bad_job_in_a_batch_raises_before_any_session_changes(folder: Path) -> None:
    model = load_model(folder, threads=1)
    good, bad = model.new_session(), model.new_session()
    run_job(good, Forward(0, (1, 2, 3)))
    with pytest.raises(ValueError, match="outside"):
        run_jobs_batched([(good, Forward(3, (4,))), (bad, Forward(0, (model.vocab_size,)))])
    assert (good.length, bad.length) == (3, 0)


def test_jobs_that_cannot_share_a_pass_run_alone_in_order(tiny_models: dict[str, Path]) -> None:
    model = load_model(tiny_models["llama"], threads=1)
    tree, plain = model.new_session(), model.new_session()
    run_job(tree, Forward(0, (1, 2)))
    tree.tree_forward([3, 4], [-1, 0])
    results = run_jobs_batched([(tree, KeepTreePath((0, 1))), (plain, Forward(0, (5, 6), 2))])
    assert results[0] is None and tree.length == 4
    assert results[1].block.shape == (2, model.vocab_size) and plain.length == 2


# ---------------------------------------------------------------------------- batch policy


def _queue(*sizes: int) -> deque[_Ask]:
    """Asks of `Forward` jobs of these token counts (0: a job that is not a `Forward`)."""
    asks = deque[_Ask]()
    for n in sizes:
        job = Forward(0, tuple(range(n))) if n else KeepTreePath(())
        asks.append(_Ask(None, job, Future(), 0.0))  # type: ignore[arg-type]
    return asks


def _sizes(asks: list[_Ask] | deque[_Ask]) -> list[int]:
    return [a.tokens for a in asks]


def test_a_batch_takes_the_oldest_then_what_fits_padded() -> None:
    queue = _queue(5, 5, 40, 5, 0, 5)
    assert _sizes(take_batch(queue, 20)) == [5, 5, 5, 5]  # 4 rows × 5 = 20: the 40 waits
    assert _sizes(queue) == [40, 0]
    assert _sizes(take_batch(queue, 20)) == [40]  # the oldest runs even over the bound
    assert _sizes(take_batch(queue, 20)) == [0]  # not a Forward: alone


def test_no_batching_takes_one_job_at_a_time_in_arrival_order() -> None:
    queue = _queue(3, 1, 2)
    assert [_sizes(take_batch(queue, 0)) for _ in range(3)] == [[3], [1], [2]]


def test_a_bad_job_fails_its_own_session_only(tiny_models: dict[str, Path]) -> None:
    """Eight sessions ask at once (the model thread batches what it finds queued); one job keeps
    more tokens than its cache holds: that session gets the error, the others their logits."""
    model = load_model(tiny_models["llama"], threads=1)
    prompts = _ids(model, (4, 9, 2, 7, 5, 3, 8, 6), 2)
    expected = [run_job(model.new_session(), Forward(0, tuple(p), 2)).block for p in prompts]
    batcher = ModelBatcher(256, waiters=2)
    try:
        sessions = [model.new_session() for _ in prompts]
        jobs = [Forward(0, tuple(p), 2) for p in prompts]
        jobs[3] = Forward(99, tuple(prompts[3]), 2)
        futures = [batcher.ask(s, j) for s, j in zip(sessions, jobs, strict=True)]
        for i, (future, want) in enumerate(zip(futures, expected, strict=True)):
            if i == 3:
                with pytest.raises(RuntimeError, match="keeps 99"):
                    future.result(timeout=30)
            else:
                got = future.result(timeout=30).block
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    finally:
        batcher.shutdown()


@pytest.mark.parametrize(("n", "rows", "size"), [(10, 1, 4), (10, 6, 4), (10, 10, 3), (8, 0, 4)])
def test_a_split_forward_covers_the_tokens_once_and_returns_the_asked_rows(
    n: int, rows: int, size: int
) -> None:
    job = Forward(7, tuple(range(100, 100 + n)), rows)
    pieces = split_forward(job, size)
    assert all(len(p.tokens) <= size for p in pieces)
    assert [t for p in pieces for t in p.tokens] == list(job.tokens)
    assert [p.keep for p in pieces] == [7 + sum(len(q.tokens) for q in pieces[:i]) for i in
                                        range(len(pieces))]  # fmt: skip
    assert sum(p.rows for p in pieces) == rows
    assert pieces[-1].rows == min(rows, len(pieces[-1].tokens))
    assert split_forward(job, 0) == [job] == split_forward(job, n)


def test_a_long_prefill_runs_in_pieces_and_lets_a_short_job_through(
    tiny_models: dict[str, Path],
) -> None:
    """A long prompt asked first and a one-token step of another session asked right after: the
    step finishes before the prompt's last piece, and the prompt's rows equal one pass's."""
    model = load_model(tiny_models["llama"], threads=1, invariant=True)
    prompt, other = _ids(model, (70, 5), 3)
    long_job = Forward(0, tuple(prompt), 3)
    expected = run_job(model.new_session(), long_job).block
    passes: list[tuple[str, ...]] = []

    class Observer:
        def batch_done(self, stats: object) -> None:
            passes.append((stats.tokens, stats.sessions))  # type: ignore[attr-defined]

    short_session = model.new_session()
    run_job(short_session, Forward(0, tuple(other), 1))
    batcher = ModelBatcher(256, prefill_chunk=16, waiters=2, observer=Observer())
    finished: list[str] = []
    try:
        with batcher._ready:  # both queued before the model thread takes its first batch
            slow = batcher.ask(model.new_session(), long_job)
            quick = batcher.ask(short_session, Forward(5, (other[0],), 1))
            slow.add_done_callback(lambda _: finished.append("prompt"))
            quick.add_done_callback(lambda _: finished.append("step"))
        assert torch.equal(slow.result(timeout=30).block, expected)
        quick.result(timeout=30)
    finally:
        batcher.shutdown()
    assert finished == ["step", "prompt"]  # the step did not wait for the whole prompt
    assert passes == [(17, 2), (16, 1), (16, 1), (16, 1), (6, 1)]
