"""Split inference baseline: the edge holds the target's first layers, activations travel up.

The split point is k = 0: the edge computes the target's input embeddings (the activations
entering layer 0) and sends them as float16, one row per token; the cloud runs every layer from
those activations, samples, and streams the token down, which the edge embeds and sends up
again. The uplink cost per token (hidden_size × 16 bits) is the same at any split point, since
every layer's activations have the hidden size; a deeper split would only move compute to the
edge. Not lossless: the cloud computes on float16-rounded activations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from wanspec import wire
from wanspec.protocols.base import (
    Action,
    Compute,
    ComputeCost,
    ComputeDone,
    Event,
    Finish,
    MessageReceived,
    Send,
    Start,
)
from wanspec.protocols.runner import target_counts
from wanspec.protocols.settings import GenerationSettings
from wanspec.protocols.stopping import StopChecker, emit_tokens
from wanspec.sampling import sample
from wanspec.vocab import VocabAlignment


class SplitEdge:
    side = "edge"

    def __init__(
        self,
        *,
        prompt_ids: Sequence[int],
        embed: Callable[[list[int]], torch.Tensor],
        settings: GenerationSettings,
        stopper: StopChecker,
    ) -> None:
        self.prompt_ids, self.embed = list(prompt_ids), embed
        self.settings, self.stopper = settings, stopper
        self.round = 0
        self.counters: dict[str, int] = {}
        self.accepted_per_round: list[int] = []

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Start):
            # The prompt never leaves the edge as text: only its activations travel.
            start = wire.StartRequest(0, "", self.settings.to_dict())
            return [Send(start), self._embed(self.prompt_ids)]
        if isinstance(event, ComputeDone):
            data = event.result.numpy().astype(np.float16)
            self.round += 1
            return [Send(wire.HiddenStates(self.round, data))]
        if isinstance(event, MessageReceived) and isinstance(event.msg, wire.Tokens):
            actions, done = emit_tokens(self.stopper, event.msg.ids)
            if done:
                return actions
            if event.msg.finished:
                return [*actions, Finish("cloud finished")]
            return [*actions, self._embed(list(event.msg.ids[-1:]))]
        if isinstance(event, MessageReceived) and isinstance(event.msg, wire.Error):
            return [Finish(f"error: cloud says {event.msg.message}")]
        return []

    def _embed(self, ids: list[int]) -> Compute:
        return Compute("embed", ComputeCost("cpu", n=len(ids)), lambda: self.embed(ids))


class SplitCloud:
    side = "cloud"

    def __init__(
        self, *, target_lm: Any, alignment: VocabAlignment, eos_ids: tuple[int, ...]
    ) -> None:
        if not hasattr(target_lm, "extend_embeddings"):
            raise ValueError("split inference needs a target model that accepts activations")
        self.lm, self.alignment, self.eos_ids = target_lm, alignment, eos_ids
        self.settings: GenerationSettings | None = None
        self.produced = 0
        self.counters: dict[str, int] = {}

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, MessageReceived):
            return self._on_message(event.msg)
        if isinstance(event, ComputeDone) and self.settings is not None:
            token = sample(event.result, self.rng)
            self.produced += 1
            done = self.produced >= self.settings.max_new_tokens or token in self.eos_ids
            return [Send(wire.Tokens((token,), finished=done))] + ([Finish("done")] if done else [])
        return []

    def _on_message(self, msg: Any) -> list[Action]:
        if isinstance(msg, wire.StartRequest):
            self.settings = GenerationSettings.from_dict(msg.settings)
            self.rng = np.random.default_rng([self.settings.seed, 1])
            self.lm.reset()
            return []
        if isinstance(msg, wire.HiddenStates) and self.settings is not None:
            rows = torch.from_numpy(msg.data.astype(np.float32))
            cost = ComputeCost("forward", n=rows.shape[0], context=self.lm.length)
            valid, params = self.alignment.target_valid, self.settings.sampling
            return [
                Compute(
                    "forward",
                    cost,
                    lambda: target_counts(self.lm.extend_embeddings(rows)[-1], params, valid),
                )
            ]
        if isinstance(msg, wire.Close):
            return [Finish("closed by edge")]
        return [Send(wire.Error(1, f"unexpected {type(msg).__name__}"))]
