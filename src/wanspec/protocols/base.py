"""Events and actions of the sans-IO protocol layer.

State machines never touch a socket or a clock: drivers feed them events and carry out the
actions they return. Events and actions are plain data (frozen dataclasses).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Side = Literal["edge", "cloud"]


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Start:
    """The driver starts the request (edge: begin; cloud: ready to receive)."""


@dataclass(frozen=True)
class MessageReceived:
    msg: Any


@dataclass(frozen=True)
class ComputeDone:
    tag: str
    result: Any = None


Event = Start | MessageReceived | ComputeDone


# ----------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class ComputeCost:
    """What a computation costs, for drivers that charge virtual time.

    kind: "forward" (n new tokens after a cache of `context` tokens), "tree" (n tree nodes in one
    pass), "cpu" (protocol-side arithmetic, charged as free unless a profile says otherwise).
    """

    kind: Literal["forward", "tree", "cpu"]
    n: int = 0
    context: int = 0
    passes: int = 1  # sequential forward passes of `n` tokens each (e.g. drafting gamma tokens)


@dataclass(frozen=True)
class Send:
    msg: Any


@dataclass(frozen=True)
class Compute:
    tag: str
    cost: ComputeCost
    run: Callable[[], Any] = field(compare=False)


@dataclass(frozen=True)
class Emit:
    """Tokens finalised for the user (target vocabulary ids), in order."""

    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Finish:
    reason: str  # "length", "eos", "stop", "error: ..."


Action = Send | Compute | Emit | Finish


class StateMachine(Protocol):
    side: Side

    def handle(self, event: Event) -> list[Action]: ...
