"""When a generation ends: max_new_tokens, an end-of-sequence token, or a stop string.

Stop strings follow transformers' `StopStringCriteria`, so that "stop at S" ends a wanspec run
where `model.generate(stop_strings=S, tokenizer=...)` ends:

- tokens are matched by their vocabulary strings, as the tokenizer's decoder spells them (bytes
  for byte-level and byte-fallback tokenizers), special tokens included: `<|endoftext|>` is a
  valid stop string;
- after each new token, a stop string fires if it occurs in the text of the sequence so far
  (prompt included, so a match may straddle the prompt/output boundary) and that occurrence ends
  inside the new token; only the last `max(len(stop))` tokens are looked at, as transformers does;
- the token completing the match is kept, everything after it is dropped (a prefix of an exact
  sample is still exact).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from wanspec import wire
from wanspec.protocols.base import Action, Emit, Finish, Send

Piece = str | bytes
_PREFIX = "abcdef"  # transformers' static prefix for rendering one token's string


def _decoder_types(node: Any) -> set[str]:
    """Every `type` named anywhere in a tokenizer decoder's JSON."""
    if isinstance(node, dict):
        own = {node["type"]} if isinstance(node.get("type"), str) else set()
        return own.union(*(_decoder_types(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_decoder_types(v) for v in node))
    return set()


def matching_mode(tokenizer: Any) -> str | None:
    """How transformers matches stop strings for this tokenizer: "byte_level", "byte_fallback"
    (both compare UTF-8 bytes) or None (compare str)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return None
    if type(decoder).__name__ == "ByteLevel":
        return "byte_level"
    try:
        types = _decoder_types(json.loads(decoder.__getstate__()))
    except (TypeError, ValueError):
        return None
    if "ByteFallback" in types:
        return "byte_fallback"
    return "byte_level" if "ByteLevel" in types else None


@cache
def _byte_level_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


class TokenPieces:
    """The string each token id stands for when stop strings are matched (cached per id).

    Byte-level pieces map back to their bytes, byte-fallback `<0xNN>` pieces to their byte, and
    any other piece is rendered by the tokenizer's own decoder behind a fixed prefix (so a leading
    space marker turns into the space it means). An id the vocabulary lacks has no piece (None):
    no match can run through it.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.mode = matching_mode(tokenizer)
        base = tokenizer(_PREFIX, add_special_tokens=False)["input_ids"]
        self._base = tokenizer.convert_ids_to_tokens(base)
        self._cache: dict[int, Piece | None] = {}

    @property
    def as_bytes(self) -> bool:
        return self.mode is not None

    def stop_form(self, stop: str) -> Piece:
        """A stop string in the form pieces are compared with."""
        return stop.encode("utf-8") if self.as_bytes else stop

    def __call__(self, token_id: int) -> Piece | None:
        if token_id not in self._cache:
            self._cache[token_id] = self._piece(token_id)
        return self._cache[token_id]

    def _piece(self, token_id: int) -> Piece | None:
        try:
            token = self.tokenizer.convert_ids_to_tokens(token_id)
        except (IndexError, KeyError, OverflowError):  # slow tokenizers raise for unknown ids
            return None
        if token is None:
            return None
        if self.mode == "byte_level":
            decoder = _byte_level_decoder()
            if all(char in decoder for char in token):
                return bytes(decoder[char] for char in token)
        elif self.mode == "byte_fallback" and _is_byte_token(token):
            return bytes([int(token[3:5], 16)])
        text = self.tokenizer.convert_tokens_to_string([*self._base, token])
        text = text[text.index(_PREFIX) + len(_PREFIX) :]
        return text.encode("utf-8") if self.as_bytes else text


def _is_byte_token(token: str) -> bool:
    hexdigits = "0123456789abcdefABCDEF"
    return (
        len(token) == 6
        and token.startswith("<0x")
        and token.endswith(">")
        and all(c in hexdigits for c in token[3:5])
    )


def _ends_in_last(text: Piece, last_start: int, stops: Sequence[Piece]) -> bool:
    """Whether some stop string occurs in `text` ending after `last_start` (inside the text of
    the newest token, which begins there)."""
    return any(text.find(s, max(0, last_start - len(s) + 1)) >= 0 for s in stops)


class StopChecker:
    """Accumulates finalised target tokens and cuts the output where the request says to stop.

    The token that completes a stop string and an EOS token are kept (as transformers' generate
    keeps them); anything after is dropped (a prefix of an exact sample is still exact).

    Stop strings are matched as transformers' `StopStringCriteria` matches them when `tokenizer`
    (the target's transformers tokenizer) is given; `context` is the prompt's target ids, so a
    match may begin in the prompt. With only `decode`, the decoded text is matched instead (an
    approximation: decoders drop special tokens and split multi-byte characters).
    """

    def __init__(
        self,
        *,
        max_new_tokens: int,
        eos_ids: Iterable[int] = (),
        stop: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
        tokenizer: Any = None,
        context: Sequence[int] = (),
    ) -> None:
        if stop and decode is None and tokenizer is None:
            raise ValueError("stop strings need the target's tokenizer (or a decoder)")
        self.max_new_tokens = max_new_tokens
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.stop, self.decode = tuple(stop), decode
        self.pieces = TokenPieces(tokenizer) if (stop and tokenizer is not None) else None
        self._stop_forms = tuple(self.pieces.stop_form(s) for s in self.stop) if self.pieces else ()
        self._window = max((len(s) for s in self._stop_forms), default=0)
        self.context = [int(t) for t in context]
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
        if self.pieces is not None:
            return self._hits_stop_pieces()
        sequence = self.context + self.output
        before = len(self.decode(sequence[:-1]))
        return _ends_in_last(self.decode(sequence), before, self.stop)

    def _hits_stop_pieces(self) -> bool:
        recent = (self.context + self.output)[-self._window :]
        pieces = [self.pieces(t) for t in recent]
        if None in pieces:  # an unknown id ends every match that would run through it
            last_unknown = len(pieces) - 1 - pieces[::-1].index(None)
            pieces = pieces[last_unknown + 1 :]
            if not pieces:
                return False
        text = pieces[0][:0].join(pieces)
        return _ends_in_last(text, len(text) - len(pieces[-1]), self._stop_forms)


def emit_tokens(stopper: StopChecker, tokens: Sequence[int]) -> tuple[list[Action], bool]:
    """The edge's one way to finalise tokens: emit what the request keeps and, once the output is
    complete, close the request. Returns the actions and whether the request is over."""
    kept, reason = stopper.push(tokens)
    actions: list[Action] = [Emit(tuple(kept))] if kept else []
    if reason is None:
        return actions, False
    return [*actions, Send(wire.Close("done")), Finish(reason)], True
