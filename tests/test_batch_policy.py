"""The one batching policy (`wanspec.models.batch_policy`) and its two users: the server's model
thread (`wanspec.net.batching.ModelBatcher`) and the simulator's shared accelerator
(`wanspec.sim.simulate_many`) pick the same passes from the same queue, pass after pass, long
prefills in pieces included."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from wanspec.jobs import Forward, Job, KeepTreePath
from wanspec.models.batch_policy import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PREFILL_CHUNK,
    QueuedJob,
    next_pass,
    padded_tokens,
    prefill_pieces,
)
from wanspec.net.batching import ModelBatcher, _Ask, take_batch
from wanspec.protocols.base import Compute, ComputeDone, Finish, MessageReceived, Send, Start
from wanspec.sim import EdgeSession, Link, load_profile, simulate_many

F, N = True, False  # a `Forward` (can share a pass), anything else


def _q(*jobs: tuple[int, bool]) -> list[QueuedJob]:
    return [QueuedJob(n, batchable) for n, batchable in jobs]


# ============================================================================ the pure policy


def test_the_oldest_runs_alone_when_it_alone_is_over_the_bound() -> None:
    assert next_pass(_q((300, F), (5, F), (5, F)), 256) == [0]


def test_a_job_that_does_not_fit_is_skipped_and_a_later_smaller_one_joins() -> None:
    assert next_pass(_q((5, F), (300, F), (5, F)), 256) == [0, 2]
    assert next_pass(_q((10, F), (10, F), (200, F), (10, F)), 40) == [0, 1, 3]


def test_the_bound_counts_rows_times_the_longest_row_not_the_tokens_sum() -> None:
    # the sum 100 + 100 + 50 = 250 fits 256, but three rows padded to 100 compute 300
    assert next_pass(_q((100, F), (100, F), (50, F)), 256) == [0, 1]
    # a short head, then a long row: 2 × 120 = 240 fits, a third row at 120 would not
    assert next_pass(_q((5, F), (120, F), (5, F)), 256) == [0, 1]
    assert next_pass(_q((64, F), (64, F), (64, F), (64, F), (64, F)), 256) == [0, 1, 2, 3]


def test_bound_zero_runs_one_job_at_a_time() -> None:
    assert next_pass(_q((1, F), (1, F), (1, F)), 0) == [0]


def test_a_job_that_cannot_share_a_pass_runs_alone_and_never_joins() -> None:
    assert next_pass(_q((0, N), (5, F)), 256) == [0]
    assert next_pass(_q((7, N), (5, F)), 256) == [0]  # its tokens do not make it shareable
    assert next_pass(_q((5, F), (0, N), (5, F), (3, N)), 256) == [0, 2]
    assert next_pass(_q((0, F), (5, F)), 256) == [0]  # a Forward of no tokens is no row
    assert next_pass(_q((5, F), (0, F), (5, F)), 256) == [0, 2]
    assert next_pass([], 256) == []


def test_padded_tokens_are_rows_times_the_longest_row() -> None:
    assert padded_tokens([5, 40, 3]) == 120
    assert padded_tokens([7]) == 7
    assert padded_tokens([]) == 0


def test_prefill_pieces_cover_the_tokens_once_in_chunks() -> None:
    assert prefill_pieces(600, 256) == [(0, 256), (256, 512), (512, 600)]
    assert prefill_pieces(512, 256) == [(0, 256), (256, 512)]
    assert prefill_pieces(256, 256) == [(0, 256)]
    assert prefill_pieces(600, 0) == [(0, 600)]
    assert prefill_pieces(0, 256) == [(0, 0)]


def test_the_policy_module_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, wanspec.models.batch_policy; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_server_and_simulator_share_the_defaults() -> None:
    import wanspec.bench.capacity as capacity
    import wanspec.net.batching as batching
    import wanspec.sim.many as many

    assert batching.DEFAULT_MAX_BATCH_TOKENS == DEFAULT_MAX_BATCH_TOKENS == 256
    assert batching.DEFAULT_PREFILL_CHUNK == DEFAULT_PREFILL_CHUNK == 256
    assert many.DEFAULT_MAX_BATCH_TOKENS == capacity.DEFAULT_MAX_BATCH_TOKENS
    assert capacity.CapacitySetup((), (), (), 1).max_batch_tokens == DEFAULT_MAX_BATCH_TOKENS


# ============================================================================ server = simulator


@dataclass(frozen=True)
class Arrival:
    """Session `session` asks for `job`: before the first pass (`during` 0) or while pass
    `during` runs. Arrivals during one pass are asked in list order."""

    session: int
    job: Job
    during: int = 0


def _fwd(n: int, keep: int = 0) -> Forward:
    return Forward(keep, tuple(range(n)), 1)


TREE = KeepTreePath((0,))  # not a Forward: a pass of its own

# The server's defaults: short verify passes, a prompt over the bound (600 tokens: pieces of 256,
# 256, 88), a job that is not a Forward, rows that fit only padded-wise or only skipped-over.
AT_ONCE = [
    Arrival(0, _fwd(5, 40)),
    Arrival(1, _fwd(600)),
    Arrival(2, _fwd(5, 12)),
    Arrival(3, TREE),
    Arrival(4, _fwd(100, 3)),
    Arrival(5, _fwd(100, 3)),
    Arrival(6, _fwd(60, 3)),
    Arrival(7, _fwd(5, 9)),
    Arrival(8, _fwd(10, 9)),
]
AT_ONCE_PASSES = [[0, 2, 6, 7], [1], [3], [4, 5], [8], [1], [1]]

# Bound 128, pieces of 64: two prompts whose pieces share passes, asked (during the tree's pass)
# in the order opposite to their session numbers; a 64-token job asked during their first pass
# queues before their re-queued pieces and takes the older one's place beside it.
STAGGERED = [
    Arrival(0, TREE),
    Arrival(2, _fwd(138), during=1),
    Arrival(1, _fwd(164), during=1),
    Arrival(3, _fwd(64, 5), during=2),
]
STAGGERED_PASSES = [[0], [2, 1], [3, 2], [1, 2], [1]]

SCRIPTS = {
    "defaults": (AT_ONCE, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_PREFILL_CHUNK, AT_ONCE_PASSES),
    "staggered-pieces": (STAGGERED, 128, 64, STAGGERED_PASSES),
}


class _FakeSession:
    """A model session for the server's model thread: it records which pass ran it and, the
    first time a pass runs anything, asks what the script has arrive during that pass."""

    def __init__(self, index: int, script: _ServerScript) -> None:
        self.index, self.script = index, script
        self.length, self.pending_tree_size = 0, 0

    def truncate(self, keep: int) -> None:
        self.length = keep

    def extend(self, tokens: list[int], rows: int) -> torch.Tensor:
        self.script.ran(self.index)
        self.length += len(tokens)
        return torch.zeros(rows, 2)

    def keep_tree_path(self, nodes: list[int], keep_descendants: bool) -> None:
        self.script.ran(self.index)


class _ServerScript:
    def __init__(self, arrivals: list[Arrival], max_batch_tokens: int, chunk: int) -> None:
        self.arrivals = arrivals
        self.sessions = {a.session: _FakeSession(a.session, self) for a in arrivals}
        for a in arrivals:  # fake caches long enough for each job's `keep`
            self.sessions[a.session].length = getattr(a.job, "keep", 0)
        self.batcher = ModelBatcher(max_batch_tokens, prefill_chunk=chunk, waiters=1, observer=self)
        self.done = 0  # passes over
        self.asked: set[int] = set()
        self.futures: list[Any] = []
        self.log: list[tuple[int, int]] = []  # (pass, session)

    def ask_due(self, during: int) -> None:
        if during not in self.asked:
            self.asked.add(during)
            for a in self.arrivals:
                if a.during == during:
                    self.futures.append(self.batcher.ask(self.sessions[a.session], a.job))  # type: ignore[arg-type]

    def ran(self, index: int) -> None:
        self.ask_due(self.done + 1)
        self.log.append((self.done + 1, index))

    def batch_done(self, stats: object) -> None:
        self.done += 1

    def passes(self) -> list[list[int]]:
        try:
            with self.batcher._ready:  # everything of `during` 0 queued before the first pass
                self.ask_due(0)
            deadline = time.monotonic() + 30
            while len(self.futures) < len(self.arrivals) or not all(f.done() for f in self.futures):
                assert time.monotonic() < deadline, f"stuck after passes {self.log}"
                time.sleep(0.005)
            for f in self.futures:
                f.result()
        finally:
            self.batcher.shutdown()
        grouped: dict[int, list[int]] = {}
        for k, index in self.log:
            grouped.setdefault(k, []).append(index)
        return [grouped[k] for k in sorted(grouped)]


PASS_S = 0.01  # every pass on the simulator's flat profile: one job alone or a batch
FLAT = load_profile({"name": "flat", "forward_ms": {"1": 1e3 * PASS_S}, "cpu_ms": 1e3 * PASS_S})


class _OneJobCloud:
    """Asks for one job at its start; tells the edge when it is done."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def handle(self, event: Any) -> list[Any]:
        if isinstance(event, Start):
            return [Compute(0, self.job, "job")]
        return [Send("done")] if isinstance(event, ComputeDone) else []


class _WaitingEdge:
    def handle(self, event: Any) -> list[Any]:
        return [Finish("done")] if isinstance(event, MessageReceived) else []


def _sim_passes(arrivals: list[Arrival], max_batch_tokens: int, chunk: int) -> list[list[int]]:
    """The same script on the simulator: an arrival during pass k starts halfway through it."""
    starts = {}
    for a in arrivals:
        same = [b for b in arrivals if b.during == a.during]
        if a.during == 0:
            starts[a.session] = 0.0  # at one time the sim orders by session: keep them so
            assert [b.session for b in same] == sorted(b.session for b in same)
        else:
            starts[a.session] = (a.during - 0.5) * PASS_S + 1e-4 * same.index(a)
    link, idle = Link(bandwidth_bps=1e9, rtt_s=0.001), (lambda job: None)
    jobs = {a.session: a.job for a in arrivals}
    specs = [
        EdgeSession(_WaitingEdge(), _OneJobCloud(jobs[i]), link, idle, idle, FLAT, starts[i])
        for i in range(len(arrivals))
    ]
    run = simulate_many(
        specs, FLAT, max_batch_tokens=max_batch_tokens, prefill_chunk=chunk, size_fn=lambda _: 8
    )
    assert all(p.start == pytest.approx(k * PASS_S) for k, p in enumerate(run.passes))
    return [list(p.sessions) for p in run.passes]


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_server_and_simulator_pick_the_same_passes_in_the_same_order(script: str) -> None:
    arrivals, max_batch_tokens, chunk, expected = SCRIPTS[script]
    server = _ServerScript(arrivals, max_batch_tokens, chunk).passes()
    simulator = _sim_passes(arrivals, max_batch_tokens, chunk)
    assert server == simulator == expected


def test_take_batch_is_next_pass_over_the_servers_queue() -> None:
    """Pass after pass without pieces: the server's queue type against the pure function."""
    jobs = [a.job for a in AT_ONCE if a.session != 1]
    queue = deque(_Ask(None, job, Future(), 0.0) for job in jobs)  # type: ignore[arg-type]
    number = {id(ask): i for i, ask in enumerate(queue)}
    plain = [ask.queued for ask in queue]
    left = list(range(len(plain)))
    while queue:
        picked = [left[i] for i in next_pass([plain[i] for i in left], 256)]
        assert [number[id(ask)] for ask in take_batch(queue, 256)] == picked
        left = [i for i in left if i not in picked]
    assert left == []
