"""The edge over a real network: connect to a `wanspec serve` server and generate.

The edge holds the draft model and the TARGET'S TOKENIZER (to align vocabularies and to spell
the output); the target model stays on the server. `load_edge` builds that half of a pair from a
draft and a target tokenizer, learning the target's logits width from the server in a short
handshake (Hello for `ar`, HelloAck, Close: no model work there). A loaded `Pair` works too (its
target is then only used for `split`, whose edge runs the target's embedding layer).

`generate_async` / `generate_remote` run one request: connect (TCP, optionally TLS verified
against the system's or a pinned CA), send the bearer token if one is given, then drive the
method's edge machine with `wanspec.net.driver.drive`, the draft's jobs on a thread of their own.
With `ClientOptions(resume=True)` the session survives dropped connections
(`wanspec.net.resume`); `generate_resumable` also continues on a fresh session, from the
committed tokens, when the server no longer holds the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import secrets
import ssl
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.models.jobs import run_job
from wanspec.models.registry import prompt_encoder
from wanspec.net.driver import DriverLimits, SessionAborted, drive
from wanspec.net.framing import ConnectionClosed, MessageStream, TrafficCounter, write_message
from wanspec.net.resume import EdgeStream, RetryPolicy
from wanspec.net.units import parse_address
from wanspec.protocols.base import PROTOCOL_VERSION, ErrorCode
from wanspec.protocols.endpoints import EdgeMachine
from wanspec.protocols.registry import edge_model_for, make_edge, table_fingerprint
from wanspec.protocols.settings import GenerationSettings
from wanspec.runtime import SimResult
from wanspec.vocab import TokenTable, VocabAlignment

Address = tuple[str, int]
CLOSE_WAIT_S = 2.0  # for a request given up: its Close, and the server's hanging up
NO_ANSWER_HINT = " (before any answer: a TLS server reached without TLS, or not a wanspec server?)"


class RemoteError(RuntimeError):
    """A remote generation did not complete. `code` is the server's `ErrorCode` when the server
    refused or ended the session (BUSY, UNAUTHORIZED, MISMATCH, SHUTDOWN, …), None when the
    connection failed or the edge found the server's answers wrong."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode | int | None = code
        with contextlib.suppress(ValueError, TypeError):
            self.code = ErrorCode(code)


class Unreachable(RemoteError):
    """No connection to the server could be opened (refused, timed out, TLS not trusted)."""


@dataclass(frozen=True)
class ClientOptions:
    """How the edge reaches the server. `tls_ca` turns TLS on: a PEM file pins the CA the
    server's certificate must chain to, True verifies against the system's CAs. `token`
    defaults to $WANSPEC_TOKEN. `timeout_s` bounds the whole request. With `resume`, a session
    survives dropped connections (`wanspec.net.resume`: reconnect by `retry`, replay what was
    lost) and `generate_resumable` starts at most `max_restarts` fresh sessions that continue
    from the committed tokens when the server no longer holds the session."""

    token: str | None = None
    tls_ca: str | Path | bool | None = None
    connect_timeout_s: float = 10.0
    timeout_s: float | None = 600.0
    resume: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_restarts: int = 3

    @property
    def bearer(self) -> str | None:
        return self.token if self.token is not None else os.environ.get("WANSPEC_TOKEN") or None

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_ca is None or self.tls_ca is False:
            return None
        cafile = None if self.tls_ca is True else str(Path(self.tls_ca).expanduser())
        return ssl.create_default_context(cafile=cafile)


async def open_stream(
    address: Address, options: ClientOptions, limits: wire.Limits = wire.DEFAULT_LIMITS
) -> MessageStream:
    """Connect (and shake hands for TLS) within the connect timeout; RemoteError if not."""
    host, port = address
    context = options.ssl_context()
    opening = asyncio.open_connection(
        host, port, ssl=context, server_hostname=host if context else None
    )
    try:
        async with asyncio.timeout(options.connect_timeout_s):
            reader, writer = await opening
    except TimeoutError:
        raise Unreachable(
            f"no connection to {host}:{port} within {options.connect_timeout_s:g} s"
        ) from None
    except ssl.SSLCertVerificationError as exc:
        raise Unreachable(f"TLS: the server at {host}:{port} is not trusted: {exc}") from exc
    except OSError as exc:
        raise Unreachable(f"cannot reach a wanspec server at {host}:{port}: {exc}") from exc
    return MessageStream(reader, writer, limits)


async def close_stream(stream: MessageStream) -> None:
    """Close our side; a peer that already went away is no error any more."""
    with contextlib.suppress(OSError, TimeoutError):
        stream.writer.close()
        async with asyncio.timeout(2.0):
            await stream.writer.wait_closed()


async def authenticate(stream: MessageStream, options: ClientOptions) -> int:
    """Send the bearer token, if any, ahead of the protocol; its frame's bits (0 without)."""
    token = options.bearer
    if token is None:
        return 0
    # written past `stream.sent`, which counts the protocol's own frames only
    return 8 * await write_message(stream.writer, wire.Auth(token), stream.limits)


# ============================================================================ the edge's models


@dataclass
class RemotePair:
    """The edge's half of a pair whose target runs on a server: the draft, the target's
    tokenizer, their alignment (over the target's real logits width), and optionally the target
    model fingerprint to insist on ("" = whatever the server runs) and the model whose embedding
    layer `split` runs on the edge."""

    draft: Any
    alignment: VocabAlignment
    target_tokenizer: Any
    target_model: str = ""
    embed_model: Any = None
    draft_name: str = ""
    target_name: str = ""
    target_suffix: tuple[int, ...] = ()  # committed ids a continuing session's prompts end with
    draft_suffix: tuple[int, ...] = ()  # the same, in the draft's vocabulary

    def draft_encode(self, text: str) -> list[int]:
        return [*prompt_encoder(self.draft.tokenizer)(text), *self.draft_suffix]

    def target_encode(self, text: str) -> list[int]:
        return [*prompt_encoder(self.target_tokenizer)(text), *self.target_suffix]

    def continued(self, ids: Sequence[int]) -> RemotePair:
        """This edge for a session whose prompt is followed by the target ids `ids` too (after
        its own suffix): exactly those ids on the target's side (the server appends the same
        ones, `wire.Resume.prefix`), so committed tokens or a chat template's ids are never
        re-tokenized. The draft gets their re-tokenization, which changes what it proposes,
        never what is accepted."""
        more = tuple(int(t) for t in ids)
        if self.alignment.is_identity:
            draft_more = more
        else:
            text = self.target_tokenizer.decode(list(more))
            draft_more = tuple(self.draft.tokenizer(text, add_special_tokens=False)["input_ids"])
        return dataclasses.replace(
            self,
            target_suffix=(*self.target_suffix, *more),
            draft_suffix=(*self.draft_suffix, *draft_more),
        )

    def decode(self, ids: list[int]) -> str:
        return self.target_tokenizer.decode(ids, skip_special_tokens=True)

    @classmethod
    def of_pair(cls, pair: Any) -> RemotePair:
        """A loaded `wanspec.Pair` used as an edge (its target is expected on the server)."""
        return cls(
            pair.draft,
            pair.alignment,
            pair.target.tokenizer,
            pair.target.fingerprint,
            embed_model=pair.target,
            draft_name=pair.draft_name,
            target_name=pair.target_name,
        )


async def server_facts(
    address: Address, target_tokenizer_fp: str, options: ClientOptions
) -> dict[str, Any]:
    """What the server says of its target in the handshake (model fingerprint, logits width,
    EOS ids, name), for an edge whose target tokenizer has this fingerprint."""
    stream = await open_stream(address, options)
    try:
        await authenticate(stream, options)
        hello = wire.Hello(PROTOCOL_VERSION, "edge", "ar", "", target_tokenizer_fp, "")
        await stream.send(hello)
        async with asyncio.timeout(options.connect_timeout_s):
            reply = await stream.receive()
        if isinstance(reply, wire.Error):
            raise RemoteError(f"the server refused: {reply.message}", reply.code)
        if not isinstance(reply, wire.HelloAck) or "vocab_width" not in reply.info:
            raise RemoteError(f"the server answered the handshake with {reply!r}")
        await stream.send(wire.Close("probe"))
    except (OSError, wire.WireError, ConnectionClosed) as exc:
        where = f"{address[0]}:{address[1]}"
        raise RemoteError(f"handshake with {where} failed: {exc}{NO_ANSWER_HINT}") from exc
    finally:
        await close_stream(stream)
    return {"target_model": reply.target_model, **reply.info}


def load_edge(
    draft: Any,
    target_tokenizer: Any,
    server: str,
    options: ClientOptions | None = None,
    draft_name: str = "",
    *,
    dtype: Any = None,
    invariant: bool | None = None,
    device: str | None = None,
    threads: int | None = None,
) -> RemotePair:
    """An edge for `server`: `draft` a loaded LanguageModel or a registry name / folder (then
    loaded here with `dtype` (default float32), `invariant`, `device` (default cpu) and
    `threads`, as `load_model` takes them), `target_tokenizer` a tokenizer or a registry name /
    folder (`qwen2.5`, `qwen2.5-coder-0.5b`, a Hugging Face folder). Asks the server for its
    target's logits width and pins its model fingerprint. A loaded draft stays where it is: a
    `device` other than its own is a ValueError."""
    options = options or ClientOptions()
    draft, draft_name = _edge_draft(draft, draft_name, dtype, invariant, device, threads)
    if isinstance(target_tokenizer, str | Path):
        from wanspec.models.registry import load_tokenizer

        target_tokenizer = load_tokenizer(target_tokenizer)
    table = TokenTable(target_tokenizer)
    facts = asyncio.run(server_facts(parse_address(server), table_fingerprint(table), options))
    alignment = VocabAlignment.build(
        draft.tokenizer,
        target_tokenizer,
        draft_width=draft.vocab_size,
        target_width=int(facts["vocab_width"]),
    )
    return RemotePair(
        draft,
        alignment,
        target_tokenizer,
        facts["target_model"],
        draft_name=draft_name or getattr(draft, "name", ""),
        target_name=str(facts.get("target", "")),
    )


def _edge_draft(
    draft: Any,
    name: str,
    dtype: Any,
    invariant: bool | None,
    device: str | None,
    threads: int | None,
) -> tuple[Any, str]:
    """`load_edge`'s draft as a loaded model and its name (see there)."""
    import torch

    from wanspec.models.lm import load_model, resolve_device

    if hasattr(draft, "extend"):
        where = getattr(draft, "device", torch.device("cpu"))
        if device is not None and resolve_device(device) != where:
            raise ValueError(
                f"device={device!r} applies when loading: the draft is already loaded on "
                f"{where}; pass its name or folder, or load it with that device"
            )
        if dtype is not None or invariant is not None:
            raise ValueError("dtype= and invariant= apply when loading: pass a name or folder")
        return draft, name
    from wanspec.models.registry import resolve_model

    loaded = load_model(
        resolve_model(str(draft)),
        dtype=torch.float32 if dtype is None else dtype,
        threads=threads,
        invariant=invariant,
        device=device,
    )
    return loaded, name or str(draft)


# ============================================================================ one request


@dataclass
class RemoteRun:
    """What one remote generation measured: the edge's record (wall-clock seconds since the
    session started; connecting took `connect_s` before that) and the transport's figures."""

    record: SimResult
    edge: EdgeMachine
    sent: TrafficCounter  # the protocol's frames, edge → server
    received: TrafficCounter
    connect_s: float
    auth_bits: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> list[int]:
        return self.record.tokens

    def transport_stats(self) -> dict[str, Any]:
        """What the transport adds to the protocol's payload bits, and how long connecting took.
        TCP/IP header bytes are an ESTIMATE from segment counts (see `TrafficCounter`)."""
        return {
            "clock": "wall",
            "connect_s": self.connect_s,
            "uplink_framing_bits": self.sent.framing_bits,
            "downlink_framing_bits": self.received.framing_bits,
            "uplink_tcpip_header_bytes_est": self.sent.est_tcpip_header_bytes,
            "downlink_tcpip_header_bytes_est": self.received.est_tcpip_header_bytes,
            "auth_bits": self.auth_bits,
            "reconnects": int(self.extra.get("reconnects", 0)),  # resumable sessions only
            "edge_compute_s": dict(self.record.compute_by_tag["edge"]),
            "edge_computes": dict(self.record.computes_by_tag["edge"]),
        }


def edge_machine(
    edge: RemotePair, prompt: str, method: str, settings: GenerationSettings
) -> tuple[EdgeMachine, Any]:
    """The method's edge machine for `edge`, and the model its jobs run on."""
    model = edge_model_for(method, draft=edge.draft, target=edge.embed_model)
    if model is None:
        raise ValueError("split runs the target's embedding layer on the edge: pass a Pair")
    machine = make_edge(
        method,
        alignment=edge.alignment,
        prompt=prompt,
        settings=settings,
        draft_encode=edge.draft_encode,
        target_decode=edge.decode,
        target_encode=edge.target_encode,
        target_model=edge.target_model,
        target_tokenizer=edge.target_tokenizer,  # stop strings match as transformers' do
    )
    return machine, model


class Disconnected(RemoteError):
    """A resumable session was lost for good (the server no longer holds it, or it could not be
    reached again in time). What the part achieved: its edge machine (whose emitted tokens the
    caller has seen), its traffic and its reconnections."""

    def __init__(self, message: str, part: SessionPart) -> None:
        super().__init__(message)
        self.part = part


@dataclass
class SessionPart:
    """One session of a request, complete or not: its machine, traffic and reconnections."""

    edge: EdgeMachine
    sent: TrafficCounter
    received: TrafficCounter
    reconnects: int = 0


async def _open_resumable(
    stream: MessageStream,
    edge: RemotePair,
    address: Address,
    options: ClientOptions,
    committed: Callable[[], int],
) -> EdgeStream:
    """Open a resumable session on `stream` (authenticated): a fresh random session id, and the
    committed prefix when this session continues an earlier one."""

    async def connect() -> MessageStream:
        again = await open_stream(address, options, stream.limits)
        try:
            await authenticate(again, options)
        except OSError:
            again.writer.transport.abort()
            raise
        return channel.wrap(again.reader, again.writer)

    channel = EdgeStream(
        stream,
        session=secrets.token_hex(16),
        connect=connect,
        committed=committed,
        prefix=edge.target_suffix,
        retry=options.retry,
        reply_timeout_s=options.connect_timeout_s,
    )
    await write_message(stream.writer, channel.opening(), stream.limits)
    return channel


async def generate_async(
    edge: RemotePair,
    prompt: str,
    method: str,
    settings: GenerationSettings,
    server: str | Address,
    options: ClientOptions | None = None,
    on_emit: Callable[[tuple[int, ...]], None] | None = None,
) -> RemoteRun:
    """One request against `server` in one session; RemoteError if it does not complete
    (`Disconnected` when a resumable session was lost). `on_emit(tokens)` gets each batch of
    committed tokens as the edge machine emits it."""
    options = options or ClientOptions()
    if edge.target_suffix and not options.resume:
        raise ValueError("an edge that continues after given ids needs a resumable session")
    address = parse_address(server) if isinstance(server, str) else server
    machine, model = edge_machine(edge, prompt, method, settings)
    loop = asyncio.get_running_loop()
    began = loop.time()
    limits = wire.DEFAULT_LIMITS.with_vocab(edge.alignment.target_width)
    stream = await open_stream(address, options, limits)
    transport: MessageStream | EdgeStream = stream
    executor = ThreadPoolExecutor(1, thread_name_prefix="wanspec-edge")
    committed = 0

    def emitted(tokens: tuple[int, ...]) -> None:
        nonlocal committed
        committed += len(tokens)
        if on_emit is not None:
            on_emit(tokens)

    try:
        auth_bits = await authenticate(stream, options)
        if options.resume:
            transport = await _open_resumable(stream, edge, address, options, lambda: committed)
        connect_s = loop.time() - began
        session = model.new_session()
        result, peer_error = await drive(
            machine,
            transport,  # type: ignore[arg-type]  # an EdgeStream reads and writes like one
            functools.partial(run_job, session),
            executor,
            limits=DriverLimits(deadline_s=options.timeout_s, write_timeout_s=options.timeout_s),
            on_emit=emitted,
        )
    except asyncio.CancelledError:
        await _abandon(transport, machine)
        raise
    except (SessionAborted, OSError) as exc:
        where = f"{address[0]}:{address[1]}"
        if isinstance(transport, EdgeStream) and transport.lost is not None:
            part = SessionPart(machine, stream.sent, stream.received, transport.reconnects)
            raise Disconnected(f"the session with {where} is lost: {transport.lost}", part) from exc
        hint = "" if stream.received.messages else NO_ANSWER_HINT
        raise RemoteError(f"the session with {where} broke off: {exc}{hint}") from exc
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        if machine.done:  # it said Close: let the server read it before the connection goes
            await _hang_up(transport.current if isinstance(transport, EdgeStream) else stream)
        if isinstance(transport, EdgeStream):
            transport.close()
            await close_stream(transport.current)
        await close_stream(stream)
    _raise_on_error(result, peer_error)
    run = RemoteRun(result, machine, stream.sent, stream.received, connect_s, auth_bits)
    if isinstance(transport, EdgeStream):
        run.extra["reconnects"] = transport.reconnects
    return run


async def _abandon(transport: MessageStream | EdgeStream, machine: EdgeMachine) -> None:
    """The caller gave the request up (an HTTP client went away): say `Close`, so the server
    ends the session now instead of holding a resumable one for a reconnection. Then read
    what the server still sends until it hangs up: closing with unread bytes would reset the
    connection, and a reset can destroy the Close before the server has read it."""
    if machine.done or not transport.sent.messages:
        return  # over already (it said Close itself), or the server has no Hello yet
    with contextlib.suppress(OSError, TimeoutError, wire.WireError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await transport.send(wire.Close("cancelled"))
    await _hang_up(transport.current if isinstance(transport, EdgeStream) else transport)


async def _hang_up(stream: MessageStream) -> None:
    """After our Close: end our side and read what the server still sends until it hangs up
    (at most `CLOSE_WAIT_S`). Closing with unread bytes would reset the connection, and a reset
    can destroy the Close in a relay's or the server's buffers before it is read: the server
    would then record the edge as gone instead of done."""
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            if stream.writer.can_write_eof():
                stream.writer.write_eof()
            while await stream.reader.read(64 << 10):
                pass


async def _with_retries(attempt: Callable[[], Any], retry: RetryPolicy) -> RemoteRun:
    """`attempt()`, tried again after each delay of `retry` while the server is unreachable
    (a link that just dropped may still be down when a fresh session starts)."""
    for delay in retry.delays():
        try:
            return await attempt()
        except Unreachable:
            await asyncio.sleep(delay)
    return await attempt()


def continuation_seed(seed: int, position: int) -> int:
    """The seed of a fresh session that continues a request at output `position`: a stream of
    its own, independent of the one that drew the committed prefix (reusing `seed` would
    replay the very draws that produced the prefix)."""
    state = np.random.SeedSequence([seed, position]).generate_state(1, np.uint64)
    return int(state[0]) >> 1  # within an int64, as settings require


def continuation_settings(settings: GenerationSettings, committed: int) -> GenerationSettings:
    """The settings of a fresh session that continues after `committed` output tokens."""
    if committed == 0:
        return settings
    return dataclasses.replace(
        settings,
        max_new_tokens=settings.max_new_tokens - committed,
        seed=continuation_seed(settings.seed, committed),
    )


@dataclass
class ResumableRun:
    """A request that survived dropped links: its committed tokens, and each session it took
    (`parts`, the last one complete; earlier ones were lost and continued by a fresh session)."""

    tokens: list[int]
    parts: list[SessionPart]
    final: RemoteRun

    @property
    def reconnects(self) -> int:
        """Connections re-established within a session (plus the fresh sessions started)."""
        return sum(part.reconnects for part in self.parts) + self.restarts

    @property
    def restarts(self) -> int:
        """Fresh sessions started because the server no longer held the previous one."""
        return len(self.parts) - 1


async def generate_resumable(
    edge: RemotePair,
    prompt: str,
    method: str,
    settings: GenerationSettings,
    server: str | Address,
    options: ClientOptions | None = None,
    on_emit: Callable[[tuple[int, ...]], None] | None = None,
) -> ResumableRun:
    """One request that survives dropped connections: each session resumes across reconnects,
    and when the server has forgotten one (its grace period passed), a fresh session continues
    from the committed tokens (`RemotePair.continued`, `continuation_settings`), at most
    `options.max_restarts` times. The committed prefix is an exact sample, and the fresh
    session draws the rest from the target's law given that prefix with randomness of its own,
    so the output's law is unchanged; greedy output is the same token for token."""
    options = dataclasses.replace(options or ClientOptions(), resume=True)
    tokens: list[int] = []
    parts: list[SessionPart] = []

    def keep(batch: tuple[int, ...]) -> None:
        tokens.extend(batch)
        if on_emit is not None:
            on_emit(batch)

    for _ in range(options.max_restarts + 1):
        part_edge = edge.continued(tokens) if tokens else edge
        part_settings = continuation_settings(settings, len(tokens))
        attempt = functools.partial(
            generate_async, part_edge, prompt, method, part_settings, server, options, keep
        )
        try:
            run = await (_with_retries(attempt, options.retry) if parts else attempt())
        except Disconnected as lost:
            parts.append(lost.part)
            if len(tokens) >= settings.max_new_tokens:
                raise RemoteError(f"the output was complete, its session lost: {lost}") from lost
            continue
        reconnects = int(run.extra.get("reconnects", 0))
        parts.append(SessionPart(run.edge, run.sent, run.received, reconnects))
        return ResumableRun(tokens, parts, run)
    raise RemoteError(f"gave up after {options.max_restarts} fresh sessions")


def _raise_on_error(result: SimResult, peer_error: wire.Error | None) -> None:
    if peer_error is not None:
        raise RemoteError(f"the server says: {peer_error.message}", peer_error.code)
    if result.finish_reason.startswith("error"):
        raise RemoteError(f"the edge ended the session: {result.finish_reason}")


def generate_remote(
    edge: RemotePair,
    prompt: str,
    method: str,
    settings: GenerationSettings,
    server: str,
    options: ClientOptions | None = None,
) -> RemoteRun:
    """`generate_async` for callers without an event loop of their own."""
    return asyncio.run(generate_async(edge, prompt, method, settings, server, options))
