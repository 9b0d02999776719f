"""Model jobs computed once and replayed: runs that ask a model for the same work share it.

A benchmark sweep runs cells that differ only in the link or the compute profiles. Those change
the virtual clock, not the tokens, so the runs send the same jobs to their models again and
again. Starting from a fresh session, the jobs run so far determine the session's KV cache, so a
job's result is a function of (model, every job before it, the job): a trie per model holds
those results, one node per job sequence, its children keyed by the next job.

`replaying_executor(model, store)` walks that trie. While the next job is a known child it hands
back the stored result without touching the model, and remembers the jobs it replayed; at the
first unknown job it first runs every remembered job on its real session, in order (the same
jobs, so the cache is bit-identical to a run without the store: one prefill in their place would
round differently), then runs the new job and stores its result. Results therefore equal an
uncached run's bit for bit; only the wall time differs, which is why `wanspec.generate` refuses a
store together with a profile that charges wall time.

Memory: stored results are logits rows, hundreds of kilobytes each for a large vocabulary. Past
`max_bytes` the store forgets what the least recently started runs used (see `JobReplay`).
One thread at a time: the simulator calls executors in turn.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wanspec.jobs import Job

DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB of stored results


class _Node:
    """One job sequence on one model: the result of its last job and the jobs that followed."""

    __slots__ = ("alive", "children", "key", "nbytes", "parent", "result", "stamp")

    def __init__(self, parent: _Node | None, key: Hashable, result: Any, stamp: int) -> None:
        self.parent = parent
        self.key = key
        self.result = result
        self.nbytes = _nbytes(result)
        self.children: dict[Hashable, _Node] = {}
        self.stamp = stamp  # the newest run that reached this node
        self.alive = True


class JobReplay:
    """Job results shared by the runs of one process (e.g. one sweep), a trie per model.

    Eviction: each executor takes a stamp when it is made; a node keeps the newest stamp that
    reached it, so a node's stamp is never below its descendants'. Past `max_bytes` (counted from
    the stored tensors) the nodes of the oldest stamp go first, with their subtrees: the store
    forgets the runs least recently started, whole paths at a time, and keeps what the runs just
    before (a sweep's neighbouring cells) used. An executor whose path was evicted runs the rest
    of its jobs on its own session.

    The store keeps the models it has seen alive. Counters (`counters()`): jobs run on a model
    (`passes_run`, catch-up included), answered from the store (`passes_replayed`), re-run to
    bring a session up to date (`passes_caught_up`), nodes evicted (`evicted`).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.passes_run = 0
        self.passes_replayed = 0
        self.passes_caught_up = 0
        self.evicted = 0
        self._roots: dict[int, tuple[Any, _Node]] = {}  # id(model) -> (model, root)
        self._stamps = 0
        self._by_stamp: dict[int, dict[_Node, None]] = {}

    def counters(self) -> dict[str, int]:
        return {
            "passes_run": self.passes_run,
            "passes_replayed": self.passes_replayed,
            "passes_caught_up": self.passes_caught_up,
            "evicted": self.evicted,
            "stored_bytes": self.nbytes,
        }

    def __len__(self) -> int:
        """Stored results (nodes), roots excluded."""
        return sum(len(nodes) for nodes in self._by_stamp.values())

    def _root(self, model: Any) -> _Node:
        entry = self._roots.get(id(model))
        if entry is None:  # the model is kept with its root, so its id stays its own
            entry = self._roots[id(model)] = (model, _Node(None, None, None, 0))
        return entry[1]

    def _new_stamp(self) -> int:
        self._stamps += 1
        return self._stamps

    def _touch(self, node: _Node, stamp: int) -> None:
        if stamp > node.stamp:
            old = self._by_stamp[node.stamp]
            del old[node]
            if not old:
                del self._by_stamp[node.stamp]
            node.stamp = stamp
            self._by_stamp.setdefault(stamp, {})[node] = None

    def _add(self, parent: _Node, key: Hashable, result: Any, stamp: int) -> _Node:
        node = _Node(parent, key, _copy(result), stamp)
        parent.children[key] = node
        self._by_stamp.setdefault(stamp, {})[node] = None
        self.nbytes += node.nbytes
        while self.nbytes > self.max_bytes and self._by_stamp:
            self._evict_stamp(min(self._by_stamp))
        return node

    def _evict_stamp(self, stamp: int) -> None:
        for node in list(self._by_stamp.get(stamp, ())):
            if node.alive:
                assert node.parent is not None
                del node.parent.children[node.key]
                self._drop(node)
        self._by_stamp.pop(stamp, None)

    def _drop(self, node: _Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            n.alive = False
            self.nbytes -= n.nbytes
            self.evicted += 1
            bucket = self._by_stamp.get(n.stamp)
            if bucket is not None:
                bucket.pop(n, None)
                if not bucket:
                    del self._by_stamp[n.stamp]
            stack.extend(n.children.values())
            n.children, n.result = {}, None


def job_key(job: Job) -> Hashable:
    """A hashable key equal for equal jobs. The jobs are frozen dataclasses compared by value,
    except `ForwardEmbeddings`, whose activation rows are keyed by shape, dtype and a digest."""
    from wanspec.jobs import ForwardEmbeddings

    if isinstance(job, ForwardEmbeddings):
        import numpy as np

        rows = np.ascontiguousarray(job.rows)
        digest = hashlib.sha256(rows.tobytes()).hexdigest()
        return ("ForwardEmbeddings", job.keep, rows.shape, rows.dtype.str, digest)
    return job


def replaying_executor(model: Any, store: JobReplay) -> Callable[[Job], Any]:
    """An executor like `session_executor(model)` whose results come from `store` where an
    earlier run of the same jobs left them (see the module docstring)."""
    return _Replayer(model, store)


class _Replayer:
    def __init__(self, model: Any, store: JobReplay) -> None:
        self.model = model
        self.store = store
        self.stamp = store._new_stamp()
        self.node: _Node | None = store._root(model)  # None: detached, the store no longer used
        self.behind: deque[Job] = deque()  # replayed jobs the real session has not run yet
        self.session: Any = None  # made on the first real job

    def __call__(self, job: Job) -> Any:
        node, store = self.node, self.store
        if node is None or not node.alive:
            self.node = None
            return self._run_real(job)
        key = job_key(job)
        child = node.children.get(key)
        if child is not None:
            store._touch(child, self.stamp)
            self.behind.append(job)
            self.node = child
            store.passes_replayed += 1
            return _copy(child.result)
        self.node = None  # stays detached if the job raises: its result must not be stored
        result = self._run_real(job)
        if node.alive:
            self.node = store._add(node, key, result, self.stamp)
        return result

    def _run_real(self, job: Job) -> Any:
        """Catch the real session up on the replayed jobs, then run `job` on it."""
        from wanspec.models.jobs import run_job

        if self.session is None:
            self.session = self.model.new_session()
        while self.behind:
            run_job(self.session, self.behind.popleft())
            self.store.passes_run += 1
            self.store.passes_caught_up += 1
        result = run_job(self.session, job)
        self.store.passes_run += 1
        return result


def _copy(result: Any) -> Any:
    """A copy of a job result of its own (a tensor, an array, or None), so that a caller
    changing what it was handed cannot change the store. An inference-mode tensor (what a
    model's pass returns) is copied as one, so a replay hands back what the pass did."""
    if result is None:
        return None
    if getattr(result, "is_inference", lambda: False)():
        import torch

        with torch.inference_mode():
            return result.clone()
    clone = getattr(result, "clone", None) or getattr(result, "copy", None)
    if clone is None:
        raise TypeError(f"cannot store a job result of type {type(result).__name__}")
    return clone()


def _nbytes(result: Any) -> int:
    return int(getattr(result, "nbytes", 0) or 0) if result is not None else 0
