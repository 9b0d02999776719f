"""The edge's side of keeping two tokenizations of one text in step.

The cloud decides target tokens; the edge must extend its draft context with the very same bytes
(LLM-only target tokens arrive as their vocabulary piece). Only the new text is retokenised, and a
token that ends inside a UTF-8 character waits until the character is complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wanspec.vocab.alignment import VocabAlignment


def incomplete_utf8_tail(data: bytes) -> int:
    """Index where a trailing, still incomplete UTF-8 sequence starts (len(data) if none)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        lead = data[end - back]
        if lead & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4
        need = need if 0xC2 <= lead <= 0xF4 else 1
        return end - back if need > back else end
    return end


class DraftRetokenizer:
    """Keeps the draft context byte-identical to the target context, one finalised target token
    at a time (the edge's sync after an LLM-only or resampled token).

    A common token maps straight to its draft id. Anything else is turned into bytes and only the
    NEW text is retokenised with the draft's continuation encoder (no BOS, no dummy prefix,
    leading spaces kept), so draft segmentation may differ from a fresh tokenisation of the whole
    text; the bytes never do, which is all exactness needs (it concerns target tokens only). A
    trailing incomplete UTF-8 sequence waits in `pending` until completed or `flush()`ed.

    A draft vocabulary without byte coverage (no byte-level alphabet, no byte fallback) cannot
    spell everything: unless `strict`, such bytes become its unk token (or are dropped) and are
    counted in `lost_bytes`; the draft then only predicts worse, exactness is untouched.
    """

    def __init__(self, alignment: VocabAlignment, *, strict: bool = False) -> None:
        self.alignment = alignment
        self.strict = strict
        self.lost_bytes = 0
        self._pending = bytearray()
        if not alignment.is_identity:  # one vocabulary never retokenises: nothing to build
            _ = alignment.draft.encoder  # built once per vocabulary, before a round, not in one

    @property
    def pending(self) -> bytes:
        return bytes(self._pending)

    def push(self, target_id: int) -> list[int]:
        """Feed one finalised target token; returns the draft ids that can be appended now."""
        target_id = self.alignment.target.check_id(int(target_id))
        if not self._pending and self.alignment.in_common[target_id]:
            return [int(self.alignment.target_to_draft[target_id])]
        data = self.alignment.target.token_bytes[target_id]
        if data is None:
            raise ValueError(f"target token {target_id} has no byte meaning")
        return self.push_bytes(data)

    def push_piece(self, piece: str) -> list[int]:
        """Feed an LLM-only token as it travels on the wire (its target piece)."""
        return self.push(self.alignment.target_id_from_piece(piece))

    def push_bytes(self, data: bytes) -> list[int]:
        self._pending += data
        cut = incomplete_utf8_tail(bytes(self._pending))
        ready = bytes(self._pending[:cut])
        del self._pending[:cut]
        return self._spelled(ready, self.alignment.draft.encode_bytes) if ready else []

    def flush(self) -> list[int]:
        """Spell any pending incomplete UTF-8 bytes with draft byte tokens now."""
        ready, self._pending = bytes(self._pending), bytearray()
        return self._spelled(ready, self.alignment.draft.encode_raw_bytes) if ready else []

    def _spelled(self, data: bytes, encode: Any) -> list[int]:
        ids = encode(data, strict=self.strict)
        draft = self.alignment.draft
        self.lost_bytes += len(data) - len(draft.bytes_of(i for i in ids if i != draft.unk_id))
        return ids
