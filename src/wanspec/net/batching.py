"""The server's model executor: continuous batching of every session's model jobs.

Each session's driver asks for its jobs one at a time, in order (`wanspec.net.driver`), so at
any moment a session has at most one job waiting here. ONE model thread loops: whenever the
model is free it takes whatever is queued, oldest first, and runs it as one batch through
`wanspec.models.jobs.run_jobs_batched` (one forward pass over the sessions' own KV caches),
then hands each session its own result. Nothing ever waits for a session that has not asked:
a batch is what was queued when the previous one ended (continuous batching, not a fixed
batch of clients), so a slow edge costs the others at most its share of one pass.

Which queued jobs form a pass is `wanspec.models.batch_policy.next_pass`, the one policy the
simulator's shared accelerator runs too: the oldest job always (alone if it is over the bound by
itself, a long prefill), then each later `Forward` that keeps rows × the longest row (rows are
padded to the longest) within `max_batch_tokens`; jobs that do not fit wait for the next pass in
their order. `max_batch_tokens=0` runs one job at a time in arrival order (the comparison
without batching).

A `Forward` longer than `prefill_chunk` tokens (a long prompt) runs in pieces of that size
(`split_forward`): after each piece it goes back to the end of the queue, so every other
session's queued job runs between two pieces and a maximal prompt delays the others by one
piece's pass, not by the whole prefill; its future gets the pieces' rows joined.

The model thread is separate from the threads the drivers wait on: `ModelBatcher` is itself a
`concurrent.futures.Executor` (what `drive` takes) whose threads only wait for the batch result,
so a driver's measured job time here is its queueing plus its batch's pass.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from wanspec.jobs import Forward, Job, split_forward
from wanspec.models.batch_policy import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PREFILL_CHUNK,
    QueuedJob,
    next_pass,
    padded_tokens,
)
from wanspec.models.jobs import run_job, run_jobs_batched
from wanspec.models.lm import LanguageModel
from wanspec.sampling.logits import TorchLogitRows

log = logging.getLogger("wanspec.serve")


@dataclass(frozen=True)
class BatchStats:
    """One pass of the model thread, for metrics."""

    sessions: int  # jobs (one per session) in the pass
    tokens: int  # new tokens fed, summed over the sessions
    padded_tokens: int  # what the pass computed: rows × the longest row
    queue_wait_s: tuple[float, ...]  # each job's wait from asking to the pass's start
    seconds: float  # the pass itself
    kinds: tuple[str, ...]  # each job's type name


class BatchObserver(Protocol):
    def batch_done(self, stats: BatchStats) -> None: ...


@dataclass
class _Ask:
    session: LanguageModel
    job: Job
    future: Future[Any]
    asked: float  # time.perf_counter() when asked
    rest: list[Forward] = field(default_factory=list)  # a split job's pieces still to run
    done_rows: list[Any] = field(default_factory=list)  # its finished pieces' results

    @property
    def tokens(self) -> int:
        return len(self.job.tokens) if isinstance(self.job, Forward) else 0

    @property
    def queued(self) -> QueuedJob:
        """What the batching policy sees of this job."""
        return QueuedJob(self.tokens, isinstance(self.job, Forward))


def take_batch(queue: deque[_Ask], max_batch_tokens: int) -> list[_Ask]:
    """Remove and return the next batch as `batch_policy.next_pass` picks it; the rest stay
    queued in order."""
    asks = list(queue)
    chosen = set(next_pass([ask.queued for ask in asks], max_batch_tokens))
    queue.clear()
    queue.extend(ask for i, ask in enumerate(asks) if i not in chosen)
    return [ask for i, ask in enumerate(asks) if i in chosen]


class ModelBatcher(Executor):
    """Runs every session's model jobs on one model thread, batched (see the module docstring).

    `runner(session)` is the job runner a session's driver calls (on this executor's waiting
    threads); `waiters` bounds how many drivers can wait at once (a server: its session limit).
    """

    def __init__(
        self,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        *,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        waiters: int = 8,
        observer: BatchObserver | None = None,
        name: str = "wanspec-target",
    ) -> None:
        if max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens must be >= 0, got {max_batch_tokens}")
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {prefill_chunk}")
        self.max_batch_tokens = max_batch_tokens
        self.prefill_chunk = prefill_chunk
        self.observer = observer
        self._queue: deque[_Ask] = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._waiters = ThreadPoolExecutor(waiters, thread_name_prefix=f"{name}-wait")
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ what drivers use
    def ask(self, session: LanguageModel, job: Job) -> Future[Any]:
        """Queue `job` for `session`; the future gets its result (or its error)."""
        future: Future[Any] = Future()
        pieces = split_forward(job, self.prefill_chunk) if isinstance(job, Forward) else [job]
        ask = _Ask(session, pieces[0], future, time.perf_counter(), rest=pieces[1:])
        with self._ready:
            if self._stopping:
                raise RuntimeError("the model executor is shut down")
            self._queue.append(ask)
            self._ready.notify()
        return future

    def runner(self, session: LanguageModel) -> Callable[[Job], Any]:
        """A blocking job runner for one session's driver."""
        return lambda job: self.ask(session, job).result()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Executor protocol: run `fn` on a waiting thread (a driver's `runner` call)."""
        return self._waiters.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the model thread; jobs still queued fail with RuntimeError."""
        with self._ready:
            self._stopping = True
            pending = list(self._queue)
            self._queue.clear()
            self._ready.notify_all()
        for ask in pending:
            with contextlib.suppress(Exception):
                ask.future.set_exception(RuntimeError("the model executor is shut down"))
        self._waiters.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            self._thread.join()

    # ------------------------------------------------------------------ the model thread
    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if self._stopping:
                    return
                batch = take_batch(self._queue, self.max_batch_tokens)
            self._run(batch)

    def _run(self, batch: Sequence[_Ask]) -> None:
        began = time.perf_counter()
        try:
            results = run_jobs_batched([(ask.session, ask.job) for ask in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            log.warning("batched pass of %d jobs failed (%s); running them alone", len(batch), exc)
            for ask in batch:
                self._run_alone(ask)
            return
        stats = _stats(batch, began, time.perf_counter() - began)  # before pieces move on
        for ask, result in zip(batch, results, strict=True):
            self._done(ask, result)
        if self.observer is not None:
            try:
                self.observer.batch_done(stats)
            except Exception:  # metrics must never stop the model thread
                log.exception("batch observer failed")

    def _run_alone(self, ask: _Ask) -> None:
        """One job through `run_job`, so its error reaches its own session only."""
        try:
            result = run_job(ask.session, ask.job)
        except Exception as exc:
            ask.future.set_exception(exc)
            return
        self._done(ask, result)

    def _done(self, ask: _Ask, result: Any) -> None:
        """Hand a job its result; a split job's piece instead queues the next piece last."""
        if not ask.rest:
            joined = TorchLogitRows.concat([*ask.done_rows, result])
            ask.future.set_result(joined)
            return
        ask.done_rows.append(result)
        ask.job = ask.rest.pop(0)
        with self._ready:
            if self._stopping:
                ask.future.set_exception(RuntimeError("the model executor is shut down"))
                return
            self._queue.append(ask)
            self._ready.notify()


def _stats(batch: Sequence[_Ask], began: float, seconds: float) -> BatchStats:
    tokens = [ask.tokens for ask in batch]
    return BatchStats(
        sessions=len(batch),
        tokens=sum(tokens),
        padded_tokens=padded_tokens(tokens),
        queue_wait_s=tuple(began - ask.asked for ask in batch),
        seconds=seconds,
        kinds=tuple(type(ask.job).__name__ for ask in batch),
    )
