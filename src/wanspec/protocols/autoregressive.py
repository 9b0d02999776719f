"""Cloud-only autoregressive baseline: the edge sends the prompt, the cloud streams tokens down."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.protocols.base import (
    Action,
    Compute,
    ComputeDone,
    Event,
    Finish,
    MessageReceived,
    Send,
    Start,
)
from wanspec.protocols.runner import ModelRunner, target_counts
from wanspec.protocols.settings import GenerationSettings
from wanspec.protocols.stopping import StopChecker, emit_tokens
from wanspec.sampling import sample
from wanspec.vocab import VocabAlignment


class ArEdge:
    side = "edge"

    def __init__(self, *, prompt: str, settings: GenerationSettings, stopper: StopChecker) -> None:
        self.prompt, self.settings, self.stopper = prompt, settings, stopper
        self.counters: dict[str, int] = {}
        self.accepted_per_round: list[int] = []

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Start):
            return [Send(wire.StartRequest(0, self.prompt, self.settings.to_dict()))]
        if isinstance(event, MessageReceived) and isinstance(event.msg, wire.Tokens):
            actions, done = emit_tokens(self.stopper, event.msg.ids)
            if done:
                return actions
            if event.msg.finished:
                return [*actions, Finish("cloud finished")]
            return actions
        if isinstance(event, MessageReceived) and isinstance(event.msg, wire.Error):
            return [Finish(f"error: cloud says {event.msg.message}")]
        return []


class ArCloud:
    """Samples q̃ one token at a time and streams each token as soon as it exists."""

    side = "cloud"

    def __init__(
        self,
        *,
        target_lm: Any,
        alignment: VocabAlignment,
        encode_prompt: Callable[[str], list[int]],
        eos_ids: tuple[int, ...],
    ) -> None:
        self.runner = ModelRunner(target_lm)
        self.alignment, self.encode_prompt, self.eos_ids = alignment, encode_prompt, eos_ids
        self.context: list[int] = []
        self.settings: GenerationSettings | None = None
        self.produced = 0
        self.closed = False
        self.counters: dict[str, int] = {}

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, MessageReceived):
            msg = event.msg
            if isinstance(msg, wire.StartRequest):
                self.settings = GenerationSettings.from_dict(msg.settings)
                self.rng = np.random.default_rng([self.settings.seed, 1])
                self.context = self.encode_prompt(msg.prompt)
                return [self._step()]
            if isinstance(msg, wire.Close):
                self.closed = True
                return [Finish("closed by edge")]
            return [Send(wire.Error(1, f"unexpected {type(msg).__name__}"))]
        if isinstance(event, ComputeDone) and not self.closed:
            token = sample(event.result, self.rng)
            self.context.append(token)
            self.produced += 1
            done = self.produced >= self.settings.max_new_tokens or (
                token in self.eos_ids and not self.settings.ignore_eos
            )
            if done:
                return [Send(wire.Tokens((token,), finished=True)), Finish("done")]
            return [Send(wire.Tokens((token,))), self._step()]
        return []

    def _step(self) -> Compute:
        plan = self.runner.plan(self.context)
        valid, params = self.alignment.target_valid, self.settings.sampling
        return Compute(
            "forward", plan.cost, lambda: target_counts(self.runner.run(plan)[-1], params, valid)
        )
