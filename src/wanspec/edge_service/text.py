"""From committed target ids to what an OpenAI client reads: chat prompts and streamed text.

Floor 4 helpers of the edge service (no I/O). `chat_prompt` renders a chat with the target
tokenizer's own template; `TextStream` turns batches of committed tokens into text deltas that
join up to exactly the final text, ending before the first stop sequence as OpenAI's API does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


class NoChatTemplate(ValueError):
    """The target tokenizer has no chat template, so chat requests cannot be rendered."""


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The ids of a chat prompt exactly as transformers' `apply_chat_template(messages,
    add_generation_prompt=True, tokenize=True)` gives them with the target's tokenizer."""
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate("the target's tokenizer has no chat template; use /v1/completions")
    rendered = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
    )
    ids = rendered["input_ids"] if isinstance(rendered, Mapping) else rendered
    return [int(t) for t in ids]


def chat_continuation(
    encode: Callable[[str], list[int]], tokenizer: Any, messages: Sequence[Mapping[str, Any]]
) -> tuple[int, ...]:
    """The chat's ids as what follows an empty prompt: `encode("")` (the edge's and the cloud's
    encoder, special tokens on: a BOS or nothing) followed by these is exactly `chat_ids`. The
    ids travel as ids (`RemotePair.continued`, `wire.Resume.prefix`), never as text: rendering
    the template to text and encoding that again is not the same for every tokenizer (a
    Metaspace tokenizer, for one, adds a word marker after the BOS it is asked to drop)."""
    ids = chat_ids(tokenizer, messages)
    lead = encode("")
    if ids[: len(lead)] != lead:
        raise ValueError(
            f"the chat template's ids begin {ids[: len(lead)]}, not with {lead}, which this "
            "tokenizer puts before every prompt"
        )
    return tuple(ids[len(lead) :])


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits, default=None)


def _partial_stop(text: str, stop: Sequence[str]) -> int:
    """Length of the longest end of `text` that a stop sequence begins with."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


class TextStream:
    """The text of the committed tokens, handed out in deltas as tokens arrive.

    A delta holds back what may still change: an incomplete UTF-8 character at the end (the
    tokenizer decodes it as U+FFFD) and an end that may begin a stop sequence. The text ends
    before the first stop sequence; the deltas always join up to `text`."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode, self.stop = decode, tuple(stop)
        self.tokens: list[int] = []
        self.sent = ""
        self.stopped = False  # a stop sequence was found: nothing more is sent

    def push(self, tokens: Sequence[int]) -> str:
        """The new text that `tokens` make final ("" if none yet)."""
        self.tokens.extend(int(t) for t in tokens)
        return self._advance(final=False)

    def finish(self) -> str:
        """Everything not yet sent, once the output is complete."""
        return self._advance(final=True)

    @property
    def text(self) -> str:
        return self.sent

    def _advance(self, final: bool) -> str:
        if self.stopped:
            return ""
        text = self.decode(self.tokens)
        cut = _first_stop(text, self.stop)
        if cut is not None:
            self.stopped = True
            ready = text[:cut]
        elif final:
            ready = text
        else:
            held = _partial_stop(text, self.stop)
            ready = text[: len(text) - held]
            ready = ready.rstrip("\ufffd")
        if not ready.startswith(self.sent) or len(ready) <= len(self.sent):
            return ""
        delta, self.sent = ready[len(self.sent) :], ready
        return delta
