"""A machine's picture of its model session's KV cache, so it can ask for the least work.

The machine says which token sequence the model should have seen; the mirror plans a `Forward`
job that keeps the longest common prefix of what is (or will be, once queued jobs run) in the
cache and feeds the rest, always at least `rows` tokens so their logits come back. Planning
updates the picture at once, so a job queued behind another one is planned (and priced) exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanspec.jobs import Forward


class CacheMirror:
    def __init__(self) -> None:
        self._planned: list[int] = []

    @property
    def tokens(self) -> tuple[int, ...]:
        """The sequence the session will hold once every planned job has run."""
        return tuple(self._planned)

    def plan(self, desired: Sequence[int], rows: int = 1) -> Forward:
        """The job that makes the session hold `desired`, returning its last `rows` logits."""
        if rows < 1 or len(desired) < rows:
            raise ValueError(f"need at least {rows} token(s) to get {rows} row(s) of logits")
        keep = 0
        limit = min(len(self._planned), len(desired) - rows)
        while keep < limit and self._planned[keep] == desired[keep]:
            keep += 1
        self._planned = [int(t) for t in desired]
        return Forward(keep, tuple(self._planned[keep:]), rows)

    def forget_after(self, length: int) -> None:
        """Stop assuming anything past `length` tokens (a cancelled job may not have run)."""
        del self._planned[length:]

    def assume(self, tokens: list[int]) -> None:
        """The session holds `tokens` once the queued jobs have run (e.g. a kept tree path)."""
        self._planned = [int(t) for t in tokens]
