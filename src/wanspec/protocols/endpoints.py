"""The two ends of a session: the handshake, and what every edge machine shares.

The edge and the cloud are built apart (they may live in different processes) and share nothing
but encoded messages. The edge opens with `Hello` (protocol version, method, the fingerprints it
expects of the target model and tokenizer, its own draft tokenizer's) and, without waiting, its
`StartRequest` (prompt and settings); the cloud answers `HelloAck` with its fingerprints and the
target's EOS ids, or an `Error` and the end of the session. From the request the cloud learns the
method, the settings, the seed and the stop rules, and builds the method's cloud machine.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from wanspec import wire
from wanspec.protocols.base import (
    PROTOCOL_VERSION,
    Action,
    Emit,
    ErrorCode,
    Machine,
    ProtocolError,
    Send,
    Start,
    shown,
)
from wanspec.protocols.methods import MethodInfo, get_method
from wanspec.protocols.settings import GenerationSettings
from wanspec.protocols.stopping import StopChecker
from wanspec.vocab import VocabAlignment

FINGERPRINT_CHARS = 16  # 64 bits of a sha256: enough to tell models apart, cheap on the wire


def short_fingerprint(fingerprint: str) -> str:
    """The part of a fingerprint that travels in the handshake."""
    return fingerprint[:FINGERPRINT_CHARS]


@dataclass(frozen=True)
class Fingerprints:
    """What the edge expects of the cloud ("" = any target model) and what it runs itself."""

    target_model: str
    target_tokenizer: str
    draft_tokenizer: str


@dataclass(frozen=True)
class TargetInfo:
    """What a cloud knows about its target model; shared by every session, holds no cache.

    `alignments` maps a draft tokenizer's fingerprint to its alignment with the target, for the
    drafts this cloud can verify; methods that need no draft (AR, split) run for any edge.
    `context_length` is the positions the target attends over (None: unknown, e.g. a synthetic
    model), `max_prompt_tokens` this cloud's own cap on a prompt (None: only the context's),
    `hidden_size` the width of the activations split inference sends (None: unknown) and
    `kv_bytes_per_token` what one cached token costs a session (`registry.kv_bytes_per_token`;
    None: unknown).
    """

    name: str
    model_fingerprint: str
    tokenizer_fingerprint: str
    vocab: VocabAlignment  # the target with itself: valid rows, pieces
    eos_token_ids: tuple[int, ...]
    encode: Callable[[str], list[int]]
    alignments: Mapping[str, VocabAlignment] = field(default_factory=dict)
    accepts_activations: bool = False
    context_length: int | None = None
    max_prompt_tokens: int | None = None
    hidden_size: int | None = None
    kv_bytes_per_token: int | None = None

    def admit(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Refuse a request this target cannot serve whole, before any model work on it: an
        empty prompt, one over this cloud's cap, or one that leaves no room in the context for
        the tokens it asks for. Returns the most tokens the session's cache will hold."""
        if prompt_tokens < 1:
            raise ProtocolError(
                "the prompt is empty: the target needs at least one token to condition on",
                ErrorCode.BAD_SETTINGS,
            )
        cap = self.max_prompt_tokens
        if cap is not None and prompt_tokens > cap:
            raise ProtocolError(
                f"the prompt is {prompt_tokens} tokens, over this server's limit of {cap}",
                ErrorCode.LIMIT,
            )
        context = self.context_length
        if context is not None and prompt_tokens + max_new_tokens > context:
            raise ProtocolError(
                f"the prompt's {prompt_tokens} tokens plus max_new_tokens={max_new_tokens} exceed "
                f"the target's context of {context} tokens",
                ErrorCode.LIMIT,
            )
        return prompt_tokens + max_new_tokens


# ============================================================================ the edge side


class EdgeMachine(Machine):
    """Base of every edge machine: opens the session, checks the cloud's answer, emits tokens
    through the request's stop rules, and closes the session when the output is complete.

    The edge works (drafts, embeds, uploads) without waiting for the cloud's `HelloAck`, so each
    state it can reach before the ack has a twin that accepts the ack and nothing else: `OPENING`
    maps a state to its twin, and the ack moves the edge from the twin to the state itself."""

    side = "edge"
    OPENING: ClassVar[dict[Any, Any]] = {}

    def __init__(
        self,
        state: Any,
        *,
        method: str,
        prompt: str,
        settings: GenerationSettings,
        fingerprints: Fingerprints,
        decode: Callable[[list[int]], str],
        prompt_ids: Sequence[int] = (),
        target_tokenizer: Any = None,
        stop_context: Sequence[int] = (),
    ) -> None:
        super().__init__(state)
        self.method, self.prompt, self.settings = method, prompt, settings
        self.fingerprints, self.decode, self.prompt_ids = fingerprints, decode, list(prompt_ids)
        # Stop strings are matched as transformers' StopStringCriteria matches them when the
        # target's tokenizer is at hand, over the prompt's target ids and the output.
        self.target_tokenizer, self.stop_context = target_tokenizer, list(stop_context)
        self.stopper: StopChecker | None = None
        self.accepted_per_round: list[int] = []

    def hello(self, prompt: str | None = None) -> list[Action]:
        fp = self.fingerprints
        hello = wire.Hello(
            PROTOCOL_VERSION,
            "edge",
            self.method,
            fp.target_model,
            fp.target_tokenizer,
            fp.draft_tokenizer,
        )
        text = self.prompt if prompt is None else prompt
        return [Send(hello), Send(wire.StartRequest(0, text, self.settings.to_dict()))]

    def enter(self, state: Any) -> None:
        """Go to `state`, or to its twin while the cloud's HelloAck is not yet in."""
        opening = self.state in self.OPENING.values()
        self.state = self.OPENING[state] if opening else state

    def on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.HelloAck):
            return self.on_hello_ack(msg)
        return self.on_reply(msg)

    def on_hello_ack(self, ack: wire.HelloAck) -> list[Action]:
        fp = self.fingerprints
        if ack.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"cloud speaks protocol {ack.protocol_version}, edge {PROTOCOL_VERSION}",
                ErrorCode.VERSION,
            )
        if ack.target_tokenizer != fp.target_tokenizer:
            raise ProtocolError("the cloud's target tokenizer differs", ErrorCode.MISMATCH)
        if fp.target_model and ack.target_model != fp.target_model:
            raise ProtocolError("the cloud runs a different target model", ErrorCode.MISMATCH)
        eos = () if self.settings.ignore_eos else ack.info.get("eos_token_ids", ())
        if not isinstance(eos, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in eos
        ):
            raise ProtocolError(f"the cloud's eos_token_ids={shown(eos)} are not a list of ids")
        self.stopper = StopChecker(
            max_new_tokens=self.settings.max_new_tokens,
            eos_ids=tuple(eos),
            stop=self.settings.stop,
            decode=self.decode,
            tokenizer=self.target_tokenizer,
            context=self.stop_context,
        )
        opened = {twin: state for state, twin in self.OPENING.items()}
        self.state = opened[self.state]
        return []

    def on_reply(self, msg: Any) -> list[Action]:
        raise NotImplementedError

    def emit(self, tokens: Sequence[int]) -> tuple[list[Action], bool]:
        """Finalise tokens for the user: what the stop rules keep, and whether the output is
        complete (then the session is closed and this side finishes)."""
        assert self.stopper is not None, "tokens before HelloAck"
        kept, reason = self.stopper.push(tokens)
        actions: list[Action] = [Emit(tuple(kept))] if kept else []
        if reason is None:
            return actions, False
        return [*actions, Send(wire.Close("done")), *self.finish(reason)], True


# ============================================================================ the cloud side


class CloudState(enum.Enum):
    AWAIT_HELLO = enum.auto()
    AWAIT_REQUEST = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()


CloudFactory = Callable[[str, TargetInfo, VocabAlignment, GenerationSettings, str], Machine]


class CloudEndpoint(Machine):
    """The machine a cloud driver runs per session: checks the handshake, then builds the
    method's own cloud machine from the request and hands every later event to it."""

    side = "cloud"
    EXPECTS = {  # noqa: RUF012
        CloudState.AWAIT_HELLO: (wire.Hello,),
        CloudState.AWAIT_REQUEST: (wire.StartRequest, wire.Close),
    }

    def __init__(self, target: TargetInfo, factory: CloudFactory) -> None:
        super().__init__(CloudState.AWAIT_HELLO)
        self.target, self.factory = target, factory
        self.method = ""
        self.alignment: VocabAlignment | None = None
        self.inner: Machine | None = None

    def handle(self, event: Any) -> list[Action]:
        """The handshake's events here, every later one the inner machine's, which keeps the
        error policy itself; once this endpoint is done (even failed from outside, by
        `fail`), neither answers."""
        if self.done:
            return []
        if self.state != CloudState.SERVING:
            actions = super().handle(event)  # the handshake; the request makes it SERVING
        else:
            assert self.inner is not None
            actions = self.inner.handle(event)
        if self.state == CloudState.SERVING:
            assert self.inner is not None
            self.cache_tokens = self.inner.cache_tokens  # known once the request is admitted
            if self.inner.done:  # it may have ended as it started
                self.state = CloudState.DONE
        return actions

    def on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.Hello):
            return self._on_hello(msg)
        if isinstance(msg, wire.Close):
            return self.finish("closed by edge")
        return self._on_request(msg)

    def _on_hello(self, hello: wire.Hello) -> list[Action]:
        target = self.target
        if hello.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"edge speaks protocol {hello.protocol_version}, cloud {PROTOCOL_VERSION}",
                ErrorCode.VERSION,
            )
        if hello.target_tokenizer != target.tokenizer_fingerprint:
            raise ProtocolError(
                f"the edge expects target tokenizer {hello.target_tokenizer[:12]}, this cloud "
                f"runs {target.tokenizer_fingerprint[:12]} ({target.name})",
                ErrorCode.MISMATCH,
            )
        if hello.target_model and hello.target_model != target.model_fingerprint:
            raise ProtocolError(
                f"the edge expects target model {hello.target_model[:12]}, this cloud runs "
                f"{target.model_fingerprint[:12]} ({target.name})",
                ErrorCode.MISMATCH,
            )
        try:
            info = get_method(hello.method)
        except ValueError as exc:
            raise ProtocolError(str(exc), ErrorCode.UNSUPPORTED) from exc
        self.method = info.name
        self.alignment = self._alignment_for(info, hello.draft_tokenizer)
        self.state = CloudState.AWAIT_REQUEST
        ack = wire.HelloAck(
            PROTOCOL_VERSION,
            target.model_fingerprint,
            target.tokenizer_fingerprint,
            {
                "eos_token_ids": list(target.eos_token_ids),
                "target": target.name,
                "vocab_width": target.vocab.target_width,  # an edge's alignment needs it
            },
        )
        return [Send(ack)]

    def _alignment_for(self, info: MethodInfo, draft_tokenizer: str) -> VocabAlignment:
        if not info.needs_draft:
            return self.target.vocab
        alignment = self.target.alignments.get(draft_tokenizer)
        if draft_tokenizer == self.target.tokenizer_fingerprint:
            alignment = alignment or self.target.vocab
        if alignment is None:
            raise ProtocolError(
                f"this cloud has no alignment for draft tokenizer {draft_tokenizer[:12]}",
                ErrorCode.MISMATCH,
            )
        if info.shared_vocab_only and not alignment.is_identity:
            raise ProtocolError(
                f"method {info.name!r} needs a shared vocabulary, but the draft and target "
                "tokenizers differ",
                ErrorCode.UNSUPPORTED,
            )
        return alignment

    def _on_request(self, request: wire.StartRequest) -> list[Action]:
        try:
            settings = GenerationSettings.from_dict(dict(request.settings))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad settings: {exc}", ErrorCode.BAD_SETTINGS) from exc
        assert self.alignment is not None
        try:
            inner = self.factory(self.method, self.target, self.alignment, settings, request.prompt)
        except ValueError as exc:
            raise ProtocolError(str(exc), ErrorCode.UNSUPPORTED) from exc
        inner.counters = self.counters
        self.inner = inner
        self.state = CloudState.SERVING
        return inner.handle(Start())
