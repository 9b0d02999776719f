"""The edge over a real network: connect to a `wanspec serve` server and generate.

The edge holds the draft model and the TARGET'S TOKENIZER (to align vocabularies and to spell
the output); the target model stays on the server. `load_edge` builds that half of a pair from a
draft and a target tokenizer, learning the target's logits width from the server in a short
handshake (Hello for `ar`, HelloAck, Close: no model work there). A loaded `Pair` works too (its
target is then only used for `split`, whose edge runs the target's embedding layer).

`generate_async` / `generate_remote` run one request: connect (TCP, optionally TLS verified
against the system's or a pinned CA), send the bearer token if one is given, then drive the
method's edge machine with `wanspec.net.driver.drive`, the draft's jobs on a thread of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanspec import wire
from wanspec.models.jobs import run_job
from wanspec.net.driver import DriveResult, DriverLimits, SessionAborted, drive
from wanspec.net.framing import ConnectionClosed, MessageStream, TrafficCounter, write_message
from wanspec.net.units import parse_address
from wanspec.protocols.base import PROTOCOL_VERSION, ErrorCode
from wanspec.protocols.endpoints import EdgeMachine
from wanspec.protocols.registry import get_method, make_edge, table_fingerprint
from wanspec.protocols.settings import GenerationSettings
from wanspec.vocab import TokenTable, VocabAlignment

Address = tuple[str, int]
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


@dataclass(frozen=True)
class ClientOptions:
    """How the edge reaches the server. `tls_ca` turns TLS on: a PEM file pins the CA the
    server's certificate must chain to, True verifies against the system's CAs. `token`
    defaults to $WANSPEC_TOKEN. `timeout_s` bounds the whole request."""

    token: str | None = None
    tls_ca: str | Path | bool | None = None
    connect_timeout_s: float = 10.0
    timeout_s: float | None = 600.0

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
        raise RemoteError(
            f"no connection to {host}:{port} within {options.connect_timeout_s:g} s"
        ) from None
    except ssl.SSLCertVerificationError as exc:
        raise RemoteError(f"TLS: the server at {host}:{port} is not trusted: {exc}") from exc
    except OSError as exc:
        raise RemoteError(f"cannot reach a wanspec server at {host}:{port}: {exc}") from exc
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


def prompt_encoder(tokenizer: Any) -> Any:
    """text -> ids as every wanspec side encodes a prompt (the tokenizer's special tokens on)."""
    return lambda text: list(tokenizer(text, add_special_tokens=True)["input_ids"])


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

    def draft_encode(self, text: str) -> list[int]:
        return prompt_encoder(self.draft.tokenizer)(text)

    def target_encode(self, text: str) -> list[int]:
        return prompt_encoder(self.target_tokenizer)(text)

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
) -> RemotePair:
    """An edge for `server`: `draft` a loaded LanguageModel, `target_tokenizer` a tokenizer or a
    registry name / folder (`qwen2.5`, `qwen2.5-coder-0.5b`, a Hugging Face folder). Asks the
    server for its target's logits width and pins its model fingerprint."""
    options = options or ClientOptions()
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


# ============================================================================ one request


@dataclass
class RemoteRun:
    """What one remote generation measured (wall-clock seconds since the session started;
    connecting took `connect_s` before that)."""

    drive: DriveResult
    edge: EdgeMachine
    sent: TrafficCounter  # the protocol's frames, edge → server
    received: TrafficCounter
    connect_s: float
    auth_bits: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> list[int]:
        return self.drive.tokens

    def by_type(self) -> dict[str, tuple[int, int]]:
        """(messages, payload bits) per message type, both directions together."""
        table = dict(self.drive.sent_by_type)
        for kind, (count, bits) in self.drive.received_by_type.items():
            had = table.get(kind, (0, 0))
            table[kind] = (had[0] + count, had[1] + bits)
        return table

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
            "edge_compute_s": dict(self.drive.compute_s),
            "edge_computes": dict(self.drive.computes),
        }


def edge_machine(
    edge: RemotePair, prompt: str, method: str, settings: GenerationSettings
) -> tuple[EdgeMachine, Any]:
    """The method's edge machine for `edge`, and the model its jobs run on."""
    info = get_method(method)
    model = edge.draft
    if info.family == "split":
        if edge.embed_model is None:
            raise ValueError("split runs the target's embedding layer on the edge: pass a Pair")
        model = edge.embed_model
    machine = make_edge(
        info.name,
        alignment=edge.alignment,
        prompt=prompt,
        settings=settings,
        draft_encode=edge.draft_encode,
        target_decode=edge.decode,
        target_encode=edge.target_encode,
        target_model=edge.target_model,
    )
    return machine, model


async def generate_async(
    edge: RemotePair,
    prompt: str,
    method: str,
    settings: GenerationSettings,
    server: str | Address,
    options: ClientOptions | None = None,
    on_emit: Any = None,
) -> RemoteRun:
    """One request against `server`; RemoteError if it does not complete."""
    options = options or ClientOptions()
    address = parse_address(server) if isinstance(server, str) else server
    machine, model = edge_machine(edge, prompt, method, settings)
    loop = asyncio.get_running_loop()
    began = loop.time()
    limits = wire.DEFAULT_LIMITS.with_vocab(edge.alignment.target_width)
    stream = await open_stream(address, options, limits)
    executor = ThreadPoolExecutor(1, thread_name_prefix="wanspec-edge")
    try:
        auth_bits = await authenticate(stream, options)
        connect_s = loop.time() - began
        session = model.new_session()
        result = await drive(
            machine,
            stream,
            functools.partial(run_job, session),
            executor,
            limits=DriverLimits(deadline_s=options.timeout_s, write_timeout_s=options.timeout_s),
            on_emit=on_emit,
        )
    except (SessionAborted, OSError) as exc:
        hint = "" if stream.received.messages else NO_ANSWER_HINT
        where = f"{address[0]}:{address[1]}"
        raise RemoteError(f"the session with {where} broke off: {exc}{hint}") from exc
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        await close_stream(stream)
    _raise_on_error(result)
    return RemoteRun(result, machine, stream.sent, stream.received, connect_s, auth_bits)


def _raise_on_error(result: DriveResult) -> None:
    if result.peer_error is not None:
        raise RemoteError(f"the server says: {result.peer_error.message}", result.peer_error.code)
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
