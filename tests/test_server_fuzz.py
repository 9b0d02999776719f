"""A hostile client against a real `wanspec serve` on the tiny models, over loopback.

A seeded generator opens hundreds of connections and sends thousands of frames: random bytes,
valid sessions with bytes flipped, frames cut or repeated, and valid handshakes followed by absurd
messages (p(x) = 0, ids past the vocabulary, drafts queued behind a draft in verification that
are themselves bad, distributions of the wrong width, candidate requests out of turn, hidden
states of the wrong width, absurd settings, empty and overlong prompts, kilobytes of method
name). Every answer must blame the peer (never INTERNAL), the server must log no traceback, its
memory must stay bounded, and a good client must get the very tokens it gets on a quiet server.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wanspec
from nethelpers import run
from wanspec import wire
from wanspec.net.background import BackgroundLoop
from wanspec.net.client import RemotePair, generate_async
from wanspec.net.framing import ConnectionClosed, read_message
from wanspec.net.server import CloudServer, ServerLimits
from wanspec.protocols.base import PROTOCOL_VERSION, ErrorCode
from wanspec.protocols.registry import edge_fingerprints
from wanspec.protocols.settings import GenerationSettings

SEED = 20261201
SESSIONS = 480  # hostile connections
AT_ONCE = 6  # of them open together (the server holds 8 sessions)
PROMPT = "hello world"
LIMITS = ServerLimits(
    max_sessions=8,
    handshake_timeout_s=2.0,
    idle_timeout_s=1.0,
    request_timeout_s=30.0,
    write_timeout_s=2.0,
    max_new_tokens=64,
    linger_s=0.2,
    resume_grace_s=1.0,
)
METHODS = ("naive", "ul", "xcosd", "xcosd-e", "acespec-x", "split", "ar", "gr", "uhlm")


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@pytest.fixture(scope="module")
def server(pair: wanspec.Pair) -> Iterator[CloudServer]:
    with BackgroundLoop("wanspec-cloud") as loop:
        cloud = CloudServer(pair.target, pair.cloud_info, port=0, limits=LIMITS)
        loop.run(cloud.start())
        try:
            yield cloud
        finally:
            loop.run(cloud.stop(), 30)


def _frames(*messages: Any) -> bytes:
    return b"".join(wire.encode(m) for m in messages)


class Hostile:
    """The seeded generator of hostile sessions: `next()` is (kind, bytes to send, frames)."""

    def __init__(self, pair: wanspec.Pair, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.width = pair.alignment.target_width
        fp = edge_fingerprints(pair.alignment, pair.target.fingerprint)
        self.fingerprints = {
            "target_model": fp.target_model,
            "target_tokenizer": fp.target_tokenizer,
            "draft_tokenizer": fp.draft_tokenizer,
        }
        self.kinds: list[tuple[str, Callable[[], list[Any] | bytes]]] = [
            ("random bytes", self.garbage),
            ("mutated session", self.mutated),
            *((f"absurd: {name}", absurd) for name, absurd in self.absurd().items()),
        ]

    def hello(self, method: str | None = None) -> wire.Hello:
        method = method or METHODS[int(self.rng.integers(len(METHODS)))]
        return wire.Hello(PROTOCOL_VERSION, "edge", method, **self.fingerprints)

    def start(self, **settings: Any) -> wire.StartRequest:
        return wire.StartRequest(0, PROMPT, {"max_new_tokens": 8, "gamma": 2, **settings})

    def ids(self, n: int) -> tuple[int, ...]:
        return tuple(int(i) for i in self.rng.integers(0, self.width, n))

    def draft(self, round_: int = 0, n: int = 2, **changes: Any) -> wire.Draft:
        fields = {
            "tokens": self.ids(n),
            "probs": tuple(int(p) for p in self.rng.integers(1, 65536, n)),
        }
        return wire.Draft(round_, 0, **{**fields, **changes})

    def valid(self) -> list[Any]:
        return [self.hello(), self.start(), self.draft()]

    def garbage(self) -> bytes:
        return self.rng.bytes(int(self.rng.integers(1, 2048)))

    def mutated(self) -> bytes:
        frames = [wire.encode(m) for m in self.valid()]
        if self.rng.random() < 0.3:  # a frame repeated or two swapped
            i = int(self.rng.integers(len(frames)))
            frames.insert(i, frames[i]) if self.rng.random() < 0.5 else frames.reverse()
        data = bytearray(b"".join(frames))
        for _ in range(int(self.rng.integers(1, 4))):
            data[int(self.rng.integers(len(data)))] = int(self.rng.integers(256))
        if self.rng.random() < 0.3:
            del data[int(self.rng.integers(1, len(data))) :]
        return bytes(data)

    def absurd(self) -> dict[str, Callable[[], list[Any]]]:
        """Valid handshakes, then one kind of absurd message or setting each."""
        w = self.width
        hidden = np.zeros((1, 3), dtype=np.float16)
        wrong = np.zeros(w + 3, dtype=np.int64)
        wrong[-1] = 65535  # all of p̃ on an id the target does not have
        dists = (wire.Dist.from_dense(wrong),)
        return {
            "p(x) = 0": lambda: [self.hello(), self.start(), self.draft(probs=(0, 0))],
            "no probs": lambda: [self.hello(), self.start(), self.draft(probs=())],
            "id past the vocabulary": lambda: [
                self.hello(), self.start(), self.draft(tokens=(w + 7, 1)),
            ],
            "queued draft without probs": lambda: [
                self.hello("naive"), self.start(), self.draft(), self.draft(1, probs=()),
            ],
            "queued draft of the wrong width": lambda: [
                self.hello("ul"), self.start(), self.draft(),
                wire.DraftWithDists(1, tokens=(1,), width=w + 3, dist_positions=(0,), dists=dists),
            ],
            "far future round": lambda: [self.hello(), self.start(), self.draft(10**9)],
            "candidate requests out of turn": lambda: [
                self.hello("xcosd-e"), self.start(srdv_m=1, srdv_k=4), self.draft(),
                *(wire.CandidatesRequest(0, 4) for _ in range(40)),
            ],
            "hidden states of the wrong width": lambda: [
                self.hello("split"), self.start(), wire.HiddenStates(0, hidden),
            ],
            "empty prompt": lambda: [self.hello(), wire.StartRequest(0, "", {}), self.draft()],
            "overlong prompt": lambda: [self.hello(), wire.StartRequest(0, "hello " * 3000, {})],
            "absurd settings": lambda: [
                self.hello(),
                self.start(**[{"srdv_k": 10**9}, {"gamma": 0}, {"stop": ["x"] * 1000},
                              {"temperature": "hot"}, {"seed": 2**70}, {"tree_budget": -3},
                              {"max_new_tokens": 10**8}][int(self.rng.integers(7))]),
            ],
            "kilobytes of method name": lambda: [
                wire.Hello(PROTOCOL_VERSION, "edge", "m" * 4000 + str(self.rng.integers(1e9)),
                           **self.fingerprints), self.start(),
            ],
            "unknown session resumed": lambda: [wire.Resume("no-such-session", 3, 2)],
        }  # fmt: skip

    def next(self) -> tuple[str, bytes, int]:
        kind, make = self.kinds[int(self.rng.integers(len(self.kinds)))]
        made = make()
        if isinstance(made, bytes):
            return kind, made, max(1, len(made) // 64)
        return kind, _frames(*made), len(made)


async def _answer(address: tuple[str, int], data: bytes) -> str:
    """Send `data`, half-close, read until an Error (its code's name), the end ("closed") or
    10 s of silence ("silent")."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(data)
        writer.write_eof()
        while True:
            msg = await asyncio.wait_for(read_message(reader), 10.0)
            if isinstance(msg, wire.Error):
                return ErrorCode(msg.code).name
    except (ConnectionClosed, ConnectionError):
        return "closed"
    except TimeoutError:
        return "silent"
    finally:
        writer.close()


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_hostile_sessions_are_blamed_on_the_peer_and_a_good_client_keeps_its_tokens(
    pair: wanspec.Pair, server: CloudServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = GenerationSettings(max_new_tokens=16, temperature=0.8, seed=5)
    edge = RemotePair.of_pair(pair)
    address = "{}:{}".format(*server.address)
    quiet = run(generate_async(edge, PROMPT, "xcosd-e", settings, address), 60).tokens
    hostile = Hostile(pair, SEED)
    outcomes: dict[str, Counter] = {}
    frames = 0

    async def burst() -> list[int]:
        nonlocal frames
        good = asyncio.create_task(generate_async(edge, PROMPT, "xcosd-e", settings, address))
        for _ in range(SESSIONS // AT_ONCE):
            batch = [hostile.next() for _ in range(AT_ONCE)]
            frames += sum(n for _, _, n in batch)
            answers = await asyncio.gather(*(_answer(server.address, d) for _, d, _ in batch))
            for (kind, _, _), answer in zip(batch, answers, strict=True):
                outcomes.setdefault(kind, Counter())[answer] += 1
        return (await good).tokens

    rss_before = _rss_mb()
    with caplog.at_level(logging.WARNING, logger="wanspec"):
        during = run(burst(), timeout_s=600)
    after = run(generate_async(edge, PROMPT, "xcosd-e", settings, address), 60).tokens
    internal = {kind: n for kind, n in outcomes.items() if n["INTERNAL"] or n["silent"]}
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    report = {kind: dict(n) for kind, n in sorted(outcomes.items())}
    print(f"{frames} frames over {SESSIONS} sessions: {report}")
    assert not internal, report
    assert not tracebacks, tracebacks[:3]
    assert frames >= 2000 and len(outcomes) >= 10, (frames, report)
    assert during == quiet and after == quiet
    assert _rss_mb() - rss_before < 300, (rss_before, _rss_mb())
    assert not any(r.outcome.startswith("internal") for r in server.records), report
