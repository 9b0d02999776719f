"""When a generation ends: max_new_tokens, an end-of-sequence token, or a stop string."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from wanspec import wire
from wanspec.protocols.base import Action, Emit, Finish, Send


class StopChecker:
    """Accumulates finalised target tokens and cuts the output where the request says to stop.

    The token that completes a stop string and an EOS token are kept (as transformers' generate
    keeps them); anything after is dropped (a prefix of an exact sample is still exact).
    """

    def __init__(
        self,
        *,
        max_new_tokens: int,
        eos_ids: Iterable[int] = (),
        stop: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        if stop and decode is None:
            raise ValueError("stop strings need a decoder")
        self.max_new_tokens = max_new_tokens
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.stop, self.decode = tuple(stop), decode
        self.output: list[int] = []
        self.reason: str | None = None

    def push(self, tokens: Sequence[int]) -> tuple[list[int], str | None]:
        """Tokens actually kept from `tokens`, and the stop reason if the output is complete."""
        if self.reason is not None:
            return [], self.reason
        kept: list[int] = []
        for token in tokens:
            kept.append(int(token))
            self.output.append(int(token))
            self.reason = self._reason(int(token))
            if self.reason is not None:
                break
        return kept, self.reason

    def _reason(self, token: int) -> str | None:
        if token in self.eos_ids:
            return "eos"
        if self.stop and self._hits_stop():
            return "stop"
        if len(self.output) >= self.max_new_tokens:
            return "length"
        return None

    def _hits_stop(self) -> bool:
        text = self.decode(self.output)
        before = self.decode(self.output[:-1])
        return any(s in text and s not in before for s in self.stop)


def emit_tokens(stopper: StopChecker, tokens: Sequence[int]) -> tuple[list[Action], bool]:
    """The edge's one way to finalise tokens: emit what the request keeps and, once the output is
    complete, close the request. Returns the actions and whether the request is over."""
    kept, reason = stopper.push(tokens)
    actions: list[Action] = [Emit(tuple(kept))] if kept else []
    if reason is None:
        return actions, False
    return [*actions, Send(wire.Close("done")), Finish(reason)], True
