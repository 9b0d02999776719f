"""Methods where the cloud streams every token down: cloud-only autoregressive (`ar`) and split
inference (`split`). One edge and one cloud skeleton serve both; they differ only in what goes up
(the prompt once, or activations per token) and so in what the cloud waits for before a step.

Split inference splits at k = 0: the edge computes the target's input embeddings (the activations
entering layer 0) and sends them as float16, one row per token; the cloud runs every layer from
those activations. The uplink per token (hidden size × 16 bits) is the same at any split point,
since every layer's activations have the hidden size; a deeper split only moves compute to the
edge. Not lossless: the cloud computes on float16-rounded activations.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.jobs import Embed, ForwardEmbeddings
from wanspec.protocols.base import (
    Action,
    ErrorCode,
    Machine,
    ProtocolError,
    Purpose,
    Send,
    request_rng,
)
from wanspec.protocols.cache import CacheMirror
from wanspec.protocols.endpoints import EdgeMachine, TargetInfo
from wanspec.protocols.settings import GenerationSettings
from wanspec.sampling import pick


class StreamState(enum.Enum):
    OPENING = enum.auto()  # the edge: Hello and request sent, the cloud's HelloAck not yet in
    AWAIT_PROMPT = enum.auto()  # the split cloud: the prompt's activations not yet in
    STREAMING = enum.auto()
    DONE = enum.auto()


# ============================================================================ edges


class StreamEdge(EdgeMachine):
    """Receives streamed tokens and emits them; `after_tokens` says what goes up next."""

    EXPECTS = {  # noqa: RUF012
        StreamState.OPENING: (wire.HelloAck,),
        StreamState.STREAMING: (wire.Tokens,),
    }
    OPENING = {StreamState.STREAMING: StreamState.OPENING}  # noqa: RUF012

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(StreamState.OPENING, **kwargs)

    def on_start(self) -> list[Action]:
        return self.hello()

    def on_reply(self, msg: wire.Tokens) -> list[Action]:
        actions, done = self.emit(msg.ids)
        if done:
            return actions
        if msg.finished:
            return [*actions, *self.finish("cloud finished")]
        return [*actions, *self.after_tokens(list(msg.ids))]

    def after_tokens(self, ids: list[int]) -> list[Action]:
        return []


class ArEdge(StreamEdge):
    """Sends the prompt, then only listens."""


class SplitEdge(StreamEdge):
    """Holds the target's embedding layer: the prompt never leaves as text, only activations."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rounds = 0

    def on_start(self) -> list[Action]:
        return [
            *self.hello(prompt=""),
            self.compute(Purpose.EMBED, Embed(tuple(self.prompt_ids))),
        ]

    def on_compute(self, purpose: Purpose, result: Any) -> list[Action]:
        data = np.asarray(result, dtype=np.float32).astype(np.float16)
        self.rounds += 1
        return [Send(wire.HiddenStates(self.rounds, data))]

    def after_tokens(self, ids: list[int]) -> list[Action]:
        return [self.compute(Purpose.EMBED, Embed(tuple(ids[-1:])))]


# ============================================================================ clouds


class StreamCloud(Machine):
    """Samples the target one token at a time and streams each token as soon as it exists."""

    side = "cloud"

    def __init__(
        self, target: TargetInfo, settings: GenerationSettings, state: StreamState
    ) -> None:
        super().__init__(state)
        self.target, self.settings = target, settings
        self.rng = request_rng(settings.seed, "cloud")
        self.eos = () if settings.ignore_eos else target.eos_token_ids
        self.produced = 0

    def on_compute(self, purpose: Purpose, result: Any) -> list[Action]:
        valid = self.target.vocab.target_valid
        q = result.target_probs(len(result) - 1, self.settings.sampling, valid, self.seen_ids())
        token = pick(q, self.rng)  # the float q itself: nothing travels, nothing is rounded
        self.produced += 1
        done = self.produced >= self.settings.max_new_tokens or token in self.eos
        if done:
            return [Send(wire.Tokens((token,), finished=True)), *self.finish("done")]
        return [Send(wire.Tokens((token,))), *self.next_step(token)]

    def next_step(self, token: int) -> list[Action]:
        raise NotImplementedError

    def seen_ids(self) -> list[int] | None:
        """The target ids before the next position, for a repetition penalty."""
        return None


class ArCloud(StreamCloud):
    EXPECTS = {StreamState.STREAMING: (wire.Close,)}  # noqa: RUF012

    def __init__(self, target: TargetInfo, settings: GenerationSettings, prompt: str) -> None:
        super().__init__(target, settings, StreamState.STREAMING)
        self.context = target.encode(prompt)
        self.cache_tokens = target.admit(len(self.context), settings.max_new_tokens)
        self.cache = CacheMirror()

    def on_start(self) -> list[Action]:
        return [self.compute(Purpose.FORWARD, self.cache.plan(self.context))]

    def on_message(self, msg: Any) -> list[Action]:
        return self.finish("closed by edge")

    def seen_ids(self) -> list[int] | None:
        return self.context

    def next_step(self, token: int) -> list[Action]:
        self.context.append(token)
        return [self.compute(Purpose.FORWARD, self.cache.plan(self.context))]


class SplitCloud(StreamCloud):
    """Runs every layer on the activations the edge sends. The cloud never sees the prompt's
    ids, so the prompt is checked when its activations arrive: their width, and that the prompt
    (their rows) leaves room in the context for the tokens asked for."""

    EXPECTS = {  # noqa: RUF012
        StreamState.AWAIT_PROMPT: (wire.HiddenStates, wire.Close),
        StreamState.STREAMING: (wire.HiddenStates, wire.Close),
    }

    def __init__(self, target: TargetInfo, settings: GenerationSettings) -> None:
        if not target.accepts_activations:
            raise ValueError("split inference needs a target model that accepts activations")
        if settings.sampling.needs_context:
            raise ValueError(
                "split inference cannot apply a repetition penalty: the cloud never sees the "
                "prompt's token ids, only activations"
            )
        super().__init__(target, settings, StreamState.AWAIT_PROMPT)
        self.length = 0

    def on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.Close):
            return self.finish("closed by edge")
        data = np.asarray(msg.data)
        self._check_shape(data)
        rows = int(data.shape[0])
        if self.state == StreamState.AWAIT_PROMPT:  # the prompt's: admitted, then streamed
            self.cache_tokens = self.target.admit(rows, self.settings.max_new_tokens)
            self.state = StreamState.STREAMING
        else:
            self._check_room(rows)
        job = ForwardEmbeddings(self.length, data)
        self.length += rows
        return [self.compute(Purpose.FORWARD, job)]

    def _check_shape(self, data: np.ndarray) -> None:
        hidden = self.target.hidden_size
        width = f"[n, {hidden}]" if hidden is not None else "[n, hidden size]"
        if data.ndim != 2 or data.shape[0] < 1 or (hidden is not None and data.shape[1] != hidden):
            raise ProtocolError(f"activations must be {width} with n >= 1, got {data.shape}")

    def _check_room(self, rows: int) -> None:
        """A step's activations must fit in the context after those before them."""
        context = self.target.context_length
        if context is not None and self.length + rows > context:
            raise ProtocolError(
                f"{rows} more activation rows after {self.length} exceed the target's context "
                f"of {context} tokens",
                ErrorCode.LIMIT,
            )

    def next_step(self, token: int) -> list[Action]:
        return []
